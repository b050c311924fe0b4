"""Accelerator isolation on the device-plugin path, as the AI conformance program words it:
through the real kubelet and Debian's containerd, a container sees the device nodes of exactly
the GPUs the kubelet handed it (`nvidia.com/gpu`, a share slot, a time-slicing replica), with
the control nodes, and reaches no other GPU even through a node it makes itself; a container
with no GPU request, also beside one with a GPU in the same pod, sees and reaches none
(`kubegpu_e2e/devices.py` says how each container probes).

The session's agent passes no device specs (the shipped `passDeviceSpecs: false`: NVIDIA's
container runtime injects the devices on a GPU host), so containers here get no device node at
all. This module restarts it with device specs on and `devRoot` a folder of real character
devices (mknod) so that containerd puts them in the containers for real, then once more with
two cards time-sliced, and puts the shipped config back at the end. The DRA path's isolation
is `test_11_dra.py`'s."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubegpu_e2e.cluster import Cluster
from kubegpu_e2e.devices import assert_isolated, device_view, host_nodes, minors_by_uuid
from kubegpu_e2e.devices import probe_command as device_probe
from kubegpu_e2e.dra import make_device_nodes
from kubegpu_e2e.kubegpu import DEPLOY, FAKE_GPUS, KubegpuRoles
from kubegpu_e2e.workloads import (
    SCHEDULER,
    SHARED,
    WHOLE,
    container,
    container_env,
    create,
    pod,
    pod_resources,
    share,
    wait_running,
)

from kubegpu.kubelet.resources import card_of

pytestmark = pytest.mark.e2e

GPUS = 8
# The time-slicing config: cards 6 and 7 leave nvidia.com/gpu and are advertised four times
# each under their own name, as NVIDIA's plugin does with `rename` and `devices`.
SLICED = "nvidia.com/gpu.shared"
SLICED_CARDS = (6, 7)
REPLICAS = 4


class IsolationAgent:
    """The session's node agent, restarted with the module's configs; the shipped one back
    at the end (:meth:`restore`)."""

    def __init__(self, roles: KubegpuRoles) -> None:
        self.roles = roles
        self.dev_root = roles.cluster.run_dir / "fake-host"
        make_device_nodes(self.dev_root, GPUS)
        self.nodes = host_nodes(self.dev_root)
        self.minors = minors_by_uuid(FAKE_GPUS)
        self.running = "shipped"

    def _config(self, name: str) -> Path:
        shipped = yaml.safe_load((DEPLOY / "base" / "node-agent-config.yaml").read_text())
        config: dict[str, Any] = copy.deepcopy(shipped)
        config["flags"]["plugin"] |= {"passDeviceSpecs": True, "devRoot": str(self.dev_root)}
        if name == "time-sliced":
            # Card-level sharing needs nvidia.com/gpu whole (the config refuses both).
            config["sharing"]["gpuShare"]["enabled"] = False
            config["sharing"]["timeSlicing"] = {
                "resources": [
                    {
                        "name": WHOLE,
                        "replicas": REPLICAS,
                        "rename": SLICED,
                        "devices": list(SLICED_CARDS),
                    }
                ]
            }
        path = self.roles.cluster.run_dir / f"node-agent-{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def use(self, name: str) -> None:
        """Run the agent with config ``name`` (``device-specs``, ``time-sliced``), and wait
        until the Node advertises what it does."""
        if self.running == name:
            return
        self.roles.stop_agent()
        self.running = ""
        self.roles.start_agent(config=self._config(name))
        self.running = name
        if name == "time-sliced":
            whole = str(GPUS - len(SLICED_CARDS))
            self.roles.wait_advertised(
                allocatable={WHOLE: whole, SLICED: str(len(SLICED_CARDS) * REPLICAS)}
            )
        else:
            self.roles.wait_advertised()

    def restore(self) -> None:
        if self.running != "shipped":
            self.roles.stop_agent()
            self.roles.start_agent()
            self.roles.wait_advertised()
            self.running = "shipped"

    def probe(self, name: str, limits: dict[str, str] | None = None) -> dict[str, Any]:
        """A workload container that probes the host's NVIDIA nodes."""
        c = container(name, limits)
        c["command"] = ["/bin/sh", "-c", device_probe(self.nodes)]
        return c

    def held(self, cluster: Cluster, namespace: str) -> dict[tuple[str, str], set[int]]:
        """(pod, container) -> the minor numbers of the cards the real kubelet says it handed
        the container (PodResources: whole GPUs, share slots and replicas alike, by the card
        inside each device id)."""
        held: dict[tuple[str, str], set[int]] = {}
        for entry in pod_resources(cluster.pod_resources_socket):
            if entry.namespace == namespace:
                cards = held.setdefault((entry.pod, entry.container), set())
                cards.update(self.minors[card_of(d)] for d in entry.device_ids)
        return held

    def assert_each_container_isolated(
        self, cluster: Cluster, namespace: str, pods: dict[str, list[str]]
    ) -> dict[tuple[str, str], set[int]]:
        """Every container of ``pods`` (pod -> containers) sees and reaches exactly the cards
        PodResources lists for it; returns those."""
        held = self.held(cluster, namespace)
        for name, containers in pods.items():
            for c in containers:
                where = f"{namespace}/{name}/{c}"
                env = container_env(cluster, namespace, name, c)
                view = device_view(env, self.nodes, where)
                minors = held.get((name, c), set())
                print(f"{where}: holds cards {sorted(minors)}; {view.summary()}")
                assert_isolated(view, minors, where)
        return held


def privileged(manifest: dict[str, Any]) -> dict[str, Any]:
    for c in manifest["spec"]["containers"]:
        c["securityContext"] = {"privileged": True}
    return manifest


@pytest.fixture(scope="module")
def isolation(cluster: Cluster, roles: KubegpuRoles) -> Iterator[IsolationAgent]:
    agent = IsolationAgent(roles)
    try:
        yield agent
    finally:
        agent.restore()


def test_whole_gpu_containers_see_only_their_cards_and_the_others_none(
    cluster: Cluster, isolation: IsolationAgent, namespace: str
) -> None:
    isolation.use("device-specs")
    probe = isolation.probe
    create(
        cluster,
        pod("one", namespace, [probe("gpu", {WHOLE: "1"})]),
        # Three containers: one GPU, two GPUs, none.
        pod(
            "mixed",
            namespace,
            [probe("one", {WHOLE: "1"}), probe("two", {WHOLE: "2"}), probe("none")],
        ),
        pod("no-gpu", namespace, [probe("main")]),
        privileged(pod("privileged", namespace, [probe("main")])),
    )
    wait_running(cluster, namespace, "one", "mixed", "no-gpu", "privileged")
    held = isolation.assert_each_container_isolated(
        cluster, namespace, {"one": ["gpu"], "mixed": ["one", "two", "none"], "no-gpu": ["main"]}
    )
    # The control: the probe tells a container the device cgroup does not confine. A
    # privileged one (no GPU request) reaches every GPU of the host through nodes it makes.
    env = container_env(cluster, namespace, "privileged", "main")
    view = device_view(env, isolation.nodes, "privileged")
    print(f"privileged/main: {view.summary()}")
    assert view.reachable == set(isolation.nodes), view.reach
    # The kubelet's own record is what each container was checked against: it must hold what
    # was asked, no card twice, and nothing for the containers that asked for none.
    counts = {("one", "gpu"): 1, ("mixed", "one"): 1, ("mixed", "two"): 2}
    assert {k: len(v) for k, v in held.items()} == counts, held
    cards = [m for v in held.values() for m in v]
    assert len(cards) == len(set(cards)), held


def test_a_share_slot_container_sees_only_its_card_and_its_neighbour_none(
    cluster: Cluster, isolation: IsolationAgent, namespace: str
) -> None:
    isolation.use("device-specs")
    probe = isolation.probe
    create(
        cluster,
        pod(
            "shared",
            namespace,
            [probe("share", share(20480, 250)), probe("none")],
            scheduler=SCHEDULER,
        ),
    )
    wait_running(cluster, namespace, "shared")
    held = isolation.assert_each_container_isolated(
        cluster, namespace, {"shared": ["share", "none"]}
    )
    assert list(held) == [("shared", "share")] and len(held["shared", "share"]) == 1, held
    # The card the share was served on is the card the container is told of.
    env = container_env(cluster, namespace, "shared", "share")
    (minor,) = held["shared", "share"]
    assert isolation.minors[env["KUBEGPU_GPU_UUID"]] == minor, env
    entries = [e for e in pod_resources(cluster.pod_resources_socket) if e.namespace == namespace]
    assert [e.resource for e in entries] == [SHARED], entries


def test_time_slicing_replica_containers_see_only_their_card(
    cluster: Cluster, isolation: IsolationAgent, namespace: str
) -> None:
    isolation.use("time-sliced")
    probe = isolation.probe
    create(
        cluster,
        pod("replica-a", namespace, [probe("replica", {SLICED: "1"}), probe("none")]),
        pod("replica-b", namespace, [probe("replica", {SLICED: "1"})]),
        pod("whole", namespace, [probe("gpu", {WHOLE: "1"})]),
    )
    wait_running(cluster, namespace, "replica-a", "replica-b", "whole")
    held = isolation.assert_each_container_isolated(
        cluster,
        namespace,
        {"replica-a": ["replica", "none"], "replica-b": ["replica"], "whole": ["gpu"]},
    )
    assert set(held) == {("replica-a", "replica"), ("replica-b", "replica"), ("whole", "gpu")}
    for replica in (("replica-a", "replica"), ("replica-b", "replica")):
        (minor,) = held[replica]
        assert minor in SLICED_CARDS, held
    (whole,) = held["whole", "gpu"]
    assert whole not in SLICED_CARDS, held
