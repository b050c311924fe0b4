"""Card-level victim choice (kubegpu.sharing.preemption), on nodes built as the extender sees
them: an inventory and the pods holding parts of its cards."""

from __future__ import annotations

from typing import Any

from kubegpu.placement.model import PodRequest
from kubegpu.sharing.accounting import NodeInfo, PodUsage
from kubegpu.sharing.annotations import CardShare, GpuRecord, NodeGpuInventory
from kubegpu.sharing.preemption import (
    Candidate,
    NodeVictims,
    budget_violations,
    pick_node,
    selector_matches,
    victims_on_node,
)

MIB = 81920


def node(name: str = "n1", cards: int = 2, cpu_milli: int = 64000) -> NodeInfo:
    gpus = tuple(GpuRecord(f"GPU-{name}-{i}", i, "A100-SXM4-80GB", MIB) for i in range(cards))
    return NodeInfo(name, cpu_milli, 512 * 1024, NodeGpuInventory(gpus))


def share(
    uid: str, card: int, milli: int, mib: int, *, node_name: str = "n1", cpu: int = 1000
) -> PodUsage:
    return PodUsage(
        uid,
        f"ns/{uid}",
        node_name,
        cpu,
        1024,
        (CardShare(f"GPU-{node_name}-{card}", card, milli, mib),),
    )


def whole(uid: str, *cards: int, node_name: str = "n1") -> PodUsage:
    return PodUsage(
        uid,
        f"ns/{uid}",
        node_name,
        1000,
        1024,
        tuple(CardShare(f"GPU-{node_name}-{c}", c, 1000, MIB) for c in cards),
    )


def cand(usage: PodUsage, priority: int, started: float = 0.0, pdb: bool = False) -> Candidate:
    return Candidate(usage, priority, started, pdb)


def share_request(milli: int, mib: int | None = None, cpu: int = 1000) -> PodRequest:
    return PodRequest(cpu, 1024, 1, milli, mib)


def test_two_pods_on_one_card_go_when_nothing_smaller_frees_a_card() -> None:
    a1, a2 = share("a1", 0, 500, 20000), share("a2", 0, 500, 20000)
    b_low, b_high = share("b-low", 1, 600, 20000), share("b-high", 1, 400, 20000)
    usages = [a1, a2, b_low, b_high]
    candidates = [cand(a1, 10), cand(a2, 10), cand(b_low, 5)]  # b-high outranks the pod
    found = victims_on_node(node(), usages, candidates, share_request(700))
    assert found is not None
    assert set(found.uids) == {"a1", "a2"}
    assert found.cards == (0,)


def test_one_victim_is_enough_when_it_frees_the_card() -> None:
    a1, a2 = share("a1", 0, 500, 20000), share("a2", 0, 500, 20000)
    b1, b2 = share("b1", 1, 300, 20000), share("b2", 1, 700, 20000)
    candidates = [cand(u, 10) for u in (a1, a2, b1, b2)]
    found = victims_on_node(node(), [a1, a2, b1, b2], candidates, share_request(650))
    assert found is not None and found.uids == ("b2",)


def test_memory_is_what_frees_the_card_for_a_memory_bound_share() -> None:
    # Compute is plentiful on card 0; its memory is held by two small-compute pods.
    a1, a2 = share("a1", 0, 100, 40000), share("a2", 0, 100, 40000)
    b1 = share("b1", 1, 900, 10000)
    candidates = [cand(u, 1) for u in (a1, a2, b1)]
    found = victims_on_node(node(), [a1, a2, b1], candidates, share_request(200, 30000))
    assert found is not None
    assert len(found.uids) == 1 and found.uids[0] in {"a1", "a2"}
    assert found.cards == (0,)


def test_lower_priorities_go_first_among_equal_sets() -> None:
    a1, b1 = share("a1", 0, 1000, 1000), share("b1", 1, 1000, 1000)
    found = victims_on_node(node(), [a1, b1], [cand(a1, 50), cand(b1, 7)], share_request(500))
    assert found is not None and found.uids == ("b1",)


def test_budget_violations_weigh_before_the_number_of_victims() -> None:
    a1 = share("a1", 0, 1000, 1000)
    b1, b2 = share("b1", 1, 500, 1000), share("b2", 1, 500, 1000)
    candidates = [cand(a1, 1, pdb=True), cand(b1, 1), cand(b2, 1)]
    found = victims_on_node(node(), [a1, b1, b2], candidates, share_request(800))
    assert found is not None
    assert set(found.uids) == {"b1", "b2"} and found.budget_violations == 0


def test_no_victims_when_only_higher_priority_pods_block() -> None:
    a1, b1 = share("a1", 0, 600, 1000), share("b1", 1, 600, 1000)
    assert victims_on_node(node(), [a1, b1], [], share_request(700)) is None
    # A candidate that cannot free enough on its card is no help either.
    high = share("high", 0, 500, 1000)
    low = share("low", 0, 300, 1000)
    usages = [high, low, share("b2", 1, 900, 1000)]
    assert victims_on_node(node(), usages, [cand(low, 1)], share_request(700)) is None


def test_a_pod_that_fits_needs_no_victims() -> None:
    a1 = share("a1", 0, 300, 1000)
    found = victims_on_node(node(), [a1], [cand(a1, 1)], share_request(500))
    assert found == NodeVictims("n1", (), 0, ())


def test_whole_gpus_take_the_cards_that_cost_fewest_evictions() -> None:
    w0 = whole("w0", 0)
    s1, s2, s3 = share("s1", 1, 300, 100), share("s2", 1, 300, 100), share("s3", 1, 300, 100)
    w23 = whole("w23", 2, 3)
    usages = [w0, s1, s2, s3, w23]
    candidates = [cand(u, 1) for u in usages]
    found = victims_on_node(node(cards=4), usages, candidates, PodRequest(1000, 1024, 1, 1000))
    assert found is not None and found.uids == ("w0",) and found.cards == (0,)
    two = victims_on_node(node(cards=4), usages, candidates, PodRequest(1000, 1024, 2, 1000))
    assert two is not None and set(two.uids) == {"w23"} and set(two.cards) == {2, 3}


def test_a_card_with_a_higher_priority_pod_on_it_is_never_freed_for_whole_gpus() -> None:
    w0, w1 = whole("w0", 0), whole("w1", 1)
    found = victims_on_node(node(), [w0, w1], [cand(w1, 1)], PodRequest(1000, 1024, 2, 1000))
    assert found is None


def test_node_cpu_short_adds_the_least_important_pod() -> None:
    a1 = share("a1", 0, 200, 100, cpu=3000)
    b1 = share("b1", 1, 200, 100, cpu=3000)
    candidates = [cand(a1, 5, started=100.0), cand(b1, 5, started=200.0)]
    found = victims_on_node(
        node(cpu_milli=6000), [a1, b1], candidates, share_request(300, cpu=2000)
    )
    assert found is not None and found.uids == ("b1",)  # the newer of two equals


def test_pick_node_follows_kube_schedulers_order() -> None:
    low = cand(share("x", 0, 1, 1), 1)
    mid = cand(share("y", 0, 1, 1), 5)
    options = [
        NodeVictims("b", (mid,), 0, (0,)),
        NodeVictims("a", (low, low), 0, (0,)),
        NodeVictims("c", (low,), 1, (0,)),
    ]
    chosen = pick_node(options)
    assert chosen is not None and chosen.node == "a"  # no violation, lowest top priority
    assert pick_node([NodeVictims("a", (), 0, ())]) is None


def _pod(name: str, labels: dict[str, str], namespace: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": name, "labels": labels}}


def _budget(
    allowed: int, selector: dict[str, Any], disrupted: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "pdb", "namespace": "ns"},
        "spec": {"selector": selector},
        "status": {"disruptionsAllowed": allowed, "disruptedPods": disrupted or {}},
    }


def test_budget_violations_count_as_kube_scheduler_counts_them() -> None:
    pods = [_pod("p1", {"app": "x"}), _pod("p2", {"app": "x"}), _pod("p3", {"app": "y"})]
    budget = _budget(1, {"matchLabels": {"app": "x"}})
    assert budget_violations(pods, [budget]) == {"p2"}
    # Already disrupted: not counted again.
    assert budget_violations(pods, [_budget(0, {"matchLabels": {"app": "x"}}, {"p1": "t"})]) == {
        "p2"
    }
    # Other namespace and empty selector: never matched.
    assert budget_violations([_pod("p1", {"app": "x"}, "other")], [budget]) == set()
    assert budget_violations(pods, [_budget(0, {})]) == set()


def test_selector_expressions() -> None:
    labels = {"tier": "batch", "team": "a"}
    assert selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["batch"]}]}, labels
    )
    assert not selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["batch"]}]}, labels
    )
    assert selector_matches({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, labels)
    assert not selector_matches(
        {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}, labels
    )
    assert not selector_matches({"matchLabels": {"team": "b"}}, labels)
