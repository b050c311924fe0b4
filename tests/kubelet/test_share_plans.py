"""Share-slot plans and the pure matching rules behind Allocate for shared slots."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kubegpu.config.model import AgentConfig
from kubegpu.core.gpu import GpuDevice, GpuUuid, NodeInventory
from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2
from kubegpu.kubelet.plans import build_plans
from kubegpu.kubelet.plugin import _device_message
from kubegpu.kubelet.records import follow_share_holdings, follow_whole_holdings
from kubegpu.kubelet.resources import PlanError, card_of, slot_id
from kubegpu.kubelet.shares import (
    NodePod,
    pending_share_pods,
    preferred_whole_cards,
    read_node_pod,
    share_candidates,
    shared_decision,
)
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    AllocationDecision,
    CardShare,
    ContainerAllocation,
    decode_allocation,
    encode_allocation,
)
from kubegpu.sharing.ledger import (
    GrantedContainer,
    Ledger,
    LedgerError,
    Trade,
    decode_ledger,
    encode_ledger,
)
from kubegpu.sharing.resources import ResourceNames

KUBELET_MESSAGE_LIMIT = 4 * 1024 * 1024


def h200(index: int) -> GpuDevice:
    return GpuDevice(
        index=index,
        uuid=GpuUuid(f"GPU-{index:08x}-1111-2222-3333-444455556666"),
        product_name="NVIDIA H200 NVL",
        memory_total_mib=143771,
        pci_bus_id=f"00000000:{index + 16:02X}:00.0",
        minor_number=index,
        numa_node=index // 4,
    )


EIGHT_H200 = NodeInventory(gpus=tuple(h200(i) for i in range(8)))


def share_config(**share: object) -> AgentConfig:
    return AgentConfig.model_validate({"sharing": {"gpuShare": {"enabled": True, **share}}})


def list_and_watch_bytes(config: AgentConfig) -> int:
    plans = build_plans(config, EIGHT_H200)
    slot_plan = next(p for p in plans if p.share_slots)
    states = slot_plan.states(set())
    message = api_pb2.ListAndWatchResponse(devices=[_device_message(s) for s in states])
    return message.ByteSize()


def test_slot_ids_carry_their_card_and_sit_beside_the_whole_gpus() -> None:
    plans = build_plans(share_config(slotsPerCard=3), EIGHT_H200)
    assert [p.resource_name for p in plans] == ["nvidia.com/gpu", "kubegpu.io/gpu-shared"]
    slots = plans[1]
    assert len(slots.devices) == 24
    assert slots.devices[0].device_id == slot_id(h200(0).uuid, 0)
    assert all(card_of(d.device_id) == d.gpu.uuid for d in slots.devices)
    assert len(plans[0].devices) == 8  # every card stays available whole until it is shared


def test_list_and_watch_stays_tiny_on_eight_141_gb_cards() -> None:
    default = list_and_watch_bytes(share_config())
    most = list_and_watch_bytes(share_config(slotsPerCard=1024))
    # 8 cards x 32 slots: about 20 KiB; even the largest allowed setting stays far below the
    # kubelet's 4 MiB receive limit (one fake device per MiB would need ~1.1 M entries).
    assert default < 32 * 1024
    assert most < KUBELET_MESSAGE_LIMIT // 4


def test_selected_cards_only_and_unknown_ones_refused() -> None:
    plans = build_plans(share_config(devices=[1, str(h200(5).uuid)]), EIGHT_H200)
    assert {d.gpu.index for d in plans[1].devices} == {1, 5}
    with pytest.raises(PlanError, match=r"sharing.gpuShare.devices: 9 is not a GPU on this node"):
        build_plans(share_config(devices=[9]), EIGHT_H200)


# ----------------------------------------------------------------------------- matching

NAMES = ResourceNames()
UUID0, UUID1 = str(h200(0).uuid), str(h200(1).uuid)


def pod(
    name: str,
    created: str,
    card: str,
    containers: list[tuple[str, bool]],
    ledger: Ledger | None = None,
    phase: str = "Pending",
    decided: str = "2026-01-01T00:00:00Z",
) -> dict[str, object]:
    share = CardShare(card, 0, 100, 1000)
    decision = AllocationDecision(
        "n1",
        (share,),
        tuple(ContainerAllocation(c, init, (share,)) for c, init in containers),
        decided,
        "test",
        True,
    )
    annotations = {ALLOCATION_ANNOTATION: encode_allocation(decision)}
    if ledger is not None:
        annotations["kubegpu.io/gpu-allocated"] = encode_ledger(ledger)
    limits = {NAMES.share_slot: "1", NAMES.gpu_memory: "1000", NAMES.gpu_compute: "100"}
    spec: dict[str, list[object]] = {"containers": [], "initContainers": []}
    for c, init in containers:
        spec["initContainers" if init else "containers"].append(
            {"name": c, "resources": {"limits": limits}}
        )
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "annotations": annotations,
        },
        "spec": {"nodeName": "n1", **spec},
        "status": {"phase": phase},
    }


def granted(name: str, card: str = UUID0) -> GrantedContainer:
    return GrantedContainer(name, card, f"{card}::slot-0", 100, 1000, "2026-01-01T00:00:01Z")


def test_a_pod_part_way_through_admission_comes_first_then_the_oldest() -> None:
    old = pod("old", "2026-01-01T00:00:00Z", UUID0, [("main", False)])
    half = pod(
        "half",
        "2026-01-01T00:05:00Z",
        UUID0,
        [("a", False), ("b", False)],
        ledger=Ledger("n1", (granted("a"),)),
    )
    young = pod("young", "2026-01-01T00:09:00Z", UUID0, [("main", False)])
    done = pod("done", "2025-12-31T00:00:00Z", UUID0, [("x", False)], Ledger("n1", (granted("x"),)))
    gone = pod("gone", "2025-12-30T00:00:00Z", UUID0, [("x", False)], phase="Succeeded")
    other = pod("other", "2025-12-29T00:00:00Z", UUID1, [("x", False)])
    pods = [read_node_pod(p, "n1", NAMES) for p in (young, old, done, gone, half, other)]
    assert [p.name for p in pending_share_pods(pods, UUID0)] == ["half", "old", "young"]
    assert [p.name for p in pending_share_pods(pods)] == ["half", "other", "old", "young"]
    assert pending_share_pods(pods, UUID0)[0].next_container() == (
        "b",
        CardShare(UUID0, 0, 100, 1000),
    )


def test_containers_are_served_in_the_kubelets_order_init_first() -> None:
    p = read_node_pod(
        pod("p", "t", UUID0, [("app", False), ("init-b", True), ("init-a", True)]), "n1", NAMES
    )
    assert [name for name, _ in p.slot_containers] == ["init-b", "init-a", "app"]


def test_a_decision_for_another_node_is_not_served() -> None:
    raw = pod("p", "t", UUID0, [("main", False)])
    p = read_node_pod(raw, "n2", NAMES)
    assert p.decision is None and "names node n1, not n2" in p.problem
    assert pending_share_pods([p]) == []


def test_pods_are_expected_in_bind_order_not_creation_order() -> None:
    # "old" was created first but bound (decided) later, e.g. after waiting for capacity: the
    # kubelet sees it later, so it is admitted after "young".
    old = pod(
        "old", "2026-01-01T00:00:00Z", UUID0, [("main", False)], decided="2026-01-02T10:00:01Z"
    )
    young = pod(
        "young", "2026-01-01T09:00:00Z", UUID0, [("main", False)], decided="2026-01-02T10:00:00Z"
    )
    tie = pod(
        "tie", "2026-01-01T08:00:00Z", UUID0, [("main", False)], decided="2026-01-02T10:00:00Z"
    )
    pods = [read_node_pod(p, "n1", NAMES) for p in (old, young, tie)]
    assert [p.name for p in pending_share_pods(pods, UUID0)] == ["tie", "young", "old"]


def test_the_binding_write_orders_pods_over_the_decision_time() -> None:
    # Found on the real kube-scheduler, which binds in parallel: "late" was decided 3 µs after
    # "early" but its Binding landed first (lower resourceVersion), and the kubelet admitted it
    # first. Ordering by decision time gave each the other's share.
    early = pod(
        "early",
        "2026-01-01T00:00:00Z",
        UUID0,
        [("main", False)],
        decided="2026-01-02T10:00:00.000001Z",
    )
    late = pod(
        "late",
        "2026-01-01T00:00:00Z",
        UUID0,
        [("main", False)],
        decided="2026-01-02T10:00:00.000004Z",
    )
    early["metadata"]["resourceVersion"] = "1042"  # type: ignore[index]
    late["metadata"]["resourceVersion"] = "1039"  # type: ignore[index]
    pods = [read_node_pod(p, "n1", NAMES) for p in (early, late)]
    assert [p.name for p in pending_share_pods(pods, UUID0)] == ["late", "early"]
    assert [c.pod.name for c in share_candidates(pods, UUID0, {})] == ["late", "early"]


def test_podresources_names_the_pod_being_admitted_and_the_ones_already_admitted() -> None:
    first = pod("first", "2026-01-01T00:00:00Z", UUID1, [("main", False)])
    multi = pod("multi", "2026-01-01T00:01:00Z", UUID0, [("a", False), ("b", False)])
    later = pod("later", "2026-01-01T00:02:00Z", UUID0, [("main", False)])
    pods = [read_node_pod(p, "n1", NAMES) for p in (first, multi, later)]
    # Nothing held: the pending pods in admission order.
    assert [c.pod.name for c in share_candidates(pods, None, {})] == ["first", "multi", "later"]
    # "multi" holds a slot for "a", not for "b": the kubelet is admitting it, and only it,
    # even for a slot of another card (the caller refuses that instead of guessing).
    busy = share_candidates(pods, UUID1, {("ns", "multi"): {"a"}})
    assert [(c.pod.name, c.container, c.admitting) for c in busy] == [("multi", "b", True)]
    # A pod holding all its slots is admitted: not a candidate, although its ledger is empty.
    done = share_candidates(pods, UUID0, {("ns", "multi"): {"a", "b"}})
    assert [(c.pod.name, c.container, c.admitting) for c in done] == [("later", "main", False)]


def test_the_pod_being_admitted_is_found_past_its_unlisted_init_containers() -> None:
    # PodResources lists sidecars and app containers only (fact sheet 2.3).
    def multi(ledger: Ledger) -> NodePod:
        raw = pod(
            "multi",
            "2026-01-01T00:05:00Z",
            UUID0,
            [("proxy", True), ("setup", True), ("app", False)],
            ledger=ledger,
        )
        raw["spec"]["initContainers"][0]["restartPolicy"] = "Always"  # type: ignore[index]
        return read_node_pod(raw, "n1", NAMES)

    slot = f"{UUID0}::slot-1"
    setup = replace(granted("setup"), slot=slot)
    # "half" is older and also part-way by its ledger (nothing in PodResources says otherwise).
    half = read_node_pod(
        pod(
            "half",
            "2026-01-01T00:00:00Z",
            UUID0,
            [("a", False), ("b", False)],
            ledger=Ledger("n1", (granted("a"),)),
        ),
        "n1",
        NAMES,
    )
    assert multi(Ledger("n1")).regular_init == frozenset({"setup"})
    # proxy shown, setup served (the ledger is all that can say so): app is next, not setup.
    p = multi(Ledger("n1", (granted("proxy"), setup)))
    (next_up,) = share_candidates([half, p], UUID0, {("ns", "multi"): {"proxy"}})
    assert (next_up.pod.name, next_up.container, next_up.admitting) == ("multi", "app", True)
    # setup first, proxy reusing its slot: nothing of multi in PodResources; the slot, which
    # the kubelet hands on only within setup's pod, names it over the older "half".
    q = read_node_pod(
        pod(
            "multi",
            "2026-01-01T00:05:00Z",
            UUID0,
            [("setup", True), ("app", False)],
            ledger=Ledger("n1", (setup,)),
        ),
        "n1",
        NAMES,
    )
    assert [c.pod.name for c in share_candidates([half, q], UUID0, None)] == ["half", "multi"]
    (reused,) = share_candidates([half, q], UUID0, None, slot)
    assert (reused.pod.name, reused.container, reused.admitting) == ("multi", "app", True)
    # A slot half's app container holds is no such signal.
    assert share_candidates([half, q], UUID0, None, f"{UUID0}::slot-0")[0].pod.name == "half"


def test_a_sidecar_holding_its_init_containers_slot_is_not_exchanged_with_it() -> None:
    raw = pod("p", "t", UUID0, [("setup", True), ("proxy", True), ("app", False)])
    raw["spec"]["initContainers"][1]["restartPolicy"] = "Always"  # type: ignore[index]
    slot, other = f"{UUID0}::slot-0", f"{UUID0}::slot-1"
    # proxy reused setup's slot; its own record was lost. app's record is right.
    ledger = Ledger("n1", (granted("setup"), replace(granted("app"), slot=other)))
    base = read_node_pod(raw, "n1", NAMES)
    p = base.with_records(base.decision, ledger)
    held = {("ns", "p", "proxy"): (slot,), ("ns", "p", "app"): (other,)}
    (repair,) = follow_share_holdings([p], held, node="n1", index_of={}, now="now")
    assert repair.ledger is not None and repair.decision is None
    entries = {c.name: (c.slot, c.verified, c.source) for c in repair.ledger.containers}
    assert entries == {
        "setup": (slot, False, "allocate"),  # never verifiable, left as it is
        "proxy": (slot, True, "podresources"),  # recorded, not traded with setup
        "app": (other, True, "allocate"),
    }
    assert repair.mismatches == ()
    assert ["had no record of it" in n for n in repair.notes] == [True]


def test_a_rebuilt_shared_decision_counts_init_and_sidecars_as_the_extender_does() -> None:
    raw = pod("p", "t", UUID0, [("app", False), ("side", True), ("setup", True)])
    init = raw["spec"]["initContainers"]  # type: ignore[index]
    init[0]["restartPolicy"] = "Always"  # "side" is a sidecar: it runs beside the app
    p = read_node_pod(raw, "n1", NAMES)
    assert (p.init_containers, p.sidecars) == (frozenset({"side", "setup"}), frozenset({"side"}))
    tokens = {
        "app": CardShare(UUID0, 0, 300, 3000),
        "side": CardShare(UUID0, 0, 100, 1000),
        "setup": CardShare(UUID1, 1, 500, 9000),
    }
    decision = shared_decision(p, tokens)
    # Card 0: app + sidecar = 400/4000 (the setup step there is just the sidecar: 100/1000).
    # Card 1: only the init step, 500/9000 (the sidecar on card 0 adds nothing to card 1).
    assert {c.uuid: (c.compute_milli, c.gpu_memory_mib) for c in decision.cards} == {
        UUID0: (400, 4000),
        UUID1: (500, 9000),
    }
    assert {c.name: c.cards for c in decision.containers} == {n: (t,) for n, t in tokens.items()}
    # The annotation codec takes it: every container on one card, gpus lists just those.
    assert decode_allocation(encode_allocation(decision)) == decision


def shared(name: str, card: int, compute: int, memory: int, order: int) -> NodePod:
    uuid = str(h200(card).uuid)
    share = CardShare(uuid, card, compute, memory)
    decision = AllocationDecision(
        "n1", (share,), (ContainerAllocation("main", False, (share,)),), f"t{order}", "x", True
    )
    limits = {NAMES.share_slot: "1", NAMES.gpu_memory: str(memory), NAMES.gpu_compute: str(compute)}
    raw = {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": name,
            "annotations": {ALLOCATION_ANNOTATION: encode_allocation(decision)},
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "main", "resources": {"limits": limits}}],
        },
    }
    return read_node_pod(raw, "n1", NAMES)


def test_an_exchange_relabels_records_so_each_card_keeps_its_total() -> None:
    slot0, slot1 = slot_id(h200(0).uuid, 0), slot_id(h200(1).uuid, 0)
    a, c = shared("a", 0, 600, 8000, 1), shared("c", 1, 300, 3000, 2)
    # The agent handed c the share decided for a (recorded on a), then a the one decided for c.
    a = a.with_records(
        a.decision, Ledger("n1", (GrantedContainer("main", UUID0, slot0, 600, 8000, "1"),))
    )
    c = c.with_records(
        c.decision, Ledger("n1", (GrantedContainer("main", UUID1, slot1, 300, 3000, "2"),))
    )
    held = {("ns", "c", "main"): (slot0,), ("ns", "a", "main"): (slot1,)}
    repairs = follow_share_holdings([a, c], held, node="n1", index_of={}, now="now")
    by = {r.pod.name: r for r in repairs}
    assert set(by) == {"a", "c"}
    for name, card, slot, size in (
        ("a", UUID1, slot1, (300, 3000)),
        ("c", UUID0, slot0, (600, 8000)),
    ):
        repair = by[name]
        assert repair.decision is not None and repair.ledger is not None
        (total,) = repair.decision.cards
        assert (total.uuid, total.compute_milli, total.gpu_memory_mib) == (card, *size)
        (entry,) = repair.ledger.containers
        assert (entry.uuid, entry.slot, entry.compute_milli, entry.gpu_memory_mib) == (
            card,
            slot,
            *size,
        )
        assert entry.verified
        assert any("delete and recreate pod ns/" + name in m for m in repair.mismatches)
    # The first holder processed carries the trade and is written first.
    assert repairs[0].first and not repairs[1].first
    assert repairs[0].ledger is not None and repairs[0].ledger.containers[0].trade is not None
    # Applied, the records need nothing more.
    done = [p.with_records(by[p.name].decision, by[p.name].ledger) for p in (a, c)]
    assert follow_share_holdings(done, held, node="n1", index_of={}, now="now") == []


def test_an_exchange_half_written_by_a_stopped_agent_is_finished() -> None:
    slot0 = slot_id(h200(0).uuid, 0)
    a, c = shared("a", 0, 600, 8000, 1), shared("c", 1, 300, 3000, 2)
    grant = GrantedContainer("main", UUID0, slot0, 600, 8000, "1")
    a = a.with_records(a.decision, Ledger("n1", (grant,)))
    # c (holding a's share) was rewritten, then the agent stopped before rewriting a.
    c_token = CardShare(UUID1, 1, 300, 3000)
    trade = Trade("ns/a", "main", c_token, None)
    c_decision = shared("c2", 0, 600, 8000, 2).decision
    c = c.with_records(c_decision, Ledger("n1", (replace(grant, verified=True, trade=trade),)))
    held = {("ns", "c", "main"): (slot0,)}
    (repair,) = follow_share_holdings([a, c], held, node="n1", index_of={}, now="now")
    assert repair.pod.name == "a"
    assert repair.decision is not None and repair.decision.cards == (c_token,)
    assert repair.ledger is not None and repair.ledger.containers == ()  # a is pending again
    assert "finishing an exchange of records an earlier agent started" in repair.notes[0]


def test_ledger_round_trips_and_rejects_garbage() -> None:
    trade = Trade("ns/p", "main", CardShare(UUID1, 1, 300, 3000), granted("main", UUID1))
    ledger = Ledger("n1", (granted("a"), granted("b", UUID1), replace(granted("c"), trade=trade)))
    assert decode_ledger(encode_ledger(ledger)) == ledger
    for bad in (
        "{",
        "[]",
        json.dumps({"v": 2}),
        json.dumps({"v": 1, "node": "n", "containers": [{}]}),
    ):
        with pytest.raises(LedgerError):
            decode_ledger(bad)


def test_whole_pods_are_steered_to_the_oldest_decision_that_is_still_free() -> None:
    def whole(name: str, created: str, cards: tuple[str, ...]) -> dict[str, object]:
        shares = tuple(CardShare(c, i, 1000, 143771) for i, c in enumerate(cards))
        decision = AllocationDecision(
            "n1", shares, (ContainerAllocation("main", False, shares),), "t", "test", False
        )
        return {
            "metadata": {
                "name": name,
                "uid": name,
                "creationTimestamp": created,
                "annotations": {ALLOCATION_ANNOTATION: encode_allocation(decision)},
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
        }

    pods = [
        read_node_pod(whole("b", "2026-02", (UUID1,)), "n1", NAMES),
        read_node_pod(whole("a", "2026-01", (UUID0,)), "n1", NAMES),
    ]
    assert preferred_whole_cards(pods, {UUID0, UUID1}, 1) == (UUID0,)
    assert preferred_whole_cards(pods, {UUID1}, 1) == (UUID1,)  # a's card already handed out
    assert preferred_whole_cards(pods, {UUID0, UUID1}, 2) is None


def test_whole_decisions_follow_the_cards_held_and_a_pod_still_to_come_takes_the_freed_one() -> (
    None
):
    def whole(name: str, index: int, order: int) -> NodePod:
        share = CardShare(str(h200(index).uuid), index, 1000, 143771)
        decision = AllocationDecision(
            "n1", (share,), (ContainerAllocation("main", False, (share,)),), f"t{order}", "x", False
        )
        raw = {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "uid": name,
                "annotations": {ALLOCATION_ANNOTATION: encode_allocation(decision)},
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
        }
        return read_node_pod(raw, "n1", NAMES)

    cards = {str(g.uuid): (g.index, g.memory_total_mib) for g in EIGHT_H200.gpus}
    uuid = [str(h200(i).uuid) for i in range(8)]
    # w2 (decided card 3) was given card 2, decided for w1, which the kubelet has not admitted.
    pods = [whole("w1", 2, 1), whole("w2", 3, 2), whole("w3", 4, 3)]
    held = {("ns", "w2", "main"): (uuid[2],), ("ns", "w3", "main"): (uuid[4],)}
    every_other = set(uuid) - {uuid[2], uuid[3], uuid[4]}
    repairs = {
        r.pod.name: r for r in follow_whole_holdings(pods, held, cards=cards, shared=every_other)
    }
    assert set(repairs) == {"w1", "w2"}  # w3 holds what it was decided
    moved = {n: r.decision.gpu_uuids for n, r in repairs.items() if r.decision is not None}
    assert moved == {"w2": (uuid[2],), "w1": (uuid[3],)}
    assert "takes over card " + uuid[3] in repairs["w1"].notes[0]
    # Nothing free for w1 (card 3 holds shares): its decision stays, to be fixed once admitted.
    crowded = every_other | {uuid[3]}
    again = follow_whole_holdings(pods, held, cards=cards, shared=crowded)
    assert [r.pod.name for r in again] == ["w2"]


def test_a_whole_gpu_init_container_follows_the_cards_its_pod_was_given() -> None:
    # prep (a regular init container) and main were both decided card 2; the kubelet gave prep
    # card 5 and main reused it. PodResources shows main only.
    uuid = [str(h200(i).uuid) for i in range(8)]
    card = CardShare(uuid[2], 2, 1000, 143771)
    decision = AllocationDecision(
        "n1",
        (card,),
        (ContainerAllocation("prep", True, (card,)), ContainerAllocation("main", False, (card,))),
        "t1",
        "x",
        False,
    )
    raw = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "p",
            "annotations": {ALLOCATION_ANNOTATION: encode_allocation(decision)},
        },
        "spec": {
            "nodeName": "n1",
            "initContainers": [{"name": "prep"}],
            "containers": [{"name": "main"}],
        },
    }
    p = read_node_pod(raw, "n1", NAMES)
    cards = {str(g.uuid): (g.index, g.memory_total_mib) for g in EIGHT_H200.gpus}
    (repair,) = follow_whole_holdings([p], {("ns", "p", "main"): (uuid[5],)}, cards=cards)
    assert repair.decision is not None
    # The pod holds card 5 and only it: no phantom card 2 left in its accounting.
    assert repair.decision.gpu_uuids == (uuid[5],)
    assert {c.name: c.cards[0].uuid for c in repair.decision.containers} == {
        "prep": uuid[5],
        "main": uuid[5],
    }
    assert "PodResources does not list init containers" in repair.notes[1]
    # Once written, nothing more to do.
    moved = p.with_records(repair.decision, None)
    assert follow_whole_holdings([moved], {("ns", "p", "main"): (uuid[5],)}, cards=cards) == []
