"""``kubegpu demo`` as a user runs it: a real process tree, real sockets, real HTTP."""

from __future__ import annotations

import json
import re
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import lightkube
import pytest
import yaml
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Event, Node, Pod

from kubegpu.sharing.annotations import INVENTORY_ANNOTATION, decode_inventory
from kubegpu.sharing.ledger import ALLOCATED_ANNOTATION, decode_ledger
from kubegpu.sharing.podstate import read_decision
from tests.demo.conftest import DemoProcess, alive_kubegpu_processes, sockets_under

pytestmark = pytest.mark.slow

COMPONENTS = {"fake-apiserver", "extender"}
REPO = Path(__file__).resolve().parents[2]
PROGRESS = re.compile(
    r"^progress +[\d.]+ s: (\d+)/(\d+) submitted, (\d+) bound, (\d+) running, "
    r"(\d+) refused, (\d+) failed$",
    re.M,
)


def assert_progress_was_shown(out: str, total: int) -> None:
    """Progress lines (the demo's output is a pipe here, not a terminal) between "replaying"
    and "settled": the first before every pod was submitted, the last with all settled."""
    replay = out.split("replaying", 1)[1].split("settled in", 1)[0]
    seen = [tuple(int(n) for n in m.groups()) for m in PROGRESS.finditer(replay)]
    assert len(seen) >= 2, replay
    assert all(t == total for _, t, *_ in seen)
    assert seen[0][0] < total
    submitted, _, _, running, refused, failed = seen[-1]
    assert submitted == total and running + refused + failed == total
    assert [s[0] for s in seen] == sorted(s[0] for s in seen)


def assert_refused_pods_carry_their_reasons(out: str, summary: dict[str, Any], nodes: int) -> None:
    """Every refused pod has a line of its own with what it asked for and why each node said no."""
    refused = summary["refused"]
    assert len(refused) == summary["pods_refused"]
    section = out.split("refused pods (why, per node):", 1)[1]
    for pod in refused:
        line = f"  {pod['pod']} ({pod['request']}): {pod['reason']}"
        assert line in section, pod
        # "NODES: reason; NODES: reason": every node says why, once.
        named = [
            node
            for part in pod["reason"].split("; ")
            for node in part.split(": ", 1)[0].split(", ")
        ]
        assert sorted(named) == [f"gpu-node-{i}" for i in range(nodes)], pod


def assert_nothing_left(demo: DemoProcess, work_dir: Path, nodes: int) -> None:
    pids = demo.child_pids()
    names = set(pids.values())
    assert names >= COMPONENTS
    assert sum(n.startswith("node-agent-") for n in names) == nodes
    assert alive_kubegpu_processes(pids) == []
    # Every component removed its own sockets before the demo removed its directory.
    assert "sockets left behind" not in demo.output
    assert sockets_under(work_dir) == []
    assert list(work_dir.iterdir()) == []  # the demo's temporary directory is gone too


def test_demo_replays_the_scenario_prints_inspect_and_a_summary_and_cleans_up(
    work_dir: Path, demo_process: type[DemoProcess]
) -> None:
    demo = demo_process(work_dir, "--nodes", "3", "--pods", "40")
    code = demo.wait()
    out = demo.output
    assert code == 0, out
    table = out.split("kubectl gpu inspect:", 1)[1].split("summary:", 1)[0]
    # One block per node, each with at least one pod on a card.
    assert table.count("node gpu-node-") == 3
    assert "default/" in table.split("pending GPU pods")[0]
    assert "cards used" in out and "memory packed" in out
    summary = json.loads(demo.summary_json.read_text())
    assert summary["pods_submitted"] == 40
    assert summary["pods_running"] > 0 and summary["cards_used"] > 0
    assert summary["pods_running"] + summary["pods_refused"] + summary["pods_failed"] == 40
    assert summary["over_committed"] == []
    assert summary["cards_total"] == 8 + 4 + 4
    assert_progress_was_shown(out, 40)
    # The built-in scenario over-asks on purpose: some pods are refused, each with its reason,
    # and the grouped reasons stay.
    assert summary["pods_refused"] > 0
    assert "top refusal reasons (pod x node):" in out
    assert_refused_pods_carry_their_reasons(out, summary, nodes=3)
    assert_nothing_left(demo, work_dir, nodes=3)


OPENB = REPO.parent / "shared" / "traces" / "openb"


@pytest.mark.skipif(not OPENB.is_dir(), reason=f"no openb trace at {OPENB}")
def test_demo_replays_a_slice_of_the_openb_trace(
    work_dir: Path, demo_process: type[DemoProcess]
) -> None:
    # As the README says to run it, from the repository root ("openb" is relative to it).
    demo = demo_process(work_dir, "--trace", "openb", "--nodes", "4", cwd=REPO)
    code = demo.wait(180)
    out = demo.output
    assert code == 0, out
    assert "pods from the openb trace" in out
    table = out.split("kubectl gpu inspect:", 1)[1].split("summary:", 1)[0]
    cards = table.split("cluster:", 1)[0]
    assert cards.count("node gpu-node-") == 4
    # A non-empty allocation table: trace pods on cards.
    assert re.search(r"default/openb-pod-\d+", cards), table
    summary = json.loads(demo.summary_json.read_text())
    assert summary["pods_submitted"] == 40  # the default slice
    assert summary["pods_running"] > 0 and summary["cards_used"] > 0
    assert summary["over_committed"] == []
    assert_progress_was_shown(out, 40)
    assert_refused_pods_carry_their_reasons(out, summary, nodes=4)
    assert_nothing_left(demo, work_dir, nodes=4)


def _audit_cards(pods: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Per card (node/uuid): compute and memory held by live pods, read from the decisions
    the extender recorded; each shared pod's ledger (written by the node agent at Allocate)
    must name the same card."""
    capacity = {}
    for node in nodes:
        inventory = decode_inventory(node["metadata"]["annotations"][INVENTORY_ANNOTATION])
        for gpu in inventory.gpus:
            capacity[f"{node['metadata']['name']}/{gpu.uuid}"] = gpu.memory_mib
    held: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for pod in pods:
        if pod["status"].get("phase") != "Running":
            continue
        decision, problem = read_decision(pod)
        assert problem == ""
        if decision is None:
            continue
        assert decision.node == pod["spec"]["nodeName"]
        if decision.shared:
            ledger = decode_ledger(pod["metadata"]["annotations"][ALLOCATED_ANNOTATION])
            assert {c.uuid for c in ledger.containers} == {decision.cards[0].uuid}
        for card in decision.cards:
            key = f"{decision.node}/{card.uuid}"
            assert key in capacity
            held[key][0] += card.compute_milli
            held[key][1] += card.gpu_memory_mib
    for key, (compute, memory) in held.items():
        assert compute <= 1000, key
        assert memory <= capacity[key], key
    return held


def test_keep_running_serves_the_cluster_until_ctrl_c_with_no_card_over_capacity(
    work_dir: Path, demo_process: type[DemoProcess]
) -> None:
    demo = demo_process(work_dir, "--nodes", "3", "--pods", "30", "--keep-running")
    demo.wait_for_output("Ctrl-C to stop")
    kubeconfig = json.loads(demo.summary_json.read_text())["kubeconfig"]
    # From a dict: lightkube's from_file leaves the file open (a ResourceWarning here).
    config = KubeConfig.from_dict(yaml.safe_load(Path(kubeconfig).read_text()))
    client = lightkube.Client(config, trust_env=False)
    try:
        pods = [p.to_dict() for p in client.list(Pod, namespace="*")]
        nodes = [n.to_dict() for n in client.list(Node)]
        events = [e.to_dict() for e in client.list(Event, namespace="*")]
    finally:
        client.close()
    assert len(pods) == 30
    held = _audit_cards(pods, nodes)
    assert held, "no card holds anything"
    refused = [
        p
        for p in pods
        if not p["spec"].get("nodeName")
        and any(
            c["type"] == "PodScheduled" and c["status"] == "False"
            for c in p["status"].get("conditions") or []
        )
    ]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert len(refused) + len(running) == 30
    assert running and refused
    for pod in refused:
        (condition,) = pod["status"]["conditions"]
        assert condition["reason"] == "Unschedulable"
        assert condition["message"].startswith("0/3 nodes are available: ")
    failed_scheduling = {
        e["involvedObject"]["name"] for e in events if e["reason"] == "FailedScheduling"
    }
    assert {p["metadata"]["name"] for p in refused} <= failed_scheduling
    # What the kubelets report: device-plugin resources in allocatable.
    for node in nodes:
        allocatable = node["status"]["allocatable"]
        assert "nvidia.com/gpu" in allocatable and "kubegpu.io/gpu-shared" in allocatable

    demo.interrupt()
    assert demo.wait(60) == 0, demo.output
    assert_nothing_left(demo, work_dir, nodes=3)


def test_ctrl_c_in_the_middle_of_the_replay_stops_everything(
    work_dir: Path, demo_process: type[DemoProcess]
) -> None:
    demo = demo_process(work_dir, "--nodes", "2", "--pods", "48")
    demo.wait_for_output("replaying")
    demo.interrupt()
    assert demo.wait(60) == 130, demo.output
    assert "interrupted (SIGINT)" in demo.output
    assert_nothing_left(demo, work_dir, nodes=2)


def test_sigterm_while_the_node_agents_start_stops_everything_started_so_far(
    work_dir: Path, demo_process: type[DemoProcess]
) -> None:
    demo = demo_process(work_dir, "--nodes", "3", "--pods", "10")
    demo.wait_for_output("node gpu-node-1 (")
    demo.interrupt(signal.SIGTERM)
    assert demo.wait(60) == 130, demo.output
    assert "interrupted (SIGTERM)" in demo.output
    pids = demo.child_pids()
    assert {"fake-apiserver", "extender", "node-agent-gpu-node-0"} <= set(pids.values())
    assert alive_kubegpu_processes(pids) == []
    assert "sockets left behind" not in demo.output
    assert sockets_under(work_dir) == []
    assert list(work_dir.iterdir()) == []


def test_a_bad_policy_is_refused_before_anything_starts(
    work_dir: Path, demo_process: type[DemoProcess]
) -> None:
    demo = demo_process(work_dir, "--nodes", "1", "--policy", "no-such-policy")
    assert demo.wait(60) == 2
    assert "Invalid value for '--policy': 'no-such-policy' is not one of" in demo.output
    assert not demo.pid_file.exists() or demo.child_pids() == {}
    assert list(work_dir.iterdir()) == []


def test_a_component_that_fails_to_start_is_named_with_its_log(
    work_dir: Path, demo_process: type[DemoProcess]
) -> None:
    # A setting the extender refuses at start, reaching it through the environment the demo's
    # children inherit (the demo checks its own options before it starts anything).
    demo = demo_process(work_dir, "--nodes", "1", env={"KUBEGPU_EXTENDER_MAX_BODY_BYTES": "1"})
    assert demo.wait(60) == 1
    out = demo.output
    assert "kubegpu demo: extender: exited with code 2" in out
    assert "--- extender log tail ---" in out
    assert "--max-body-bytes" in out
    pids = demo.child_pids()
    assert set(pids.values()) == {"fake-apiserver", "extender"}
    assert alive_kubegpu_processes(pids) == []
    assert list(work_dir.iterdir()) == []
