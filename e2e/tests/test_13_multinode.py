"""Real multi-node choices with real kubelets (issue 27, item 5): three kubelets on this machine,
each in its own mount namespace with its own containerd and its own kubegpu node agent over a
different fake GPU layout (kubegpu_e2e/multinode.py), and the second kube-scheduler with the
kubegpu extender choosing between them. What kube-scheduler did is read from its own log (its
-v=10 lines of schedule_one.go: every plugin's and extender's score per node, each node's total,
and the bind), and what it should do is computed by the placement engine on the same state."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import OUT, _bin_dir, _leftovers, _results, _test_namespace, stop_default_cluster
from kubegpu_e2e.cluster import http_ok, write_kubeconfig
from kubegpu_e2e.dra import ACCOUNT, COMPONENT
from kubegpu_e2e.kubegpu import KubegpuRoles
from kubegpu_e2e.multinode import (
    NODES,
    SCORE_LOG_FLAGS,
    MultiNodeCluster,
    Scheduling,
    allocatable,
    scheduling_of,
)
from kubegpu_e2e.workloads import (
    SCHEDULER,
    container,
    container_env,
    create,
    pod,
    share,
    wait_running,
)

from kubegpu.config.extender import load_workload
from kubegpu.core.names import model_key
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.model import MILLI_PER_GPU, GpuState, NodeState, PodRequest
from kubegpu.sharing.resources import parse_quantity

pytestmark = pytest.mark.e2e

MultiNode = tuple[MultiNodeCluster, KubegpuRoles]
T4, MIXED, A100 = (n.name for n in NODES)
# The target workload fgd and kubegpu measure fragmentation against, fixed so that the test's
# engine and the extender's measure against the same one (the default, every pod in the
# cluster, is re-read only every five minutes).
WORKLOAD = """pods:
  - {cpuMilli: 100, gpuMilli: 1000, gpuCount: 1, weight: 2}
  - {cpuMilli: 100, gpuMilli: 500, weight: 2}
  - {cpuMilli: 100, gpuMilli: 300, weight: 1}
"""
# The extender's weight in deploy/overlays/second-scheduler/kube-scheduler-config.yaml (both
# entries), and kube-scheduler's MaxNodeScore / MaxExtenderPriority.
EXTENDER_WEIGHT = 5
EXTENDER_SCALE = 100 // 10
PROBE_COMPUTE = 700
PROBE_MEMORY_MIB = 2048


@pytest.fixture(scope="module")
def multinode() -> Iterator[MultiNode]:
    """Three kubelets, their node agents, the extender (policy kubegpu, the fixed workload) and
    the second kube-scheduler logging its scores. The default cluster goes first."""
    stop_default_cluster()
    started = time.monotonic()
    mn = MultiNodeCluster(_bin_dir(), OUT / "multinode")
    roles = KubegpuRoles(mn.cluster)
    workload = mn.cluster.run_dir / "workload.yaml"
    try:
        mn.start()
        workload.write_text(WORKLOAD)
        roles.apply_rbac()
        mn.start_agents(roles)
        roles.start_extender(f"--workload-file={workload}", "--policy=kubegpu")
        roles.start_scheduler(*SCORE_LOG_FLAGS, *mn.cluster._gate_flags())
        _results["multi-node cluster start"] = {
            "outcome": "passed",
            "duration_s": round(time.monotonic() - started, 1),
        }
        yield mn, roles
    finally:
        roles.stop()
        _leftovers.extend(mn.stop())


@pytest.fixture(scope="module")
def fragmented(multinode: MultiNode) -> Iterator[str]:
    """The state both policies are asked about: a 200-milli share on a T4 (little CPU), and a
    CPU-only pod holding 1.7 of the mixed node's 2 cores; the A100 node is empty. Pinned by node
    affinity, through the same scheduler and extender."""
    mn, _ = multinode
    for namespace in _test_namespace(mn.cluster, _Named("multinode")):  # type: ignore[arg-type]
        small = pinned(
            pod("t4-share", namespace, [container("c", share(1024, 200))], scheduler=SCHEDULER), T4
        )
        busy = pinned(pod("mixed-cpu", namespace, [container("c")], scheduler=SCHEDULER), MIXED)
        requests(small, cpu="100m")
        requests(busy, cpu="1700m")
        create(mn.cluster, small, busy)
        wait_running(mn.cluster, namespace, "t4-share", "mixed-cpu")
        yield namespace


class _Named:
    """What conftest's namespace helper reads of a pytest request: a name for the namespace."""

    def __init__(self, name: str) -> None:
        self.node = self
        self.name = name


def pinned(obj: dict[str, Any], node: str) -> dict[str, Any]:
    obj["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        }
    }
    return obj


def requests(obj: dict[str, Any], *, cpu: str, memory: str = "16Mi") -> None:
    for c in obj["spec"]["containers"]:
        c["resources"]["requests"] = {"cpu": cpu, "memory": memory}


def probe(name: str, namespace: str) -> dict[str, Any]:
    obj = pod(
        name,
        namespace,
        [container("c", share(PROBE_MEMORY_MIB, PROBE_COMPUTE))],
        scheduler=SCHEDULER,
    )
    requests(obj, cpu="100m")
    return obj


def engine_state(mn: MultiNodeCluster, namespace: str) -> list[NodeState]:
    """The three nodes as the placement engine sees them, built here from what the API server
    and the containers say: each Node's allocatable CPU and memory, the cards of its fake GPU
    preset, minus the requests of the pods bound to it and the share each container was told
    (its own environment)."""
    states = []
    pods = mn.cluster.get("pods", "-n", namespace)["items"]
    for rank, node in enumerate(mn.nodes):
        cpu, memory = allocatable(mn.cluster.get("node", node.name))
        gpus = resolve_fake_spec(node.spec.fake_gpus).inventory.gpus
        used = {g.uuid: [0, 0] for g in gpus}
        cpu_used = memory_used = 0
        for p in pods:
            if p["spec"].get("nodeName") != node.name:
                continue
            for c in p["spec"]["containers"]:
                asked = c["resources"].get("requests", {})
                cpu_used += int(parse_quantity(asked.get("cpu", "0")) * 1000)
                memory_used += int(parse_quantity(asked.get("memory", "0")) / 2**20)
                env = container_env(mn.cluster, namespace, p["metadata"]["name"], c["name"])
                if "KUBEGPU_GPU_UUID" in env:
                    used[env["KUBEGPU_GPU_UUID"]][0] += int(env["KUBEGPU_GPU_COMPUTE_MILLI"])
                    used[env["KUBEGPU_GPU_UUID"]][1] += int(env["KUBEGPU_GPU_MEMORY_LIMIT_MIB"])
        models = {model_key(g.product_name) for g in gpus}
        single = len(models) == 1
        states.append(
            NodeState(
                node.name,
                cpu,
                cpu - cpu_used,
                memory - memory_used,
                models.pop() if single else "",
                tuple(
                    GpuState(
                        g.index,
                        MILLI_PER_GPU - used[g.uuid][0],
                        g.memory_total_mib - used[g.uuid][1],
                        "" if single else model_key(g.product_name),
                    )
                    for g in gpus
                ),
                rank,
            )
        )
    return states


def engine_choice(
    states: list[NodeState], policy: str, workload: Path
) -> tuple[str, dict[str, int]]:
    """Where the placement engine (what `kubegpu simulate` places with) puts the probe, and its
    score of each node. A share is scored on compute only, as the extender scores it for
    fgd/kubegpu; every card here has the memory."""
    engine = PlacementEngine(states, policy, workload=load_workload(workload))
    request = PodRequest(100, 16, 1, PROBE_COMPUTE, None)
    chosen = engine.choose(request)
    assert chosen is not None
    return chosen.node, engine.score(request)


def scheduled(mn: MultiNodeCluster, roles: KubegpuRoles, namespace: str, name: str) -> Scheduling:
    log = roles.processes["kubegpu-scheduler"].log
    found = mn.cluster.wait_for(
        f"kube-scheduler's log of binding {namespace}/{name}",
        lambda: scheduling_of(log, f"{namespace}/{name}"),
        timeout=120,
    )
    assert isinstance(found, Scheduling)
    return found


def unique_best(scores: dict[str, int]) -> str:
    best = max(scores.values())
    winners = [n for n, s in scores.items() if s == best]
    assert len(winners) == 1, f"no single best node: {scores}"
    return winners[0]


def check_scores(found: Scheduling) -> tuple[str, str, str]:
    """The last scoring cycle: every node scored by the in-tree plugins and the extender, each
    total their weighted sum; returns the in-tree favourite, the extender's and the total's."""
    cycle = found.cycles[-1]
    nodes = {n.name for n in NODES}
    assert set(cycle.plugins) == nodes, cycle
    assert set(cycle.extenders) == nodes, cycle  # prioritize was asked about all three
    assert set(cycle.final) == nodes, cycle
    in_tree, extender = cycle.in_tree(), cycle.extender_total()
    for node in nodes:
        assert (
            cycle.final[node] == in_tree[node] + extender[node] * EXTENDER_WEIGHT * EXTENDER_SCALE
        )
    assert "evaluatedNodes=3" in found.bound_line and "feasibleNodes=3" in found.bound_line
    return unique_best(in_tree), unique_best(extender), unique_best(cycle.final)


def delete_pod(mn: MultiNodeCluster, namespace: str, name: str) -> None:
    mn.cluster.kubectl("delete", "pod", "-n", namespace, name, "--wait=true", "--timeout=60s")


def run_probe(
    mn: MultiNodeCluster, roles: KubegpuRoles, namespace: str, name: str
) -> tuple[Scheduling, str]:
    create(mn.cluster, probe(name, namespace))
    found = scheduled(mn, roles, namespace, name)
    wait_running(mn.cluster, namespace, name)
    node = mn.cluster.get("pod", "-n", namespace, name)["spec"]["nodeName"]
    assert node == found.bound_to
    env = container_env(mn.cluster, namespace, name, "c")
    assert env["KUBEGPU_GPU_COMPUTE_MILLI"] == str(PROBE_COMPUTE)
    return found, node


def restart_extender(roles: KubegpuRoles, policy: str, workload: Path) -> None:
    roles.stop_role("kubegpu-extender")
    roles.start_extender(f"--workload-file={workload}", f"--policy={policy}")
    roles.processes["kubegpu-extender"].wait_until(
        lambda: http_ok(f"http://127.0.0.1:{roles.extender_metrics_port}/readyz"),
        60,
        "extender /readyz",
    )


def test_prioritize_on_three_nodes_overrides_in_tree_scores(
    multinode: MultiNode, fragmented: str
) -> None:
    """Policy kubegpu: kube-scheduler asks the extender's prioritize about all three nodes, its
    own plugins alone would pick one node (the emptiest: LeastAllocated and
    BalancedAllocation), the extender scores another best, and the pod lands there, where the
    placement engine puts it on the same state."""
    mn, roles = multinode
    workload = mn.cluster.run_dir / "workload.yaml"
    expected, engine_scores = engine_choice(engine_state(mn, fragmented), "kubegpu", workload)
    found, node = run_probe(mn, roles, fragmented, "probe-kubegpu")
    in_tree, extender, total = check_scores(found)
    print(json.dumps({"cycle": found.cycles[-1].__dict__, "engine": engine_scores}, indent=1))
    print(found.bound_line)
    assert in_tree != extender, "the in-tree scores alone pick the extender's node: no contest"
    assert node == extender == total == expected
    delete_pod(mn, fragmented, "probe-kubegpu")


def test_fgd_and_kubegpu_choose_different_nodes_as_the_engine_does(
    multinode: MultiNode, fragmented: str
) -> None:
    """The same state asked of policy fgd (the extender restarted with --policy fgd): the
    placement engine says fgd and kubegpu choose different nodes for the same 700-milli
    share, and the real scheduler with the fgd extender lands the pod on fgd's choice."""
    mn, roles = multinode
    workload = mn.cluster.run_dir / "workload.yaml"
    states = engine_state(mn, fragmented)
    ours, _ = engine_choice(states, "kubegpu", workload)
    fgd, fgd_scores = engine_choice(states, "fgd", workload)
    assert ours != fgd, f"fgd and kubegpu agree on this state ({fgd}): nothing to show"
    restart_extender(roles, "fgd", workload)
    try:
        found, node = run_probe(mn, roles, fragmented, "probe-fgd")
        in_tree, extender, total = check_scores(found)
        print(json.dumps({"cycle": found.cycles[-1].__dict__, "engine": fgd_scores}, indent=1))
        print(found.bound_line)
        assert node == extender == total == fgd
        assert node != ours
        assert in_tree != extender, "the in-tree scores alone pick fgd's node: no contest"
        delete_pod(mn, fragmented, "probe-fgd")
    finally:
        restart_extender(roles, "kubegpu", workload)


# ------------------------------------------------------------------ (c) DRA: /prioritize-dra
DRA_SHARE_CLASS = "gpu-share.kubegpu.io"


def dra_share_pod(
    name: str, namespace: str, compute: int, node: str | None = None
) -> list[dict[str, Any]]:
    """A ResourceClaimTemplate for one share (compute milli, 2Gi) and a pod of the
    kubegpu-scheduler that claims from it (pinned to ``node`` when given)."""
    capacity = {"requests": {"memory": "2Gi", "compute": str(compute)}}
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": DRA_SHARE_CLASS,
                                "capacity": capacity,
                            },
                        }
                    ]
                }
            }
        },
    }
    obj = pod(name, namespace, [container("c")], scheduler=SCHEDULER)
    obj["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": name}]
    requests(obj, cpu="100m")
    if node is not None:
        pinned(obj, node)
    return [template, obj]


def slice_devices(mn: MultiNodeCluster, node: str) -> int:
    found = mn.cluster.get("resourceslices", f"--field-selector=spec.nodeName={node}")
    return sum(len(s["spec"].get("devices", [])) for s in found["items"])


@pytest.fixture(scope="module")
def dra_drivers(multinode: MultiNode) -> Iterator[MultiNodeCluster]:
    """`kubegpu dra-driver` on each of the three nodes (beside its node agent: a pod asking
    for a claim is served by DRA, one asking for kubegpu's resources by the agent), with the
    component's RBAC and DeviceClasses applied by the real kubectl."""
    mn, roles = multinode
    c = mn.cluster
    for name in ("dra-driver-rbac.yaml", "deviceclasses.yaml"):
        c.kubectl("apply", "--server-side", "-f", str(COMPONENT / name))
    token = c.kubectl("create", "token", ACCOUNT, "-n", "kubegpu", "--duration=12h").stdout.strip()
    kubeconfig = write_kubeconfig(
        c.run_dir / f"{ACCOUNT}.kubeconfig", c.server, c.ca.cert, user=ACCOUNT, token=token
    )
    for node in mn.nodes:
        argv = mn.dra_driver_argv(node, kubeconfig, COMPONENT / "dra-driver-config.yaml")
        roles.start_role(f"kubegpu-dra-driver-{node.name}", argv)
    for node in mn.nodes:
        c.wait_for(
            f"{node.name}'s ResourceSlice with its {node.gpu_count} cards",
            lambda n=node: slice_devices(mn, n.name) == n.gpu_count,
            timeout=90,
        )
    # The extender starts watching slices and claims at its first /prioritize-dra call and
    # scores every node 0 until that watch has listed them: kube-scheduler's first DRA pod
    # with a choice to make would be ranked blind. Make that first call here, then wait.
    body = json.dumps({"pod": warm_pod(), "nodenames": [n.name for n in mn.nodes]}).encode()
    post = urllib.request.Request(
        f"http://127.0.0.1:{roles.extender_port}/prioritize-dra",
        body,
        {"Content-Type": "application/json"},
    )
    urllib.request.urlopen(post, timeout=10).read()
    log = roles.processes["kubegpu-extender"].log
    c.wait_for(
        "the extender's DRA view listed the slices",
        lambda: "resourceslices at version" in log.read_text(errors="replace"),
        timeout=60,
    )
    yield mn


def warm_pod() -> dict[str, Any]:
    claims = [{"name": "gpu", "resourceClaimName": "none"}]
    meta = {"name": "warm", "namespace": "default"}
    return {"metadata": meta, "spec": {"resourceClaims": claims}}


def test_prioritize_dra_on_three_nodes_is_followed(
    multinode: MultiNode, dra_drivers: MultiNodeCluster, fragmented: str
) -> None:
    """A pod asking for a share through a ResourceClaim: kube-scheduler sends it to the
    extender's `/prioritize-dra` entry (the only one interested: it requests none of the other's
    resources) with all three nodes, which rank the nodes' DRA card state (the slices and the
    allocated claims) by the placement engine; after a 300-milli DRA share on the busy mixed
    node, the 700-milli share lands on the node the extender ranks best, though the in-tree
    plugins favour another, and DRA's allocator gives it a card there."""
    mn, roles = multinode
    c = mn.cluster
    create(c, *dra_share_pod("dra-setup", fragmented, 300, MIXED))
    wait_running(c, fragmented, "dra-setup")
    name = "dra-probe"
    create(c, *dra_share_pod(name, fragmented, PROBE_COMPUTE))
    found = scheduled(mn, roles, fragmented, "dra-probe")
    wait_running(c, fragmented, "dra-probe")
    in_tree, extender, total = check_scores(found)
    cycle = found.cycles[-1]
    assert all(len(scores) == 1 for scores in cycle.extenders.values()), cycle.extenders
    print(json.dumps({"cycle": cycle.__dict__}, indent=1))
    print(found.bound_line)
    node = c.get("pod", "-n", fragmented, "dra-probe")["spec"]["nodeName"]
    assert node == found.bound_to == extender == total
    assert in_tree != extender, "the in-tree scores alone pick the extender's node: no contest"
    claims = c.get("resourceclaims", "-n", fragmented)["items"]
    (probe_claim,) = [x for x in claims if x["metadata"]["ownerReferences"][0]["name"] == name]
    (result,) = probe_claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == node, result
