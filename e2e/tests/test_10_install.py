"""kubegpu installed as users install it, on a cluster of its own: the image built from the
project's Dockerfile by buildah, `helm install --wait` of deploy/helm/kubegpu, and every
scenario against the release's pods, none against host processes (kubegpu_e2e/release.py).

In order, on one release: every role Ready as a pod in its own network namespace (the node
agent registering with the real kubelet from inside its pod, the labeller and the exporter
beside it, the second kube-scheduler with the extender); whole GPUs; a shared pod through
kubegpu-scheduler; `kubectl gpu inspect`; a real Prometheus scraping the exporter's pod port;
`helm upgrade` to a rebuilt image and `helm rollback` with GPU pods running; the node agent's pod
deleted and its process killed; the scheduler's pod deleted while shared pods wait; and
`helm uninstall`. The figures (time to Ready, image sizes, what the upgrade did to running GPU
pods) go to e2e/out/report.json under "installed release"."""

from __future__ import annotations

import ipaddress
import os
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import record_install
from kubegpu_e2e.cluster import NODE_NAME, POD_CIDR, Cluster
from kubegpu_e2e.prometheus import Prometheus
from kubegpu_e2e.release import (
    IMAGE_REPOSITORY,
    NAMESPACE,
    RELEASE,
    UPGRADE_VERSION,
    Release,
    archive_tag,
    image_archive,
    is_ready,
    parse_time,
)
from kubegpu_e2e.workloads import (
    CARD_COMPUTE_MILLI,
    CARD_MEMORY_MIB,
    SCHEDULER,
    SHARED,
    WHOLE,
    card_totals,
    container,
    container_env,
    create,
    inspected_card_view,
    kubelet_card_view,
    pending_reason,
    phase,
    pod,
    pod_resources,
    share,
    wait_running,
)

pytestmark = pytest.mark.e2e

AGENT = "kubegpu-node-agent"
SCHEDULER_POD = "kubegpu-scheduler"
RULES = Path(__file__).resolve().parents[2] / "deploy" / "monitoring" / "kubegpu-rules.yaml"
LONG_LIVED = "e2e-install-long-lived"
# GPU pods started early that every later scenario checks are still running, untouched.
_running: dict[str, str] = {}  # pod name -> namespace


def _network_address_in_pod_range(address: str) -> bool:
    return ipaddress.ip_address(address) in ipaddress.ip_network(POD_CIDR)


def _advertised(cluster: Cluster) -> bool:
    status = cluster.get("node", NODE_NAME)["status"]
    return bool(
        status["capacity"].get(WHOLE) == "8" and status["allocatable"].get(SHARED) == str(8 * 32)
    )


def _snapshot(cluster: Cluster) -> dict[str, Any]:
    """What a running GPU pod is, as the real components say: its uid, containers' ids and
    restart counts, the devices PodResources lists for it, and the environment it printed."""
    held: dict[tuple[str, str], list[tuple[str, tuple[str, ...]]]] = {}
    for entry in pod_resources(cluster.pod_resources_socket):
        held.setdefault((entry.namespace, entry.pod), []).append((entry.resource, entry.device_ids))
    state = {}
    for name, namespace in sorted(_running.items()):
        obj = cluster.get("pod", "-n", namespace, name)
        containers = obj["status"].get("containerStatuses", [])
        state[name] = {
            "uid": obj["metadata"]["uid"],
            "phase": obj["status"].get("phase"),
            "containers": {
                c["name"]: (c.get("containerID"), c.get("restartCount")) for c in containers
            },
            "devices": sorted(held.get((namespace, name), [])),
            "env": {
                c["name"]: container_env(cluster, namespace, name, c["name"]) for c in containers
            },
        }
    return state


def _assert_running_pods_untouched(cluster: Cluster, before: dict[str, Any], what: str) -> None:
    after = _snapshot(cluster)
    assert set(after) == set(before)
    for name, was in before.items():
        now = after[name]
        assert now["phase"] == "Running", (what, name, now)
        assert now == was, f"{what} changed running GPU pod {name}: {was} -> {now}"


def _agent_images(release: Release) -> set[str]:
    (agent,) = release.pods(AGENT)
    return {c["image"] for c in agent["spec"]["containers"]}


def _new_pods_schedule(cluster: Cluster, namespace: str, suffix: str) -> None:
    """A shared pod through kubegpu-scheduler and a whole-GPU pod still run, and no card is
    over-committed by what every container was told."""
    create(
        cluster,
        pod(
            f"share-{suffix}", namespace, [container("main", share(8192, 100))], scheduler=SCHEDULER
        ),
        pod(f"whole-{suffix}", namespace, [container("main", {WHOLE: "1"})]),
    )
    wait_running(cluster, namespace, f"share-{suffix}", f"whole-{suffix}")
    for card, (memory, compute) in card_totals(cluster, [namespace, *_running.values()]).items():
        assert memory <= CARD_MEMORY_MIB and compute <= CARD_COMPUTE_MILLI, (card, memory)
    cluster.kubectl("delete", "pod", "-n", namespace, f"share-{suffix}", f"whole-{suffix}")


# ---------------------------------------------------------------------------- the install


def test_every_role_runs_as_a_pod_of_the_release(installed: tuple[Cluster, Release]) -> None:
    cluster, release = installed
    tag = archive_tag(image_archive())
    agent = release.ready_pod(AGENT)
    scheduler = release.ready_pod(SCHEDULER_POD)
    for obj in (agent, scheduler):
        # The chart's pods as the chart writes them: own network namespace, an address of the
        # suite's pod range, every container Ready and never restarted.
        assert not obj["spec"].get("hostNetwork"), obj["metadata"]["name"]
        assert _network_address_in_pod_range(obj["status"]["podIP"]), obj["status"]
        for status in obj["status"]["containerStatuses"]:
            assert status["ready"] and status["restartCount"] == 0, status
    assert {c["name"] for c in agent["spec"]["containers"]} == {"device-plugin", "labels"}
    assert _agent_images(release) == {f"{IMAGE_REPOSITORY}:{tag}"}
    images = {c["name"]: c["image"] for c in scheduler["spec"]["containers"]}
    assert images == {
        "kube-scheduler": f"registry.k8s.io/kube-scheduler:{release.kubernetes_version}",
        "extender": f"{IMAGE_REPOSITORY}:{tag}",
    }
    # Registration from inside the pod: the real kubelet advertises what the agent offers.
    cluster.wait_for("the Node to advertise 8 GPUs and 256 slots", lambda: _advertised(cluster))
    # The labeller in the agent's pod patched the Node through its in-cluster client.
    cluster.wait_for(
        "the labeller's GPU labels on the Node",
        lambda: (
            cluster.get("node", NODE_NAME)["metadata"]["labels"].get("nvidia.com/gpu.count") == "8"
        ),
        timeout=60,
    )
    # The scheduler pod won the kubegpu-scheduler Lease (its identity starts with the pod name).
    holder = cluster.get("lease", "-n", "kube-system", "kubegpu-scheduler")["spec"]
    assert holder["holderIdentity"].startswith(scheduler["metadata"]["name"]), holder
    times = release.ready_times()
    assert agent["metadata"]["name"] in times and scheduler["metadata"]["name"] in times
    record_install("ready_after_s", times)


def test_whole_gpus_from_the_installed_agent(
    installed: tuple[Cluster, Release], install_namespace: str
) -> None:
    cluster, _ = installed
    ns = install_namespace
    create(cluster, pod("two-gpus", ns, [container("main", {WHOLE: "2"})]))
    wait_running(cluster, ns, "two-gpus")
    # The kubelet may list a container's devices in several entries (one per device).
    held = sorted(
        device
        for e in pod_resources(cluster.pod_resources_socket)
        if e.namespace == ns and e.pod == "two-gpus" and e.resource == WHOLE
        for device in e.device_ids
    )
    env = container_env(cluster, ns, "two-gpus", "main")
    assert len(held) == 2 and len(set(held)) == 2, held
    assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == held


def test_a_shared_pod_through_the_installed_kubegpu_scheduler(
    installed: tuple[Cluster, Release], install_namespace: str
) -> None:
    """Kept running: later scenarios check that upgrades, restarts and the uninstall leave it
    (and the whole-GPU pod started here) untouched."""
    cluster, _ = installed
    ns = LONG_LIVED
    cluster.kubectl("create", "namespace", ns)
    cluster.wait_for("the default ServiceAccount", lambda: cluster.get("sa", "default", "-n", ns))
    create(
        cluster,
        pod("long-share", ns, [container("main", share(20480, 300))], scheduler=SCHEDULER),
        pod("long-whole", ns, [container("main", {WHOLE: "1"})]),
    )
    wait_running(cluster, ns, "long-share", "long-whole")
    env = container_env(cluster, ns, "long-share", "main")
    assert int(env["KUBEGPU_GPU_MEMORY_LIMIT_MIB"]) == 20480
    assert int(env["KUBEGPU_GPU_COMPUTE_MILLI"]) == 300
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["KUBEGPU_GPU_UUID"]
    slots = [
        e
        for e in pod_resources(cluster.pod_resources_socket)
        if e.namespace == ns and e.pod == "long-share" and e.resource == SHARED
    ]
    assert len(slots) == 1, slots
    obj = cluster.get("pod", "-n", ns, "long-share")
    assert obj["spec"]["nodeName"] == NODE_NAME
    _running.update({"long-share": ns, "long-whole": ns})


def test_kubectl_gpu_inspect_reads_the_installed_release(
    installed: tuple[Cluster, Release],
) -> None:
    cluster, _ = installed
    assert _running, "needs the long-lived pods of the shared-pod scenario"
    # The default exporter URL: the node agent pod's IP, found by the pod's label.
    kubelet = kubelet_card_view(cluster, LONG_LIVED)
    assert sum(len(pods) for pods in kubelet.values()) == 2, kubelet
    cluster.wait_for(
        "inspect to agree with PodResources",
        lambda: inspected_card_view(cluster, NODE_NAME, LONG_LIVED) == kubelet,
        60,
    )


def _service_endpoints(cluster: Cluster, service: str) -> list[str]:
    """ADDRESS:PORT of every ready endpoint of a Service, from its EndpointSlices (what a
    Prometheus with Kubernetes service discovery, or the ServiceMonitor, scrapes)."""
    slices = cluster.get(
        "endpointslices", "-n", NAMESPACE, "-l", f"kubernetes.io/service-name={service}"
    )
    return [
        f"{address}:{port['port']}"
        for item in slices["items"]
        for endpoint in item.get("endpoints") or []
        if endpoint.get("conditions", {}).get("ready")
        for address in endpoint["addresses"]
        for port in item.get("ports") or []
        if port.get("name") == "metrics"
    ]


def test_prometheus_scrapes_the_exporter_pod_port_and_the_extender_service(
    installed: tuple[Cluster, Release],
) -> None:
    cluster, release = installed
    (agent,) = release.pods(AGENT)
    (scheduler,) = release.pods(SCHEDULER_POD)
    # The chart's metrics Service selects exactly the scheduler pod, on the extender's port.
    extender = cluster.wait_for(
        "the extender metrics Service's ready endpoint",
        lambda: _service_endpoints(cluster, "kubegpu-extender-metrics"),
        60,
    )
    assert extender == [f"{scheduler['status']['podIP']}:9402"], extender
    server = Prometheus(
        cluster,
        RULES,
        {AGENT: f"{agent['status']['podIP']}:9400", "kubegpu-extender-metrics": extender[0]},
    ).start()
    try:

        def shared_pod_series() -> list[dict[str, str]]:
            query = f'kubegpu_pod_gpu_memory_share_bytes{{namespace="{LONG_LIVED}"}}'
            return server.series(query)

        cluster.wait_for("both targets up", lambda: len(server.value("up == 1")) == 2, 60)
        cluster.wait_for("the shared pod's series", shared_pod_series, 60)
        (series,) = shared_pod_series()
        assert series["pod"] == "long-share" and series["node"] == NODE_NAME, series
        # Per-pod attribution on the card the shared pod was told.
        env = container_env(cluster, LONG_LIVED, "long-share", "main")
        assert series["uuid"] == env["KUBEGPU_GPU_UUID"], (series, env)
        assert server.series('kubegpu_extender_pending_gpu_pods{job="kubegpu-extender-metrics"}')
    finally:
        server.stop()


# ---------------------------------------------------------------------------- day 2


def test_upgrade_and_rollback_keep_running_gpu_pods(
    installed: tuple[Cluster, Release], install_namespace: str
) -> None:
    cluster, release = installed
    old_tag = archive_tag(image_archive())
    new_tag = archive_tag(image_archive(upgrade=True))
    assert new_tag != old_tag and new_tag == UPGRADE_VERSION
    before = _snapshot(cluster)
    old_agent = release.ready_pod(AGENT)["metadata"]["uid"]
    old_scheduler = release.ready_pod(SCHEDULER_POD)["metadata"]["uid"]

    seconds = release.upgrade(new_tag)
    agent = release.ready_pod(AGENT)
    scheduler = release.ready_pod(SCHEDULER_POD)
    # Both workloads rolled to the new build, which reports its own version.
    assert agent["metadata"]["uid"] != old_agent and scheduler["metadata"]["uid"] != old_scheduler
    assert _agent_images(release) == {f"{IMAGE_REPOSITORY}:{new_tag}"}
    version = cluster.kubectl(
        "exec",
        "-n",
        NAMESPACE,
        agent["metadata"]["name"],
        "-c",
        "device-plugin",
        "--",
        "kubegpu",
        "--version",
    ).stdout
    assert new_tag in version, version
    cluster.wait_for("the Node to advertise again", lambda: _advertised(cluster), 90)
    _assert_running_pods_untouched(cluster, before, "helm upgrade")
    _new_pods_schedule(cluster, install_namespace, "after-upgrade")

    rollback_seconds = release.rollback(1)
    agent = release.ready_pod(AGENT)
    assert _agent_images(release) == {f"{IMAGE_REPOSITORY}:{old_tag}"}
    cluster.wait_for("the Node to advertise again", lambda: _advertised(cluster), 90)
    _assert_running_pods_untouched(cluster, before, "helm rollback")
    _new_pods_schedule(cluster, install_namespace, "after-rollback")
    record_install(
        "upgrade",
        {
            "from": old_tag,
            "to": new_tag,
            "helm_upgrade_wait_s": seconds,
            "helm_rollback_wait_s": rollback_seconds,
            "running_gpu_pods": sorted(before),
            "running_gpu_pods_effect": "none: same uid, container ids, restart counts, "
            "PodResources devices and printed environment after upgrade and rollback",
        },
    )


def _time_agent_back(cluster: Cluster, release: Release, old_uid: str, restarts: int) -> float:
    """Seconds until the agent's pod (a new one, or the same one restarted) is Ready again and
    the Node advertises its resources."""
    started = time.monotonic()

    def back() -> bool:
        pods = release.pods(AGENT)
        if len(pods) != 1 or not is_ready(pods[0]):
            return False
        (status,) = [
            c for c in pods[0]["status"]["containerStatuses"] if c["name"] == "device-plugin"
        ]
        if pods[0]["metadata"]["uid"] == old_uid:
            return bool(status["restartCount"] > restarts)
        return True

    cluster.wait_for("the node agent Ready again", back, 180)
    cluster.wait_for("the Node to advertise again", lambda: _advertised(cluster), 90)
    return round(time.monotonic() - started, 1)


def _agent_process_pids() -> list[int]:
    """The device plugin's process inside the agent's container, seen from this namespace."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"/kubegpu") for a in argv[:2]) and b"device-plugin" in argv:
            found.append(int(entry.name))
    return found


def test_the_node_agent_comes_back_from_pod_deletion_and_a_killed_process(
    installed: tuple[Cluster, Release], install_namespace: str
) -> None:
    cluster, release = installed
    before = _snapshot(cluster)
    agent = release.ready_pod(AGENT)
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, agent["metadata"]["name"], "--wait=false")
    after_delete = _time_agent_back(cluster, release, agent["metadata"]["uid"], 0)
    _assert_running_pods_untouched(cluster, before, "deleting the node agent's pod")

    agent = release.ready_pod(AGENT)
    pids = _agent_process_pids()
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    after_kill = _time_agent_back(cluster, release, agent["metadata"]["uid"], 0)
    _assert_running_pods_untouched(cluster, before, "killing the node agent's process")
    _new_pods_schedule(cluster, install_namespace, "after-agent")
    record_install("node_agent_back_s", {"pod_deleted": after_delete, "process_killed": after_kill})


def _scheduled_at(cluster: Cluster, namespace: str, name: str) -> datetime | None:
    for condition in cluster.get("pod", "-n", namespace, name)["status"].get("conditions", []):
        if condition["type"] == "PodScheduled" and condition["status"] == "True":
            return parse_time(condition["lastTransitionTime"])
    return None


def test_pods_waiting_while_the_scheduler_pod_is_deleted_run_once_it_is_back(
    installed: tuple[Cluster, Release], install_namespace: str
) -> None:
    cluster, release = installed
    ns = install_namespace
    # 16 half-card shares: more than the cards hold. 8 cards, one holding the long-lived
    # whole-GPU pod and one the 20 GiB/30 % share (room for one half more): 6 x 2 + 1 run,
    # 3 wait with the extender's reason.
    names = [f"wait-{i}" for i in range(16)]
    create(
        cluster,
        *[pod(n, ns, [container("main", share(40960, 500))], scheduler=SCHEDULER) for n in names],
    )
    cluster.wait_for(
        "13 running and 3 refused by the extender",
        lambda: (
            sum(phase(cluster, ns, n) == "Running" for n in names) == 13
            and sum(bool(pending_reason(cluster, ns, n)) for n in names) == 3
        ),
        180,
    )
    waiting = [n for n in names if phase(cluster, ns, n) == "Pending"]
    # The scheduler's pod goes while those wait, and room appears before it is back.
    old = release.ready_pod(SCHEDULER_POD)
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, old["metadata"]["name"], "--wait=true")
    started = time.monotonic()
    freed = [n for n in names if n not in waiting][:3]
    cluster.kubectl("delete", "pod", "-n", ns, *freed, "--wait=true", timeout=120)
    new = release.ready_pod(SCHEDULER_POD)
    back = parse_time(new["metadata"]["creationTimestamp"])
    wait_running(cluster, ns, *waiting)
    for name in waiting:
        scheduled = _scheduled_at(cluster, ns, name)
        # Bound by the new scheduler (second resolution, as the API server records it).
        assert scheduled is not None and scheduled >= back, (name, scheduled, back)
    running = [n for n in names if n not in freed and phase(cluster, ns, n) == "Running"]
    assert len(running) == 13, running
    for card, (memory, compute) in card_totals(cluster, [ns, *_running.values()]).items():
        assert memory <= CARD_MEMORY_MIB and compute <= CARD_COMPUTE_MILLI, (card, memory)
    record_install("scheduler_back_waiting_pods_running_s", round(time.monotonic() - started, 1))
    cluster.kubectl("delete", "pod", "-n", ns, *running, "--wait=true", timeout=120)


def test_uninstall_removes_the_release_and_leaves_running_gpu_pods(
    installed: tuple[Cluster, Release], install_namespace: str
) -> None:
    cluster, release = installed
    before = _snapshot(cluster)
    seconds = release.uninstall()

    def left() -> list[str]:
        kinds = (
            "all,configmaps,secrets,serviceaccounts,roles,rolebindings,resourcequotas,"
            "clusterroles,clusterrolebindings,namespaces,mutatingwebhookconfigurations"
        )
        found = cluster.get(kinds, "-A", "-l", f"app.kubernetes.io/instance={RELEASE}")
        return [f"{o['kind']}/{o['metadata']['name']}" for o in found["items"]]

    cluster.wait_for("nothing of the release left", lambda: not left(), 180)
    cluster.wait_for(
        f"namespace {NAMESPACE} gone",
        lambda: cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0,
        180,
    )
    # Running GPU pods keep running with their devices: the kubelet does not stop a pod whose
    # device plugin went away. New GPU pods wait: nothing serves the resources any more.
    _assert_running_pods_untouched(cluster, before, "helm uninstall")
    cluster.wait_for(
        "the Node's GPUs unallocatable",
        lambda: cluster.get("node", NODE_NAME)["status"]["allocatable"].get(WHOLE) == "0",
        120,
    )
    create(cluster, pod("after-uninstall", install_namespace, [container("main", {WHOLE: "1"})]))
    cluster.wait_for(
        "the new GPU pod refused",
        lambda: (
            "Insufficient nvidia.com/gpu"
            in pending_reason(cluster, install_namespace, "after-uninstall")
        ),
        60,
    )
    record_install(
        "uninstall",
        {
            "helm_uninstall_wait_s": seconds,
            "running_gpu_pods_effect": "kept running with their devices",
        },
    )
