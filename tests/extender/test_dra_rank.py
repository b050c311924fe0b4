"""Ranking DRA nodes: the pure translation (slice + claims -> card state, claims -> demand) and
the ranking, which must pick the node the simulator's engine picks on the same state."""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import Any

import pytest

from kubegpu.core.dra import AllocatedDevice, ClaimRef
from kubegpu.core.dra_cluster import (
    DeviceRequest,
    DraClaim,
    NodeSlices,
    SliceDevice,
    newest_devices,
)
from kubegpu.dra.slices import pool_name
from kubegpu.extender.dra_rank import (
    DemandError,
    DraRanker,
    card_states,
    dra_demand,
    pod_claim_names,
)
from kubegpu.extender.dra_view import FakeDraCluster
from kubegpu.extender.scheduler import GpuScheduler
from kubegpu.kube.resource_claims import claim_from_object
from kubegpu.kube.resource_slices import slice_devices
from kubegpu.placement.device_order import CardChoice, DeviceOrderEngine
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.placement.policies import get_policy
from kubegpu.sharing.accounting import PodUsage
from tests.extender.dra_cluster import (
    DRIVER,
    GIB,
    NodeView,
    claim,
    dra_pod,
    node_slice,
    share_request,
    share_result,
    whole_request,
    whole_result,
)
from tests.json_mutants import paths, replaced

MIB = 2**20
A100 = "NVIDIA-A100-SXM4-80GB"  # model_key of the product name


def devices(node: str, cards: int = 4, **kw: Any) -> tuple[SliceDevice, ...]:
    decoded = slice_devices(node_slice(node, cards, **kw), DRIVER)
    assert decoded is not None
    return decoded.devices


def allocated(*objs: dict[str, Any]) -> list[AllocatedDevice]:
    return [d for obj in objs for d in claim_from_object(obj, DRIVER).devices]


# ---------------------------------------------------------------- slice + claims -> card state


def test_a_slice_decodes_into_its_devices_as_the_driver_wrote_them() -> None:
    decoded = slice_devices(node_slice("n1", 2, generation=7), DRIVER)
    assert decoded == NodeSlices(
        "n1",
        pool_name("n1"),
        7,
        tuple(
            SliceDevice("n1", pool_name("n1"), f"gpu-{i}", 80 * GIB, 1000, A100) for i in range(2)
        ),
    )
    assert slice_devices(node_slice("n1", 2), "other.example.com") is None


def test_an_unhealthy_gpu_is_a_tainted_device() -> None:
    decoded = slice_devices(node_slice("n1", 2, unhealthy={"GPU-01": "xid 48"}), DRIVER)
    assert decoded is not None
    assert [d.tainted for d in decoded.devices] == [False, True]


CARD_CASES = {
    "nothing allocated": ([], [(0, 1000, 81920), (1, 1000, 81920)]),
    "a share consumes its memory and compute": (
        [share_result("n1", 0, "20Gi", "250")],
        [(0, 750, 61440), (1, 1000, 81920)],
    ),
    "two shares on one card add up": (
        [share_result("n1", 1, "20Gi", "250"), share_result("n1", 1, "40Gi", "500", "t")],
        [(0, 1000, 81920), (1, 250, 20480)],
    ),
    "a result without consumed capacity takes the whole card": (
        [whole_result("n1", 0)],
        [(0, 0, 0), (1, 1000, 81920)],
    ),
    "results of another node's pool are not this node's": (
        [share_result("n2", 0, "20Gi", "250")],
        [(0, 1000, 81920), (1, 1000, 81920)],
    ),
}


@pytest.mark.parametrize("results, expected", CARD_CASES.values(), ids=CARD_CASES.keys())
def test_card_state_from_the_slice_and_the_allocated_claims(
    results: list[dict[str, Any]], expected: list[tuple[int, int, int]]
) -> None:
    state = card_states(devices("n1", 2), allocated(claim("c", results=results)))
    assert state == tuple(GpuState(i, milli, mib, A100, 81920) for i, milli, mib in expected)


def test_a_tainted_card_has_nothing_free() -> None:
    state = card_states(devices("n1", 2, unhealthy={"GPU-00": "xid"}), [])
    assert state == (GpuState(0, 0, 0, A100, 81920), GpuState(1, 1000, 81920, A100, 81920))


# ---------------------------------------------------------------- claims -> demand

REF = ClaimRef("default", "c", "uid-c")

CLAIM_CASES = {
    "whole card": (
        claim("c", [whole_request(2)]),
        DraClaim(REF, (DeviceRequest("gpu", 2),)),
    ),
    "share by memory and compute": (
        claim("c", [share_request("20Gi", "250")]),
        DraClaim(REF, (DeviceRequest("gpu", 1, 20 * GIB, 250),)),
    ),
    "another driver's class is not ours": (
        claim("c", [{"name": "x", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]),
        DraClaim(REF),
    ),
    "allocated, with its results": (
        claim("c", [whole_request()], results=[whole_result("n1", 3)]),
        DraClaim(
            REF,
            (DeviceRequest("gpu", 1),),
            allocated=True,
            devices=(AllocatedDevice("gpu", pool_name("n1"), "gpu-3"),),
        ),
    ),
    "firstAvailable of our classes cannot be ranked": (
        claim(
            "c",
            [{"name": "g", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.kubegpu.io"}]}],
        ),
        DraClaim(REF, problem="resourceclaim default/c: request g: firstAvailable is not ranked"),
    ),
    "allocationMode All cannot be ranked": (
        claim(
            "c",
            [
                {
                    "name": "g",
                    "exactly": {"deviceClassName": "gpu.kubegpu.io", "allocationMode": "All"},
                }
            ],
        ),
        DraClaim(
            REF, problem="resourceclaim default/c: request g: allocationMode All is not ranked"
        ),
    ),
    "a capacity that is not an object names the request": (
        claim(
            "c",
            [
                {
                    "name": "g",
                    "exactly": {"deviceClassName": "gpu-share.kubegpu.io", "capacity": "4Gi"},
                }
            ],
        ),
        DraClaim(
            REF, problem="resourceclaim default/c: request g: capacity.requests is not an object"
        ),
    ),
    "a bad quantity names the request": (
        claim("c", [share_request("lots", "250")]),
        DraClaim(REF, problem="resourceclaim default/c: 'lots' is not a Kubernetes quantity"),
    ),
}


@pytest.mark.parametrize("obj, expected", CLAIM_CASES.values(), ids=CLAIM_CASES.keys())
def test_a_claim_decodes_into_what_it_asks_of_our_driver(
    obj: dict[str, Any], expected: DraClaim
) -> None:
    assert claim_from_object(obj, DRIVER) == expected


def _claim(*requests: DeviceRequest, allocated: bool = False, problem: str = "") -> DraClaim:
    return DraClaim(REF, requests, allocated, (), problem)


DEMAND_CASES = {
    "whole cards add up across claims": (
        [_claim(DeviceRequest("a", 2)), _claim(DeviceRequest("b", 1))],
        PodRequest(500, 1024, 3, 1000),
    ),
    "one share": (
        [_claim(DeviceRequest("a", 1, 20 * GIB, 250))],
        PodRequest(500, 1024, 1, 250, 20480),
    ),
    "a share naming no compute is charged the whole card": (
        [_claim(DeviceRequest("a", 1, 20 * GIB, None))],
        PodRequest(500, 1024, 1, 1000),
    ),
    "a share naming no memory is not memory-bound": (
        [_claim(DeviceRequest("a", 1, None, 300))],
        PodRequest(500, 1024, 1, 300, None),
    ),
    "an allocated claim asks for nothing more": (
        [_claim(DeviceRequest("a", 1), allocated=True)],
        None,
    ),
    "no request of ours": ([_claim()], None),
}


@pytest.mark.parametrize("claims, expected", DEMAND_CASES.values(), ids=DEMAND_CASES.keys())
def test_the_demand_of_a_pods_claims(claims: list[DraClaim], expected: PodRequest | None) -> None:
    assert dra_demand(claims, 500, 1024) == expected


@pytest.mark.parametrize(
    "claims, why",
    [
        ([_claim(DeviceRequest("a", 2, GIB, 100))], "2 share(s) and 0 whole"),
        (
            [_claim(DeviceRequest("a", 1, GIB, 100), DeviceRequest("b", 1))],
            "1 share(s) and 1 whole",
        ),
        ([_claim(problem="resourceclaim default/c: bad")], "resourceclaim default/c: bad"),
    ],
    ids=["two shares", "a share beside a whole card", "an unreadable claim"],
)
def test_a_demand_one_request_cannot_express_says_why(claims: list[DraClaim], why: str) -> None:
    with pytest.raises(DemandError, match=re.escape(why)):
        dra_demand(claims, 500, 1024)


POD_CLAIMS_CASES = {
    "named directly": (dra_pod("p", {"gpu": "mine"}), (("mine",), ())),
    "made from a template, named in the status": (
        dra_pod("p", {}, templates={"gpu": "p-gpu-x7"}),
        (("p-gpu-x7",), ()),
    ),
    "made from a template, not named yet": (
        dra_pod("p", {}, templates={"gpu": None}),
        ((), ("gpu",)),
    ),
}


@pytest.mark.parametrize("pod, expected", POD_CLAIMS_CASES.values(), ids=POD_CLAIMS_CASES.keys())
def test_the_claims_a_pod_names(
    pod: dict[str, Any], expected: tuple[tuple[str, ...], tuple[str, ...]]
) -> None:
    found = pod_claim_names(pod)
    assert (found.names, found.unknown) == expected


def test_a_status_entry_without_a_name_means_no_claim_was_needed() -> None:
    pod = dra_pod("p", {}, templates={"gpu": None})
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpu"}]
    assert pod_claim_names(pod).names == () and pod_claim_names(pod).unknown == ()


# ---------------------------------------------------------------- the ranking

# A target workload of shares and whole cards, so our policy's waste and FGD keys both bind.
WORKLOAD = TypicalWorkload.from_classes(
    [(1000, 500, 1, "")] * 5 + [(1000, 300, 1, "")] * 3 + [(2000, 1000, 1, "")] * 2,
    popularity_percent=100.0,
)


def ranked_cluster() -> tuple[FakeDraCluster, NodeView]:
    """Five DRA nodes of 4 cards in different states, one plain node without a slice."""
    dra = FakeDraCluster()
    allocations = {
        "dra-a": [share_result("dra-a", 0, "40Gi", "500"), whole_result("dra-a", 1)],
        "dra-b": [
            share_result("dra-b", 0, "24Gi", "300"),
            share_result("dra-b", 1, "16Gi", "200", "t"),
        ],
        "dra-c": [whole_result("dra-c", i) for i in range(3)],
        "dra-d": [],
        "dra-e": [share_result("dra-e", 2, "56Gi", "700")],
    }
    for node, results in allocations.items():
        decoded = slice_devices(node_slice(node, 4), DRIVER)
        assert decoded is not None
        dra.publish(node, decoded)
        dra.put_claim(claim_from_object(claim(f"held-{node}", [], results=results), DRIVER))
    cpu = {
        "dra-a": 32000,
        "dra-b": 32000,
        "dra-c": 8000,
        "dra-d": 64000,
        "dra-e": 16000,
        "plain": 64000,
    }
    used = {"dra-c": [PodUsage("u1", "default/u1", "dra-c", 6000, 0)]}
    return dra, NodeView(cpu, used)


def expected_states(view: NodeView) -> list[NodeState]:
    """The same cluster written by hand as the simulator's node states."""
    free = {
        "dra-a": [(500, 40960), (0, 0), (1000, 81920), (1000, 81920)],
        "dra-b": [(700, 57344), (800, 65536), (1000, 81920), (1000, 81920)],
        "dra-c": [(0, 0), (0, 0), (0, 0), (1000, 81920)],
        "dra-d": [(1000, 81920)] * 4,
        "dra-e": [(1000, 81920), (1000, 81920), (300, 24576), (1000, 81920)],
    }
    states = []
    for node, cards in free.items():
        cpu = view.nodes[node].cpu_milli
        taken = sum(u.cpu_milli for u in view.usages_on(node))
        states.append(
            NodeState(
                node,
                cpu,
                cpu - taken,
                512 * 1024,
                A100,
                tuple(GpuState(i, m, mib, A100, 81920) for i, (m, mib) in enumerate(cards)),
            )
        )
    return states


def ranker(policy: str = "kubegpu") -> tuple[DraRanker, FakeDraCluster, NodeView]:
    dra, view = ranked_cluster()
    return DraRanker(GpuScheduler(view, policy, workload=WORKLOAD), dra), dra, view


def test_the_node_states_are_the_simulators_for_the_same_cluster() -> None:
    rank, _, view = ranker()
    states = rank.node_states(["plain", *sorted(view.nodes)])
    assert sorted(states, key=lambda n: n.name) == expected_states(view)


PODS = {
    "half-card share": ("half", [share_request("40Gi", "500")]),
    "small share": ("small", [share_request("8Gi", "100")]),
    "one whole card": ("one", [whole_request()]),
    "two whole cards": ("two", [whole_request(2)]),
    "share needing more memory than most cards have": ("big", [share_request("70Gi", "200")]),
}


@pytest.mark.parametrize("policy", ["kubegpu", "binpack", "spread", "fgd"])
@pytest.mark.parametrize("name, requests", PODS.values(), ids=PODS.keys())
def test_the_best_ranked_node_is_the_simulators_choice_on_the_same_state(
    policy: str, name: str, requests: list[dict[str, Any]]
) -> None:
    rank, dra, view = ranker(policy)
    dra.put_claim(claim_from_object(claim(f"{name}-claim", requests), DRIVER))
    pod = dra_pod(name, {"gpu": f"{name}-claim"})
    nodes = ["plain", "dra-a", "dra-b", "dra-c", "dra-d", "dra-e"]
    scores = rank.rank(pod, nodes)

    demand = rank.demand(pod)
    assert demand is not None
    # The simulator: its DRA engine (the allocator's first fit in slice order, here index
    # order) over the hand-written states, tie-break ranks in name order, choosing as
    # replay's engine.place does.
    engine_policy = get_policy(GpuScheduler(view, policy).engine_policy.name)
    states = [replace(n, rank=i) for i, n in enumerate(expected_states(view))]
    simulated = DeviceOrderEngine(
        states, engine_policy, WORKLOAD, card_choice=CardChoice.FIRST_FIT
    ).choose(demand)
    assert simulated is not None
    if policy != "kubegpu" or not demand.is_gpu_share:
        # Only our policy's shares weigh the card the allocator takes: the rest is the
        # policy's own node choice.
        own = PlacementEngine(states, engine_policy, WORKLOAD).choose(demand)
        assert own is not None and own.node == simulated.node
    best = max(scores.values())
    top = [n for n in sorted(scores) if scores[n] == best]
    assert simulated.node in top
    if policy == "kubegpu":
        assert best == 10
        # Our scores are the engine's order (100 ... 0 by position), so ties at the top are
        # equal keys, and the simulator breaks them by rank: the first in name order.
        assert simulated.node == top[0]
    assert scores["plain"] == 0  # no slice: not ranked


def test_nodes_the_pod_does_not_fit_score_zero() -> None:
    rank, dra, _ = ranker()
    dra.put_claim(claim_from_object(claim("three", [whole_request(3)]), DRIVER))
    scores = rank.rank(dra_pod("p", {"gpu": "three"}), ["dra-a", "dra-c", "dra-d", "dra-e"])
    assert scores["dra-a"] == 0 and scores["dra-c"] == 0  # 2 and 1 whole cards free
    assert scores["dra-d"] == 10 or scores["dra-e"] == 10


def test_a_pod_without_resource_claims_scores_zero_without_starting_the_watch() -> None:
    rank, dra, _ = ranker()
    pod = dra_pod("plain", {})
    del pod["spec"]["resourceClaims"]
    assert rank.rank(pod, ["dra-a", "dra-d"]) == {"dra-a": 0, "dra-d": 0}
    assert dra.started == 0


def test_a_pod_whose_claims_cannot_be_read_scores_zero_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rank, dra, _ = ranker()
    with caplog.at_level(logging.INFO, logger="kubegpu.extender.dra_rank"):
        scores = rank.rank(dra_pod("lost", {"gpu": "nowhere"}), ["dra-a", "dra-d"])
        pending = rank.rank(dra_pod("early", {}, templates={"gpu": None}), ["dra-a", "dra-d"])
    assert scores == pending == {"dra-a": 0, "dra-d": 0}
    assert dra.started == 2
    assert (
        "pod default/lost: DRA nodes not ranked: resourceclaim default/nowhere is not known"
        in caplog.text
    )
    assert (
        "pod default/early: DRA nodes not ranked: claim(s) gpu made from a template" in caplog.text
    )


def test_a_pod_asking_only_another_drivers_devices_scores_zero() -> None:
    rank, dra, _ = ranker()
    dra.put_claim(
        claim_from_object(
            claim("nv", [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]), DRIVER
        )
    )
    assert set(rank.rank(dra_pod("p", {"gpu": "nv"}), ["dra-a", "dra-d"]).values()) == {0}


def test_an_allocation_changes_the_ranking_at_the_next_call() -> None:
    rank, dra, _ = ranker("binpack")
    dra.put_claim(claim_from_object(claim("s", [share_request("8Gi", "100")]), DRIVER))
    pod = dra_pod("p", {"gpu": "s"})
    # Same CPU on both: binpack goes by free GPU, 2.5 cards on dra-a, 3.5 on dra-b.
    before = rank.rank(pod, ["dra-a", "dra-b"])
    dra.put_claim(
        claim_from_object(
            claim("fill", [], results=[whole_result("dra-b", 2), whole_result("dra-b", 3)]),
            DRIVER,
        )
    )
    after = rank.rank(pod, ["dra-a", "dra-b"])
    assert before["dra-a"] > before["dra-b"]
    assert after["dra-b"] > after["dra-a"]


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    # A pool being rewritten may briefly have slices of two generations; the allocator uses
    # only the newest, so the ranking does too.
    old = slice_devices(node_slice("n1", 4, generation=1), DRIVER)
    new = slice_devices(node_slice("n1", 2, generation=2), DRIVER)
    assert old is not None and new is not None
    dra = FakeDraCluster()
    dra.publish("n1-old", old)
    dra.publish("n1-new", new)
    assert [d.name for d in dra.devices_on("n1")] == ["gpu-0", "gpu-1"]
    assert newest_devices([old]) == old.devices


def test_a_pod_with_any_field_of_the_wrong_type_is_ranked_zero_never_an_exception() -> None:
    """kube-scheduler sends every pod to /prioritize-dra; one whose ``status`` was a string
    was a 500 with a traceback."""
    rank, dra, _ = ranker()
    dra.put_claim(claim_from_object(claim("one-claim", [whole_request()]), DRIVER))
    pod = dra_pod("one", {"gpu": "one-claim"}, templates={"extra": "extra-claim"})
    nodes = ["plain", "dra-a"]
    failures = []
    for path in [(), *paths(pod)]:
        for new in ("text", 7, True, None, [], ["x"], {}, {"k": "v"}):
            broken = new if path == () else replaced(pod, path, new)
            try:
                scores = rank.rank(broken, nodes) if isinstance(broken, dict) else None
            except Exception as exc:
                failures.append(f"{'/'.join(map(str, path))} = {new!r}: {exc!r}")
                continue
            assert scores is None or set(scores) == set(nodes)
    assert not failures, "\n".join(failures[:20])


def test_the_ranking_prices_the_card_first_fit_takes_in_each_slices_order() -> None:
    # A 100-milli share. Its best card on the cluster is dra-b's card 0 (700 free: the rest
    # fills with the workload's shares), which the allocator takes there in index order. Once
    # dra-b's slice lists card 1 (800 free, a worse fit) first, first fit there would take
    # card 1, and the ranking moves to a node whose first fit is a cheaper card. Either way
    # the best-ranked node is the DRA engine's choice under the same slice orders.
    nodes = ["dra-a", "dra-b", "dra-c", "dra-d", "dra-e"]
    rank, dra, view = ranker()
    dra.put_claim(claim_from_object(claim("small-claim", [share_request("8Gi", "100")]), DRIVER))
    pod = dra_pod("small", {"gpu": "small-claim"})
    demand = rank.demand(pod)
    assert demand is not None
    states = [replace(n, rank=i) for i, n in enumerate(expected_states(view))]
    policy = get_policy("kubegpu")

    def top(scores: dict[str, int]) -> str:
        return min(n for n in scores if scores[n] == max(scores.values()))

    def simulated(orders: dict[str, list[int]]) -> str:
        engine = DeviceOrderEngine(
            states, policy, WORKLOAD, card_choice=CardChoice.FIRST_FIT, published_orders=orders
        )
        placed = engine.choose(demand)
        assert placed is not None
        return placed.node

    assert top(rank.rank(pod, nodes)) == simulated({}) == "dra-b"
    listing = node_slice("dra-b", 4)
    devices = listing["spec"]["devices"]
    listing["spec"]["devices"] = [devices[1], devices[0], devices[2], devices[3]]
    decoded = slice_devices(listing, DRIVER)
    assert decoded is not None
    dra.publish("dra-b", decoded)
    moved = top(rank.rank(pod, nodes))
    assert moved == simulated({"dra-b": [1, 0, 2, 3]}) != "dra-b"


def test_a_cpu_only_pod_is_ranked_on_the_dra_cards_beside_the_plain_nodes() -> None:
    # Under DRA the node view sees no cards on a DRA node; the CPU-only pod is ranked on one
    # engine with the DRA nodes' cards from their slices and claims and the plain node as the
    # node view has it: its top node is the simulator's choice on that cluster.
    rank, _, view = ranker()
    nodes = ["plain", "dra-a", "dra-b", "dra-c", "dra-d", "dra-e"]
    pod = PodRequest(4000, 4096, name="default/cpu")
    scores = rank.rank_cpu_pod(pod, nodes)
    assert scores is not None and set(scores) == set(nodes)
    states = rank.node_states(nodes, plain=True)
    assert sorted(n.name for n in states) == sorted(nodes)
    dra_states = {n.name: n for n in expected_states(view)}
    assert all(n == dra_states[n.name] for n in states if n.name != "plain")
    ranked_states = [replace(n, rank=i) for i, n in enumerate(sorted(states, key=lambda n: n.name))]
    placed = PlacementEngine(ranked_states, get_policy("kubegpu"), WORKLOAD).choose(pod)
    assert placed is not None
    best = max(scores.values())
    assert best == 10 and min(n for n in scores if scores[n] == best) == placed.node
    # Without a slice among the candidates, the caller ranks on the node view.
    assert rank.rank_cpu_pod(pod, ["plain"]) is None
