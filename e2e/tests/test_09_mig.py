"""The device plugin's MIG strategies (flags.migStrategy, docs/mig.md) through the real kubelet,
kube-scheduler and Debian's containerd, on fake H100s (the 4xH100-80GB-MIG preset: cards 0-2 in
MIG mode with 3g.40gb+2g.20gb+1g.10gb, 7x1g.10gb and 2x3g.40gb, card 3 not).

``mixed``: the Node advertises one resource per profile with the preset's counts, pods asking
for `nvidia.com/mig-1g.10gb`, `-2g.20gb` and `-3g.40gb` run and each container sees exactly its
MIG device (one MIG UUID in NVIDIA_VISIBLE_DEVICES, the one PodResources names, of that profile;
in /dev its card's node and exactly that instance's two nvidia-caps nodes), the card outside MIG
mode still serves `nvidia.com/gpu` and a kubegpu share, an Xid on one GPU instance takes that
MIG device out of allocatable and one on a card all of its, and the labeller writes GFD's mixed
labels. ``single``: a node of two cards of 7x1g.10gb advertises 14 `nvidia.com/gpu`, a pod runs
with MIG UUIDs, GFD's single labels; on the preset (not uniform) the agent exits 1 with NVIDIA's
message and the labels say `-MIG-INVALID`.

The session's agent and labeller are stopped for this module (the agent runs with device specs
and `devRoot` a folder of real character devices, so containerd puts the nodes in for real) and
put back afterwards."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubegpu_e2e.cluster import NODE_NAME, Cluster
from kubegpu_e2e.kubegpu import DEPLOY, KubegpuRoles
from kubegpu_e2e.mig_plugin import expected_view, make_mig_device_nodes, mig_view, probe_command
from kubegpu_e2e.workloads import (
    SCHEDULER,
    WHOLE,
    container,
    container_env,
    create,
    pending_reason,
    pod,
    pod_resources,
    share,
    wait_running,
)

from kubegpu.core.gpu import MigDevice, NodeInventory
from kubegpu.inventory.fake import send_fake_gpu_command
from kubegpu.inventory.spec import parse_fake_spec, resolve_fake_spec
from kubegpu.labels.catalogue import owns_label
from kubegpu.testing.gfd_labels import gfd_label_gaps

pytestmark = pytest.mark.e2e

PRESET = "4xH100-80GB-MIG"
MIXED_NODE = resolve_fake_spec(PRESET).inventory
ONE_G, TWO_G, THREE_G = (f"nvidia.com/mig-{p}" for p in ("1g.10gb", "2g.20gb", "3g.40gb"))
SHARED = "kubegpu.io/gpu-shared"
MIXED_FIGURES = {WHOLE: "1", ONE_G: "8", TWO_G: "1", THREE_G: "3"}
SINGLE_SPEC = 'driver_version: "550.90.07"\ncuda_driver_version: "12.4"\ngpus:' + "".join(
    f"""
  - index: {i}
    uuid: GPU-7a3e5c1b-0d2f-4e6a-8b9c-1d2e3f4a5b6{i}
    product_name: NVIDIA H100 80GB HBM3
    memory_total_mib: 81559
    compute_capability: "9.0"
    pci_bus_id: "00000000:{0x18 + i:02X}:00.0"
    minor_number: {i}
    mig_enabled: true
    mig_instances: [{", ".join(f"{{profile: 1g.10gb, start: {s}}}" for s in range(7))}]"""
    for i in range(2)
)
SINGLE_NODE = parse_fake_spec(SINGLE_SPEC, name="single", source="single.yaml").inventory
H100 = "NVIDIA-H100-80GB-HBM3"


class MigAgent:
    """The session's node agent and labeller replaced by ones on fake MIG nodes; the shipped
    ones back at the end (:meth:`restore`)."""

    def __init__(self, roles: KubegpuRoles) -> None:
        self.roles = roles
        self.cluster = roles.cluster
        run = self.cluster.run_dir
        self.dev_root = run / "fake-host-mig"
        make_mig_device_nodes(self.dev_root, MIXED_NODE, SINGLE_NODE)
        self.single_spec = run / "fake-gpus-mig-single.yaml"
        self.single_spec.write_text(SINGLE_SPEC)
        # Controls of their own: the session's MIG state file (beside its socket) is another
        # node's.
        self.control = {
            "mixed": run / "fake-mig-mixed.sock",
            "single": run / "fake-mig-single.sock",
        }
        self.running = "shipped"

    def config(self, strategy: str) -> Path:
        shipped = yaml.safe_load((DEPLOY / "base" / "node-agent-config.yaml").read_text())
        config: dict[str, Any] = copy.deepcopy(shipped)
        config["flags"]["migStrategy"] = strategy
        config["flags"]["plugin"] |= {"passDeviceSpecs": True, "devRoot": str(self.dev_root)}
        path = self.cluster.run_dir / f"node-agent-mig-{strategy}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def stop(self) -> None:
        for name in ("kubegpu-node-agent", "kubegpu-labels"):
            if name in self.roles.processes:
                self.roles.stop_role(name)
        self.running = ""

    def use(self, phase: str) -> None:
        """Run the agent and labeller for ``phase`` (``mixed``, ``single``) and wait until the
        Node advertises what the agent does."""
        if self.running == phase:
            return
        self.stop()
        fake_gpus = PRESET if phase == "mixed" else str(self.single_spec)
        config = self.config(phase)
        self.roles.start_agent(config, fake_gpus=fake_gpus, fake_control=self.control[phase])
        self.roles.start_labeller(config, fake_gpus=fake_gpus)
        self.running = phase
        if phase == "mixed":
            self.roles.wait_advertised(
                capacity=MIXED_FIGURES, allocatable={**MIXED_FIGURES, SHARED: "32"}
            )
        else:
            self.roles.wait_advertised(capacity={WHOLE: "14"}, allocatable={WHOLE: "14"})

    def restore(self) -> None:
        if self.running != "shipped":
            self.stop()
            self.roles.start_agent()
            self.roles.wait_advertised()
            self.roles.start_labeller()
            self.running = "shipped"


@pytest.fixture(scope="module")
def mig(cluster: Cluster, roles: KubegpuRoles) -> Iterator[MigAgent]:
    agent = MigAgent(roles)
    try:
        yield agent
    finally:
        agent.restore()


def node_status(cluster: Cluster, part: str) -> dict[str, str]:
    return dict(cluster.get("node", NODE_NAME)["status"][part])


def node_labels(cluster: Cluster) -> dict[str, str]:
    return dict(cluster.get("node", NODE_NAME)["metadata"].get("labels", {}))


def probe(name: str, limits: dict[str, str]) -> dict[str, Any]:
    c = container(name, limits)
    c["command"] = ["/bin/sh", "-c", probe_command()]
    return c


def held(cluster: Cluster, namespace: str, name: str, resource: str) -> list[str]:
    """The device ids the real kubelet says it handed the pod's container ``main``."""
    return [
        d
        for entry in pod_resources(cluster.pod_resources_socket)
        if (entry.namespace, entry.pod, entry.container, entry.resource)
        == (namespace, name, "main", resource)
        for d in entry.device_ids
    ]


def mig_by_uuid(inventory: NodeInventory) -> dict[str, MigDevice]:
    return {m.uuid: m for m in inventory.mig_devices}


def assert_sees_exactly(
    cluster: Cluster, namespace: str, name: str, resource: str, migs: dict[str, MigDevice]
) -> list[MigDevice]:
    """The container's NVIDIA_VISIBLE_DEVICES is exactly the MIG devices PodResources names,
    and its /dev holds their cards' nodes and exactly their caps; returns them."""
    ids = held(cluster, namespace, name, resource)
    env = container_env(cluster, namespace, name, "main")
    visible = env.get("NVIDIA_VISIBLE_DEVICES", "").split(",")
    assert ids and sorted(visible) == sorted(ids), (name, visible, ids)
    devices = [migs[i] for i in ids]
    view = mig_view(env)
    print(
        f"{namespace}/{name}: {resource} {ids}; /dev {sorted(view.nodes)}, caps {sorted(view.caps)}"
    )
    assert view == expected_view(devices), (name, view, expected_view(devices))
    return devices


def test_mixed_advertises_a_resource_per_profile_and_labels_each(
    cluster: Cluster, mig: MigAgent
) -> None:
    mig.use("mixed")
    capacity = node_status(cluster, "capacity")
    assert {k: capacity[k] for k in MIXED_FIGURES} == MIXED_FIGURES, capacity
    cluster.wait_for(
        "GFD's mixed labels on the Node",
        lambda: node_labels(cluster).get("nvidia.com/mig-3g.40gb.count") == "3",
        timeout=60,
    )
    labels = node_labels(cluster)
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "8"
    assert labels["nvidia.com/mig-2g.20gb.product"] == f"{H100}-MIG-2g.20gb"
    assert labels["nvidia.com/mig-3g.40gb.memory"] == "40448"
    ours = {k: v for k, v in labels.items() if owns_label(k)}
    assert gfd_label_gaps(ours, "mixed") == {}, ours


def test_mixed_pods_see_exactly_their_mig_device(
    cluster: Cluster, mig: MigAgent, namespace: str
) -> None:
    mig.use("mixed")
    create(
        cluster,
        pod("one-g", namespace, [probe("main", {ONE_G: "1"})]),
        pod("two-g", namespace, [probe("main", {TWO_G: "1"})]),
        pod("three-g", namespace, [probe("main", {THREE_G: "1"})]),
        pod("two-one-g", namespace, [probe("main", {ONE_G: "2"})]),
    )
    wait_running(cluster, namespace, "one-g", "two-g", "three-g", "two-one-g")
    migs = mig_by_uuid(MIXED_NODE)
    seen: set[str] = set()
    for name, resource, profile, count in (
        ("one-g", ONE_G, "1g.10gb", 1),
        ("two-g", TWO_G, "2g.20gb", 1),
        ("three-g", THREE_G, "3g.40gb", 1),
        ("two-one-g", ONE_G, "1g.10gb", 2),
    ):
        devices = assert_sees_exactly(cluster, namespace, name, resource, migs)
        assert len(devices) == count and {d.profile for d in devices} == {profile}, devices
        assert not seen & {d.uuid for d in devices}, "two pods were handed one MIG device"
        seen |= {d.uuid for d in devices}
    # The card's only 2g.20gb is taken: kube-scheduler says so.
    create(cluster, pod("second-two-g", namespace, [container("main", {TWO_G: "1"})]))
    reason = cluster.wait_for(
        "the second 2g.20gb pod refused by kube-scheduler",
        lambda: pending_reason(cluster, namespace, "second-two-g"),
        timeout=60,
    )
    assert f"Insufficient {TWO_G}" in reason, reason


def test_the_card_outside_mig_mode_serves_whole_and_shared_pods(
    cluster: Cluster, mig: MigAgent, namespace: str
) -> None:
    mig.use("mixed")
    card = MIXED_NODE.by_index(3)
    create(
        cluster,
        pod("shared", namespace, [probe("main", share(20_000, 300))], scheduler=SCHEDULER),
    )
    wait_running(cluster, namespace, "shared")
    env = container_env(cluster, namespace, "shared", "main")
    assert env["KUBEGPU_GPU_UUID"] == card.uuid, env
    assert env["NVIDIA_VISIBLE_DEVICES"] == card.uuid, env
    assert mig_view(env) == expected_view(cards=[card.minor_number])
    cluster.kubectl("delete", "pod", "-n", namespace, "shared", "--wait=true")

    create(cluster, pod("whole", namespace, [probe("main", {WHOLE: "1"})]))
    wait_running(cluster, namespace, "whole")
    env = container_env(cluster, namespace, "whole", "main")
    assert held(cluster, namespace, "whole", WHOLE) == [card.uuid]
    assert env["NVIDIA_VISIBLE_DEVICES"] == card.uuid, env
    assert mig_view(env) == expected_view(cards=[card.minor_number])


def test_an_xid_on_a_gpu_instance_takes_out_that_mig_device_and_one_on_a_card_all_of_its(
    cluster: Cluster, mig: MigAgent
) -> None:
    mig.use("mixed")
    control = mig.control["mixed"]
    target = MIXED_NODE.by_index(1).mig_devices[2]

    def allocatable(resource: str) -> str:
        return node_status(cluster, "allocatable").get(resource, "")

    try:
        reply = send_fake_gpu_command(
            control, "xid", gpu=1, xid=48, gpu_instance_id=target.gpu_instance_id
        )
        assert reply.get("ok"), reply
        cluster.wait_for(
            "one 1g.10gb out of allocatable", lambda: allocatable(ONE_G) == "7", timeout=60
        )
        assert (allocatable(THREE_G), allocatable(TWO_G), allocatable(WHOLE)) == ("3", "1", "1")

        assert send_fake_gpu_command(control, "xid", gpu=2, xid=48).get("ok")
        cluster.wait_for(
            "card 2's two 3g.40gb out of allocatable",
            lambda: allocatable(THREE_G) == "1",
            timeout=60,
        )
        assert (allocatable(ONE_G), allocatable(TWO_G), allocatable(WHOLE)) == ("7", "1", "1")
        capacity = node_status(cluster, "capacity")
        assert (capacity[ONE_G], capacity[THREE_G]) == ("8", "3")
    finally:
        for gpu in (1, 2):
            send_fake_gpu_command(control, "restore", gpu=gpu)
    cluster.wait_for(
        "the MIG devices back in allocatable",
        lambda: (allocatable(ONE_G), allocatable(THREE_G)) == ("8", "3"),
        timeout=60,
    )


def test_single_advertises_every_mig_device_as_nvidia_com_gpu(
    cluster: Cluster, mig: MigAgent, namespace: str
) -> None:
    mig.use("single")
    cluster.wait_for(
        "GFD's single labels on the Node",
        lambda: node_labels(cluster).get("nvidia.com/gpu.product") == f"{H100}-MIG-1g.10gb",
        timeout=60,
    )
    labels = node_labels(cluster)
    assert (labels["nvidia.com/mig.strategy"], labels["nvidia.com/gpu.count"]) == ("single", "14")
    assert labels["nvidia.com/gpu.memory"] == "9984"
    ours = {k: v for k, v in labels.items() if owns_label(k)}
    assert gfd_label_gaps(ours, "single") == {}, ours

    create(
        cluster,
        pod("one", namespace, [probe("main", {WHOLE: "1"})]),
        pod("two", namespace, [probe("main", {WHOLE: "2"})]),
    )
    wait_running(cluster, namespace, "one", "two")
    migs = mig_by_uuid(SINGLE_NODE)
    one = assert_sees_exactly(cluster, namespace, "one", WHOLE, migs)
    two = assert_sees_exactly(cluster, namespace, "two", WHOLE, migs)
    assert (len(one), len(two)) == (1, 2)
    assert {d.profile for d in one + two} == {"1g.10gb"}
    assert not {d.uuid for d in one} & {d.uuid for d in two}


def test_single_refuses_a_node_that_is_not_uniform_and_labels_it_invalid(
    cluster: Cluster, mig: MigAgent
) -> None:
    mig.stop()
    roles = mig.roles
    config = mig.config("single")
    refused = roles.start_role(
        "kubegpu-node-agent-single",
        roles.agent_argv(config, PRESET, mig.control["mixed"]),
    )
    deadline = time.monotonic() + 60
    while refused.running and time.monotonic() < deadline:
        time.sleep(0.5)
    assert refused.popen is not None and refused.popen.returncode == 1, refused.log.read_text()
    log = refused.log.read_text()
    assert (
        "error starting plugins: invalid MIG configuration: more than one MIG device type "
        "present on node" in log
    ), log[-2000:]
    roles.stop_role("kubegpu-node-agent-single")

    roles.start_labeller(config, fake_gpus=PRESET)
    mig.running = "labeller only"
    cluster.wait_for(
        "GFD's invalid single labels on the Node",
        lambda: node_labels(cluster).get("nvidia.com/gpu.product") == f"{H100}-MIG-INVALID",
        timeout=60,
    )
    labels = node_labels(cluster)
    assert {
        k: labels[k]
        for k in (
            "nvidia.com/mig.strategy",
            "nvidia.com/gpu.count",
            "nvidia.com/gpu.replicas",
            "nvidia.com/gpu.sharing-strategy",
            "nvidia.com/gpu.memory",
        )
    } == {
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/gpu.count": "0",
        "nvidia.com/gpu.replicas": "0",
        "nvidia.com/gpu.sharing-strategy": "",
        "nvidia.com/gpu.memory": "0",
    }
