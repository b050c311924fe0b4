"""Preemption that sees cards, on the real kube-scheduler and API server: the shipped setup
(preemptVerb in the scheduler config, the extender's own preemption on) against both off, on
the same three layouts of the fake 8xA100 node, each filled by lower-priority pods:

* **shares, card-level**: a 700-milli share at high priority fits only if the two 500-milli
  shares on one card go. kube-scheduler counts no card memory or compute, so its own dry run
  finds no victim; the extender preempts exactly those two and the pod runs on that card.
* **shares, the wrong card**: CPU is what kube-scheduler sees short, and its dry run picks the
  least important pod, a 600-milli share whose card still lacks room for the waiting 700
  after it goes. Through the verb the victims become the two 500-milli shares of the other
  card.
* **mixed, whole GPU**: a one-GPU pod on a node whose last two cards hold a share at priority 5
  and a whole-GPU pod at 10. kube-scheduler can only count the whole-GPU pod as freeing a GPU;
  through the verb the share goes instead, the less important pod, and its card is used.

Each scenario records what was evicted and whether the preemptor ran, per mode, in
report.json (docs/sharing.md quotes it)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import record_figure
from kubegpu_e2e.cluster import NODE_NAME, Cluster
from kubegpu_e2e.kubegpu import KubegpuRoles
from kubegpu_e2e.workloads import (
    COMPUTE,
    MEMORY,
    SCHEDULER,
    SHARED,
    WHOLE,
    container,
    create,
    phase,
    priority_class,
    wait_running,
)

from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION

pytestmark = pytest.mark.e2e

PRIORITIES = {"e2e-lowest": 5, "e2e-low": 10, "e2e-high": 1000}
# How long a preemptor that nothing will help is watched before it is called stuck: several
# of kube-scheduler's retries (backoff 1 s doubling to 10 s) and the extender's 1 s wait for
# the verb.
STUCK_S = 25
RESULTS: dict[str, dict[str, Any]] = {}


@dataclass
class Layout:
    """What a scenario created, and where the extender put it."""

    namespace: str
    card_of: dict[str, int] = field(default_factory=dict)
    uid_of: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def priority_classes(cluster: Cluster) -> Iterator[None]:
    create(cluster, *(priority_class(name, value) for name, value in PRIORITIES.items()))
    yield
    cluster.kubectl("delete", "priorityclass", *PRIORITIES, check=False)


@pytest.fixture(scope="module", params=["off", "on"])
def mode(request: pytest.FixtureRequest, roles: KubegpuRoles) -> Iterator[str]:
    """``off``: kube-scheduler's own preemption only (no preemptVerb, extender
    --no-preemption); ``on``: the shipped configuration. The module's scenarios run once per
    mode (pytest groups them by this module-scoped parameter)."""
    if request.param == "off":
        restart(roles, "--no-preemption", drop_verb=True)
    yield request.param
    if request.param == "off":
        restart(roles)


def restart(roles: KubegpuRoles, *extender_args: str, drop_verb: bool = False) -> None:
    def without_verb(config: dict[str, Any]) -> None:
        for extender in config["extenders"]:
            extender.pop("preemptVerb", None)

    roles.stop_role("kubegpu-scheduler")
    roles.stop_role("kubegpu-extender")
    roles.start_extender(*extender_args)
    roles.start_scheduler(edit=without_verb if drop_verb else None)


def gpu_pod(
    name: str, namespace: str, priority: str, limits: dict[str, str], cpu_milli: int
) -> dict[str, Any]:
    c = container("main", limits)
    c["resources"]["requests"] = {"cpu": f"{cpu_milli}m", "memory": "16Mi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [c],
            "schedulerName": SCHEDULER,
            "priorityClassName": priority,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "dnsPolicy": "Default",
        },
    }


def share(compute: int) -> dict[str, str]:
    return {MEMORY: "4096", COMPUTE: str(compute), SHARED: "1"}


def place(cluster: Cluster, layout: Layout, manifest: dict[str, Any]) -> None:
    """Create one pod and wait until it is bound, so the next is placed knowing where it went."""
    name = manifest["metadata"]["name"]
    create(cluster, manifest)
    cluster.wait_for(
        f"pod {name} bound",
        lambda: cluster.get("pod", "-n", layout.namespace, name)["spec"].get("nodeName"),
        timeout=60,
    )
    obj = cluster.get("pod", "-n", layout.namespace, name)
    decision = json.loads(obj["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    layout.card_of[name] = min(g["index"] for g in decision["gpus"])
    layout.uid_of[name] = obj["metadata"]["uid"]


def free_cpu_milli(cluster: Cluster) -> int:
    """The node's allocatable CPU less what its pods request (scenarios size requests on it:
    the machine's cores vary)."""
    node = cluster.get("node", NODE_NAME)
    alloc = _milli(node["status"]["allocatable"]["cpu"])
    pods = cluster.get("pods", "-A", "--field-selector", f"spec.nodeName={NODE_NAME}")["items"]
    used = 0
    for p in pods:
        if p["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        for c in p["spec"]["containers"]:
            used += _milli(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
    return alloc - used


def _milli(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def evicted(cluster: Cluster, layout: Layout) -> set[str]:
    """Pods of the layout that are gone or terminating."""
    pods = cluster.get("pods", "-n", layout.namespace)["items"]
    alive = {
        p["metadata"]["name"]
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and p["metadata"]["uid"] == layout.uid_of.get(p["metadata"]["name"])
    }
    return set(layout.uid_of) - alive


def watch_preemptor(
    cluster: Cluster, layout: Layout, name: str, mode: str, expected_victims: set[str]
) -> dict[str, Any]:
    """Run the preemptor to its outcome in ``mode`` and return what happened."""
    if mode == "on":
        wait_running(cluster, layout.namespace, name, timeout=120)
    else:
        time.sleep(STUCK_S)
    obj = cluster.get("pod", "-n", layout.namespace, name)
    ran = phase(cluster, layout.namespace, name) == "Running"
    card = None
    if ran:
        decision = json.loads(obj["metadata"]["annotations"][ALLOCATION_ANNOTATION])
        card = min(g["index"] for g in decision["gpus"])
    events = cluster.get(
        "events", "-n", layout.namespace, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return {
        "evicted": sorted(evicted(cluster, layout)),
        "preemptor_ran": ran,
        "preemptor_card": card,
        "expected_victims": sorted(expected_victims),
        "events": [e.get("message", "")[:300] for e in events],
    }


def record(scenario: str, mode: str, outcome: dict[str, Any]) -> None:
    """Into report.json, beside the other mode's outcome of the same layout."""
    RESULTS.setdefault(scenario, {})[mode] = outcome
    record_figure(
        "preemption: kube-scheduler's own (off) against shipped (on)", scenario, RESULTS[scenario]
    )


def anchor(cluster: Cluster, layout: Layout) -> None:
    """Six of the eight cards taken by a pod as important as every preemptor: never a victim."""
    place(cluster, layout, gpu_pod("anchor", layout.namespace, "e2e-high", {WHOLE: "6"}, 50))


def test_a_share_blocked_by_card_compute(
    cluster: Cluster, roles: KubegpuRoles, namespace: str, priority_classes: None, mode: str
) -> None:
    layout = Layout(namespace)
    anchor(cluster, layout)
    for name, priority, compute in (
        ("a1", "e2e-low", 500),
        ("a2", "e2e-low", 500),
        ("b-low", "e2e-lowest", 600),
        ("b-high", "e2e-high", 400),
    ):
        place(cluster, layout, gpu_pod(name, namespace, priority, share(compute), 50))
    wait_running(cluster, namespace, *layout.card_of)
    x, y = layout.card_of["a1"], layout.card_of["b-low"]
    assert layout.card_of["a2"] == x and layout.card_of["b-high"] == y and x != y, layout

    create(cluster, gpu_pod("urgent", namespace, "e2e-high", share(700), 50))
    outcome = watch_preemptor(cluster, layout, "urgent", mode, {"a1", "a2"})
    record("share blocked by card compute", mode, outcome)
    if mode == "off":
        # kube-scheduler's dry run keeps every pod (its filters pass with all of them present).
        assert outcome["evicted"] == [] and not outcome["preemptor_ran"], outcome
        assert any("expected at least one victim" in e for e in outcome["events"]), outcome
    else:
        assert outcome["evicted"] == ["a1", "a2"], outcome
        assert outcome["preemptor_ran"] and outcome["preemptor_card"] == x, outcome


def test_a_share_where_kube_scheduler_picks_the_wrong_card(
    cluster: Cluster, roles: KubegpuRoles, namespace: str, priority_classes: None, mode: str
) -> None:
    layout = Layout(namespace)
    anchor(cluster, layout)
    # Four shares that leave less CPU than one more of them asks: CPU is short for the
    # preemptor, so kube-scheduler's dry run evicts one pod, the least important.
    cpu = (free_cpu_milli(cluster) - 10) // 4
    assert cpu >= 100, "the node has too little CPU for this scenario"
    for name, priority, compute in (
        ("a1", "e2e-low", 500),
        ("a2", "e2e-low", 500),
        ("b-low", "e2e-lowest", 600),
        ("b-high", "e2e-high", 400),
    ):
        place(cluster, layout, gpu_pod(name, namespace, priority, share(compute), cpu))
    wait_running(cluster, namespace, *layout.card_of)
    x, y = layout.card_of["a1"], layout.card_of["b-low"]
    assert layout.card_of["a2"] == x and layout.card_of["b-high"] == y and x != y, layout

    create(cluster, gpu_pod("urgent", namespace, "e2e-high", share(700), cpu))
    outcome = watch_preemptor(cluster, layout, "urgent", mode, {"a1", "a2"})
    record("share, kube-scheduler's victim on the wrong card", mode, outcome)
    if mode == "off":
        # The 600-milli share went, yet its card keeps 400 used: no room for 700.
        assert outcome["evicted"] == ["b-low"] and not outcome["preemptor_ran"], outcome
    else:
        assert outcome["evicted"] == ["a1", "a2"], outcome
        assert outcome["preemptor_ran"] and outcome["preemptor_card"] == x, outcome


def test_a_whole_gpu_on_a_mixed_node(
    cluster: Cluster, roles: KubegpuRoles, namespace: str, priority_classes: None, mode: str
) -> None:
    layout = Layout(namespace)
    anchor(cluster, layout)
    place(cluster, layout, gpu_pod("notebook", namespace, "e2e-lowest", share(100), 50))
    place(cluster, layout, gpu_pod("trainer", namespace, "e2e-low", {WHOLE: "1"}, 50))
    wait_running(cluster, namespace, *layout.card_of)
    assert layout.card_of["notebook"] != layout.card_of["trainer"], layout

    create(cluster, gpu_pod("urgent", namespace, "e2e-high", {WHOLE: "1"}, 50))
    outcome = watch_preemptor(cluster, layout, "urgent", mode, {"notebook"})
    record("whole GPU on a node of shares and whole GPUs", mode, outcome)
    # One victim either way. The node agent withdraws a card holding shares from
    # nvidia.com/gpu, so kube-scheduler sees the node's GPUs all taken, and the only pod it can
    # count as freeing one is the whole-GPU pod; the share is the less important one.
    if mode == "off":
        assert outcome["evicted"] == ["trainer"], outcome
        assert outcome["preemptor_card"] == layout.card_of["trainer"], outcome
    else:
        assert outcome["evicted"] == ["notebook"], outcome
        assert outcome["preemptor_card"] == layout.card_of["notebook"], outcome
