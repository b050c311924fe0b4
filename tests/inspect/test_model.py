"""The inspect report built from the mixed cluster's JSON (pure: no server)."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from kubegpu.inspect.model import ReadCache, build_report
from kubegpu.inspect.reading import gpu_node_names
from kubegpu.inspect.render import load_schema, report_to_json
from kubegpu.inspect.report import (
    Filters,
    InspectReport,
    InventoryState,
    NodeView,
    PendingState,
    PlacedBy,
    UnplacedReason,
    UsageState,
    WarningKind,
)
from kubegpu.inspect.usage import NodeUsage, UsageResult
from tests.inspect import mixed_cluster as mc


def report(**kwargs: object) -> InspectReport:
    return build_report(mc.nodes(), mc.pods(), **kwargs)  # type: ignore[arg-type]


def node(r: InspectReport, name: str) -> NodeView:
    return next(n for n in r.nodes if n.name == name)


def test_cpu_only_nodes_are_counted_not_listed() -> None:
    r = report()
    assert [n.name for n in r.nodes] == ["a100", "legacy", "mixed", "sick"]
    assert r.cpu_only_nodes == 1


def test_shared_pods_are_charged_on_the_card_their_decision_names() -> None:
    a100 = node(report(), "a100")
    card0, card1 = a100.cards[0], a100.cards[1]
    assert [p.key for p in card0.pods] == ["ml/train-a", "ml/train-b"]
    assert card0.allocated_memory_mib == 20480 + 30720
    assert card0.allocated_compute_milli == 300 + 500
    assert card0.free_memory_mib == mc.A100_MIB - 51200
    assert [p.key for p in card1.pods] == ["web/infer-c"]
    assert (card1.allocated_memory_mib, card1.allocated_compute_milli) == (10240, 250)
    assert all(p.shared for p in card0.pods + card1.pods)


def test_a_whole_gpu_pod_with_a_decision_holds_each_of_its_cards_entirely() -> None:
    a100 = node(report(), "a100")
    for index in (2, 3):
        card = a100.cards[index]
        assert [p.key for p in card.pods] == ["ml/whole-e"]
        assert card.allocated_memory_mib == mc.A100_MIB
        assert card.allocated_compute_milli == 1000
        assert not card.pods[0].shared


def test_a_plain_gpu_pod_without_a_decision_counts_on_the_node_without_a_card() -> None:
    a100 = node(report(), "a100")
    unplaced = {u.key: u for u in a100.unplaced}
    whole_d = unplaced["ml/whole-d"]
    assert whole_d.reason is UnplacedReason.NO_DECISION
    assert whole_d.whole_gpus == 1 and whole_d.compute_milli == 1000
    # Charged like the extender charges it: one free A100's memory.
    assert whole_d.memory_mib == mc.A100_MIB
    assert not any(p.key == "ml/whole-d" for c in a100.cards for p in c.pods)
    assert a100.totals.unplaced_whole_gpus == 1


def kubelet_says(node_name: str, pods: dict[tuple[str, str], frozenset[str]]) -> object:
    return {
        node_name: UsageResult(node_name, "http://x/metrics", NodeUsage(pod_cards=pods)),
    }


def test_the_kubelets_word_places_a_pod_without_a_decision_on_its_card() -> None:
    card5, card6 = mc.uuid("a100", 5), mc.uuid("a100", 6)
    r = report(usage=kubelet_says("a100", {("ml", "whole-d"): frozenset({card6})}))
    a100 = node(r, "a100")
    assert "ml/whole-d" not in {u.key for u in a100.unplaced}
    card = next(c for c in a100.cards if c.uuid == card6)
    (whole_d,) = card.pods
    assert whole_d.key == "ml/whole-d"
    assert whole_d.placed_by is PlacedBy.KUBELET
    assert (whole_d.shared, whole_d.memory_mib, whole_d.compute_milli) == (False, mc.A100_MIB, 1000)
    assert (card.allocated_memory_mib, card.allocated_compute_milli) == (mc.A100_MIB, 1000)
    assert a100.totals.unplaced_whole_gpus == 0
    # The same memory and compute as when it was assumed, now on a named card: the other free
    # cards (5 and 7) stay free.
    before = node(report(), "a100").totals
    assert a100.totals.allocated_memory_mib == before.allocated_memory_mib
    assert a100.totals.free_gpus == 2
    assert not next(c for c in a100.cards if c.uuid == card5).pods
    doc = report_to_json(r)
    jsonschema.validate(doc, load_schema())
    placed = [
        p for n in doc["nodes"] for c in n["cards"] for p in c["pods"] if p["name"] == "whole-d"
    ]
    assert [p["placedBy"] for p in placed] == ["kubelet"]
    decided = [p["placedBy"] for c in doc["nodes"][0]["cards"] for p in c["pods"]]
    assert set(decided) == {"decision", "kubelet"}


def test_a_card_the_kubelet_names_that_the_node_does_not_publish_places_nothing() -> None:
    r = report(usage=kubelet_says("a100", {("ml", "whole-d"): frozenset({"GPU-elsewhere"})}))
    a100 = node(r, "a100")
    assert {u.key: u.reason for u in a100.unplaced}["ml/whole-d"] is UnplacedReason.NO_DECISION
    assert not any(p.placed_by is PlacedBy.KUBELET for c in a100.cards for p in c.pods)


def test_the_kubelet_does_not_move_a_pod_its_decision_places() -> None:
    # train-a's decision names card 0; the kubelet's word is only for pods without one.
    r = report(usage=kubelet_says("a100", {("ml", "train-a"): frozenset({mc.uuid("a100", 7)})}))
    a100 = node(r, "a100")
    assert [p.key for p in a100.cards[0].pods] == ["ml/train-a", "ml/train-b"]
    assert not a100.cards[7].pods


def test_node_totals_add_cards_and_pods_without_cards() -> None:
    a100 = node(report(), "a100")
    t = a100.totals
    on_cards_mib = 20480 + 30720 + 10240 + 2 * mc.A100_MIB + 8192
    assert t.gpus == 8 and t.healthy_gpus == 8
    assert t.memory_mib == 8 * mc.A100_MIB
    # + whole-d (one A100 assumed) + ghost's 1 GiB on a card the node does not have
    assert t.allocated_memory_mib == on_cards_mib + mc.A100_MIB + 1024
    assert t.allocated_compute_milli == 300 + 500 + 250 + 2000 + 100 + 1000 + 100
    # Cards 5, 6, 7 have nothing decided; whole-d is assumed to take one of them.
    assert t.free_gpus == 2
    assert t.largest_free_memory_mib == mc.A100_MIB
    assert t.pods == 7


def test_cluster_totals_sum_the_listed_nodes() -> None:
    r = report()
    assert r.totals.nodes == 4
    assert r.totals.gpus == 8 + 4 + 2 + 4  # legacy counts its advertised GPUs
    assert r.totals.healthy_gpus == r.totals.gpus - 1
    assert r.totals.memory_mib == sum(n.totals.memory_mib for n in r.nodes)
    assert r.totals.allocated_memory_mib == sum(n.totals.allocated_memory_mib for n in r.nodes)
    assert r.totals.allocated_compute_milli == sum(
        n.totals.allocated_compute_milli for n in r.nodes
    )
    assert r.totals.unplaced_whole_gpus == 2  # whole-d and legacy-job


def test_a_mixed_node_lists_each_model_with_its_own_memory() -> None:
    mixed = node(report(), "mixed")
    assert [(c.model, c.memory_mib) for c in mixed.cards] == [
        (mc.V100, mc.V100_MIB),
        (mc.V100, mc.V100_MIB),
        (mc.T4, mc.T4_MIB),
        (mc.T4, mc.T4_MIB),
    ]
    assert mixed.totals.memory_mib == 2 * mc.V100_MIB + 2 * mc.T4_MIB
    assert mixed.cards[0].allocated_memory_mib == mc.V100_MIB
    assert mixed.cards[2].allocated_memory_mib == 4096


def test_an_overcommitted_card_is_flagged_and_warned_about() -> None:
    r = report()
    card3 = node(r, "mixed").cards[3]
    assert card3.allocated_memory_mib == 10240 + 6144 > card3.memory_mib
    assert card3.overcommitted
    kinds = [(w.kind, w.node, w.uuid) for w in r.warnings]
    assert (WarningKind.OVERCOMMITTED_CARD, "mixed", card3.uuid) in kinds
    assert not any(c.overcommitted for n in r.nodes for c in n.cards if c is not card3)


def test_an_unhealthy_card_holding_pods_is_a_warning() -> None:
    r = report()
    sick = node(r, "sick")
    assert [c.healthy for c in sick.cards] == [True, False]
    assert sick.totals.healthy_gpus == 1
    warning = next(w for w in r.warnings if w.kind is WarningKind.UNHEALTHY_CARD_IN_USE)
    assert warning.uuid == sick.cards[1].uuid and "ml/stuck" in warning.message
    # An unhealthy card offers nothing, so the largest free block is on card 0.
    assert sick.totals.largest_free_memory_mib == mc.A10_MIB


def test_a_decision_for_a_card_the_node_lacks_is_unplaced_and_warned_about() -> None:
    r = report()
    a100 = node(r, "a100")
    ghost = next(u for u in a100.unplaced if u.key == "web/ghost")
    assert ghost.reason is UnplacedReason.UNKNOWN_CARD
    assert (ghost.memory_mib, ghost.compute_milli) == (1024, 100)
    warning = next(w for w in r.warnings if w.kind is WarningKind.UNKNOWN_CARD)
    assert warning.pod == "web/ghost" and warning.uuid == "GPU-not-on-this-node"


def test_a_node_without_inventory_shows_advertised_gpus_and_its_pods() -> None:
    r = report()
    legacy = node(r, "legacy")
    assert legacy.inventory is InventoryState.MISSING
    assert legacy.cards == ()
    assert legacy.advertised_gpus == 4 and legacy.totals.gpus == 4
    assert [(u.key, u.reason) for u in legacy.unplaced] == [
        ("ml/legacy-job", UnplacedReason.NO_INVENTORY)
    ]
    assert legacy.totals.free_gpus == 3
    assert any(w.kind is WarningKind.MISSING_INVENTORY and w.node == "legacy" for w in r.warnings)


def test_an_unreadable_inventory_is_reported_not_raised() -> None:
    nodes = mc.nodes()
    nodes[0]["metadata"]["annotations"]["kubegpu.io/gpu-inventory"] = "{not json"
    r = build_report(nodes, mc.pods())
    a100 = node(r, "a100")
    assert a100.inventory is InventoryState.INVALID and "not JSON" in a100.inventory_error
    assert {u.reason for u in a100.unplaced} == {UnplacedReason.NO_INVENTORY}
    assert any(w.kind is WarningKind.INVALID_INVENTORY for w in r.warnings)


def test_pending_lists_decided_unbound_and_unscheduled_gpu_pods() -> None:
    r = report()
    pending = {p.key: p for p in r.pending}
    assert set(pending) == {"ml/binding", "ml/queued"}
    binding = pending["ml/binding"]
    assert binding.state is PendingState.BINDING and binding.node == "a100"
    assert [(c.index, c.memory_mib, c.compute_milli) for c in binding.cards] == [(4, 8192, 100)]
    # Charged on its card meanwhile, marked as not bound.
    on_card4 = node(r, "a100").cards[4].pods
    assert [(p.key, p.bound) for p in on_card4] == [("ml/binding", False)]
    queued = pending["ml/queued"]
    assert queued.state is PendingState.UNSCHEDULED and queued.whole_gpus == 1
    assert queued.node == ""


def test_a_pod_the_scheduler_found_no_node_for_is_pending_refused_not_unscheduled() -> None:
    # The demo's summary counts these as refused; inspect must not call them something else.
    pods = mc.pods()
    queued = next(p for p in pods if p["metadata"]["name"] == "queued")
    queued["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "x"}
        ],
    }
    r = build_report(mc.nodes(), pods)
    (refused,) = [p for p in r.pending if p.key == "ml/queued"]
    assert refused.state is PendingState.REFUSED and refused.node == ""


def test_a_bound_pod_whose_containers_have_not_started_is_pending_starting() -> None:
    pods = mc.pods()
    train_a = next(p for p in pods if p["metadata"]["name"] == "train-a")
    train_a["status"] = {"phase": "Pending"}
    r = build_report(mc.nodes(), pods)
    starting = [p for p in r.pending if p.state is PendingState.STARTING]
    assert [p.key for p in starting] == ["ml/train-a"]


def test_finished_pods_hold_nothing() -> None:
    r = report()
    assert not any(p.name == "done" for n in r.nodes for c in n.cards for p in c.pods)
    assert node(r, "a100").cards[5].pods == ()


def test_a_decision_for_another_node_is_a_warning_and_the_pod_holds_no_card() -> None:
    pods = mc.pods()
    stuck = next(p for p in pods if p["metadata"]["name"] == "stuck")
    stuck["spec"]["nodeName"] = "mixed"
    r = build_report(mc.nodes(), pods)
    assert node(r, "sick").cards[1].pods == ()
    warning = next(w for w in r.warnings if w.kind is WarningKind.DECISION_NODE_MISMATCH)
    assert warning.pod == "ml/stuck" and warning.node == "mixed"


ALL_GPU_NODES = [n.name for n in report().nodes]


@pytest.mark.parametrize(
    ("filters", "nodes"),
    [
        pytest.param(Filters(nodes=("mixed",)), ["mixed"], id="one-node"),
        pytest.param(Filters(nodes=("sick", "a100")), ["a100", "sick"], id="two-nodes"),
        # Every node, also those with none of the namespace's pods: their cards are free to it.
        pytest.param(Filters(namespace="web"), ALL_GPU_NODES, id="namespace"),
        pytest.param(Filters(namespace="nobody-here"), ALL_GPU_NODES, id="empty-namespace"),
        pytest.param(Filters(nodes=("nope",)), [], id="unknown-node"),
    ],
)
def test_filters_choose_the_nodes_shown(filters: Filters, nodes: list[str]) -> None:
    r = report(filters=filters)
    assert [n.name for n in r.nodes] == nodes
    assert r.totals.nodes == len(nodes)
    jsonschema.validate(report_to_json(r), load_schema())


def test_a_namespace_filter_narrows_pods_but_not_card_figures() -> None:
    full = node(report(), "a100")
    web = node(report(filters=Filters(namespace="web")), "a100")
    assert [p.key for c in web.cards for p in c.pods] == ["web/infer-c"]
    assert [u.key for u in web.unplaced] == ["web/ghost"]
    assert [c.allocated_memory_mib for c in web.cards] == [
        c.allocated_memory_mib for c in full.cards
    ]
    r = report(filters=Filters(namespace="web"))
    assert all(w.pod.startswith("web/") or not w.pod for w in r.warnings)
    assert [p.key for p in r.pending] == []


def test_a_node_filter_keeps_only_that_nodes_pending_pods_and_warnings() -> None:
    r = report(filters=Filters(nodes=("a100",)))
    assert [p.key for p in r.pending] == ["ml/binding"]
    assert {w.node for w in r.warnings} == {"a100"}


def test_exporter_usage_joins_cards_and_pods_by_uuid() -> None:
    card0 = mc.uuid("a100", 0)
    usage = {
        "a100": UsageResult(
            "a100",
            "http://x/metrics",
            NodeUsage(
                gpu_memory_used_mib={card0: 40000},
                gpu_utilization_ratio={card0: 0.5},
                pod_memory_used_mib={("ml", "train-a", card0): 25000},
                pod_over_share={("ml", "train-a", card0): True, ("ml", "train-b", card0): False},
            ),
        ),
        "mixed": UsageResult("mixed", "http://y/metrics", error="timed out"),
    }
    r = report(usage=usage)
    a100 = node(r, "a100")
    assert r.usage is UsageState.OK
    assert a100.usage is UsageState.OK
    assert a100.cards[0].used_memory_mib == 40000
    assert a100.cards[0].utilization_ratio == 0.5
    assert a100.cards[1].used_memory_mib is None
    assert a100.totals.used_memory_mib == 40000
    train_a = a100.cards[0].pods[0]
    assert (train_a.used_memory_mib, train_a.over_share) == (25000, True)
    mixed = node(r, "mixed")
    assert mixed.usage is UsageState.UNAVAILABLE and mixed.usage_error == "timed out"
    assert mixed.totals.used_memory_mib is None
    assert node(r, "sick").usage is UsageState.OFF  # not asked
    over = [w for w in r.warnings if w.kind is WarningKind.OVER_SHARE]
    assert [w.pod for w in over] == ["ml/train-a"]
    jsonschema.validate(report_to_json(r), load_schema())


def test_the_json_document_validates_and_carries_the_model_values() -> None:
    r = report(generated_at="2026-11-22T05:00:00Z")
    doc = report_to_json(r)
    jsonschema.validate(doc, load_schema())
    a100 = next(n for n in doc["nodes"] if n["name"] == "a100")
    assert a100["cards"][0]["allocatedMemoryMiB"] == 51200
    assert [p["name"] for p in a100["cards"][0]["pods"]] == ["train-a", "train-b"]
    assert a100["cards"][0]["usedMemoryMiB"] is None
    assert doc["totals"]["allocatedComputeMilli"] == r.totals.allocated_compute_milli
    assert {w["kind"] for w in doc["warnings"]} == {w.kind.value for w in r.warnings}


def test_the_schema_rejects_a_document_missing_a_card_field() -> None:
    doc = report_to_json(report())
    del doc["nodes"][0]["cards"][0]["allocatedMemoryMiB"]
    with pytest.raises(jsonschema.ValidationError, match="allocatedMemoryMiB"):
        jsonschema.validate(doc, load_schema())


def test_the_schema_is_itself_a_valid_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(load_schema())


def versioned(objects: list[dict[str, Any]], version: str) -> list[dict[str, Any]]:
    for obj in objects:
        obj["metadata"]["resourceVersion"] = version
    return objects


def test_a_warm_cache_gives_the_same_report_and_rereads_changed_objects() -> None:
    cache = ReadCache()
    nodes, pods = versioned(mc.nodes(), "1"), versioned(mc.pods(), "1")
    cold = build_report(nodes, pods, cache=cache)
    assert len(cache.pods) == len(pods) and len(cache.nodes) == len(nodes)
    assert build_report(nodes, pods, cache=cache) == cold
    # A pod changes (new resourceVersion): its new decision is read, not the cached one.
    pods = versioned(mc.pods(), "1")
    moved = next(p for p in pods if p["metadata"]["name"] == "infer-c")
    replacement = mc.shared_pod("infer-c", "web", "a100", 6, 2048, 100)
    moved["metadata"]["annotations"] = replacement["metadata"]["annotations"]
    moved["spec"] = replacement["spec"]
    moved["metadata"]["resourceVersion"] = "2"
    warm = build_report(nodes, pods, cache=cache)
    assert warm == build_report(nodes, pods)
    a100 = node(warm, "a100")
    assert a100.cards[1].pods == () and [p.key for p in a100.cards[6].pods] == ["web/infer-c"]
    # Deleted objects leave the cache.
    build_report(nodes[:1], pods[:2], cache=cache)
    assert len(cache.nodes) == 1 and len(cache.pods) == 2


def test_usage_is_asked_of_nodes_that_publish_or_advertise_gpus() -> None:
    assert gpu_node_names(mc.nodes()) == ["a100", "mixed", "sick", "legacy"]
    assert gpu_node_names(mc.nodes(), Filters(nodes=("sick", "cpu"))) == ["sick"]
