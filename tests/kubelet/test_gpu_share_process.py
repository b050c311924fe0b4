"""Card-level sharing end to end: a real plugin process, the kubelet emulator (with PodResources)
and the fake API server over HTTP; decisions written as the scheduler extender writes them."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube.resources.core_v1 import Node

from kubegpu.kubelet.resources import card_of
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    INVENTORY_ANNOTATION,
    decode_allocation,
    decode_inventory,
)
from kubegpu.sharing.resources import GPU_MODELS_ANNOTATION
from kubegpu.testing.apiserver import make_pod
from kubegpu.testing.kubelet import Allocation, AllocationError
from tests.kubelet.sharenode import (
    COMPUTE,
    MEMORY,
    NODE,
    SLOT,
    WHOLE,
    ExtenderProcess,
    SharedNode,
    ShareSpec,
    card_totals,
    ready_shared_node,
)

T4_MIB = 15360


@pytest.fixture
def node() -> Iterator[SharedNode]:
    with ready_shared_node() as shared:
        yield shared


def uuid_of(node: SharedNode, index: int) -> str:
    return node.card(index).uuid


def told(got: Allocation) -> tuple[str, int, int]:
    """What a sharing container's env says it got: card, milli, MiB."""
    env = got.envs
    return (
        env["NVIDIA_VISIBLE_DEVICES"],
        int(env["KUBEGPU_GPU_COMPUTE_MILLI"]),
        int(env["KUBEGPU_GPU_MEMORY_LIMIT_MIB"]),
    )


def test_advertises_slots_per_card_beside_whole_gpus_and_publishes_the_inventory(
    node: SharedNode,
) -> None:
    slots = node.kubelet.devices(SLOT)
    assert len(slots) == 4 * 4
    assert {card_of(s) for s in slots} == {str(g.uuid) for g in node.gpus}
    assert sorted(node.kubelet.devices(WHOLE)) == sorted(str(g.uuid) for g in node.gpus)
    node.wait_until(
        lambda: (
            INVENTORY_ANNOTATION
            in (node.api.store.get("nodes", None, NODE) or {})
            .get("metadata", {})
            .get("annotations", {})
        ),
        "inventory annotation published",
    )
    raw = node.api.store.get("nodes", None, NODE)
    assert raw is not None
    inventory = decode_inventory(raw["metadata"]["annotations"][INVENTORY_ANNOTATION])
    assert [g.uuid for g in inventory.gpus] == [str(g.uuid) for g in node.gpus]
    assert all(g.healthy and g.memory_mib == T4_MIB for g in inventory.gpus)


def test_two_identical_pods_started_together_get_their_decided_cards_and_are_reconciled(
    node: SharedNode,
) -> None:
    # 600 milli each: they cannot share a card, so the extender put them on cards 0 and 1.
    spec = [ShareSpec("main", 600, 8000)]
    uid_a = node.add_shared_pod("a", 0, spec)
    uid_b = node.add_shared_pod("b", 1, spec)
    got_a = node.allocate_share(uid_a, "a", "main")
    got_b = node.allocate_share(uid_b, "b", "main")

    assert got_a.envs["NVIDIA_VISIBLE_DEVICES"] == uuid_of(node, 0)
    assert got_b.envs["NVIDIA_VISIBLE_DEVICES"] == uuid_of(node, 1)
    assert {card_of(got_a.device_ids[0]), card_of(got_b.device_ids[0])} == {
        uuid_of(node, 0),
        uuid_of(node, 1),
    }
    for got in (got_a, got_b):
        assert got.envs["KUBEGPU_GPU_MEMORY_LIMIT_MIB"] == "8000"
        assert got.envs["KUBEGPU_GPU_COMPUTE_MILLI"] == "600"
        assert got.envs["KUBEGPU_GPU_ENFORCEMENT"] == "none"
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in got.envs

    ledger_a = node.wait_verified("a", 1)
    ledger_b = node.wait_verified("b", 1)
    assert ledger_a.containers[0].uuid == uuid_of(node, 0)
    assert ledger_b.containers[0].slot == got_b.device_ids[0]
    assert node.drift("a") is None and node.drift("b") is None
    for compute, memory in card_totals(node, ["a", "b"]).values():
        assert compute <= 1000 and memory <= T4_MIB


def test_a_kubelet_serving_the_younger_pod_first_is_repaired_by_reconciliation(
    node: SharedNode,
) -> None:
    spec = [ShareSpec("main", 600, 8000)]
    uid_a = node.add_shared_pod("a", 0, spec)
    uid_b = node.add_shared_pod("b", 1, spec)
    # Out of the agent's expected order: it cannot tell at b's Allocate, so b gets the share
    # decided for a (the older decision); at a's Allocate PodResources shows b on a's slot, the
    # two pods' records are exchanged, and a gets the share that had been decided for b.
    got_b = node.allocate_share(uid_b, "b", "main")
    got_a = node.allocate_share(uid_a, "a", "main")
    assert got_b.envs["NVIDIA_VISIBLE_DEVICES"] == uuid_of(node, 0)
    assert got_a.envs["NVIDIA_VISIBLE_DEVICES"] == uuid_of(node, 1)
    ledger_a = node.wait_verified("a", 1)
    ledger_b = node.wait_verified("b", 1)
    assert ledger_a.containers[0].uuid == card_of(got_a.device_ids[0])
    assert ledger_b.containers[0].uuid == card_of(got_b.device_ids[0])
    assert "records exchanged" in (node.drift("a") or "")
    assert "records exchanged" in (node.drift("b") or "")
    assert "pod default/b: container main: the agent recorded nothing for it" in node.plugin.log()
    # Same size: each got what it asked for, only on the other card; nothing to complain about.
    assert node.mismatch("a") is None and node.mismatch("b") is None

    # The extender's records follow the truth, so its accounting stays right after a restart.
    assert node.decision("a").gpu_uuids == (card_of(got_a.device_ids[0]),)
    assert node.decision("b").gpu_uuids == (card_of(got_b.device_ids[0]),)
    node.assert_records_match("a", {"main": got_a})
    node.assert_records_match("b", {"main": got_b})
    for compute, memory in card_totals(node, ["a", "b"]).values():
        assert compute <= 1000 and memory <= T4_MIB


def test_unequal_pods_admitted_out_of_order_are_recorded_as_handed_out_and_flagged(
    node: SharedNode,
) -> None:
    # Card 1 already holds d's 700 milli. The extender put a (600) on card 0 and c (300) beside
    # d on card 1; a was decided first, so the agent expects the kubelet to admit a first.
    uid_d = node.add_shared_pod("d", 1, [ShareSpec("main", 700, 10000)])
    got_d = node.allocate_share(uid_d, "d", "main")
    uid_a = node.add_shared_pod("a", 0, [ShareSpec("main", 600, 8000)])
    uid_c = node.add_shared_pod("c", 1, [ShareSpec("main", 300, 3000)])
    got_c = node.allocate_share(uid_c, "c", "main")  # the kubelet admits c first
    got_a = node.allocate_share(uid_a, "a", "main")

    # What each container was handed: c the share decided for a, a the one decided for c.
    # Per card that is still what the extender decided (card 1: 700 + 300).
    assert told(got_c) == (uuid_of(node, 0), 600, 8000)
    assert told(got_a) == (uuid_of(node, 1), 300, 3000)
    for name in ("a", "c", "d"):
        node.wait_verified(name, 1)
    # The records say exactly that, in the ledgers and in the decisions the extender reads.
    node.assert_records_match("a", {"main": got_a})
    node.assert_records_match("c", {"main": got_c})
    node.assert_records_match("d", {"main": got_d})
    assert card_totals(node, ["a", "c", "d"]) == {
        uuid_of(node, 0): (600, 8000),
        uuid_of(node, 1): (1000, 13000),
    }
    node.wait_until(lambda: published_models(node) != [], "inventory published")
    assert node.over_capacity() == []

    # Both pods got a share of another size than they asked for: said on each pod, with what
    # to do, and in the agent's log naming the node, both pods, the card and the sizes.
    mismatch_c = node.mismatch("c") or ""
    assert "got the share decided for default/a container main" in mismatch_c
    assert f"(8000 MiB, 600 milli on card {uuid_of(node, 0)}) instead of its own" in mismatch_c
    assert "delete and recreate pod default/c" in mismatch_c
    mismatch_a = node.mismatch("a") or ""
    assert "gets the share decided for default/c container main" in mismatch_a
    assert "delete and recreate pod default/a" in mismatch_a
    assert node.mismatch("d") is None
    log = node.plugin.log()
    assert (
        f"node {NODE}: pod default/c: GPU share mismatch: container main got the share decided "
        f"for default/a container main (8000 MiB, 600 milli on card {uuid_of(node, 0)}) instead "
        "of its own (3000 MiB, 300 milli)"
    ) in log


def test_a_multi_container_pod_admitted_out_of_order_is_recorded_across_its_cards(
    node: SharedNode,
) -> None:
    uid_q = node.add_shared_pod("q", 3, [ShareSpec("main", 400, 4000)])
    uid_p = node.add_shared_pod("p", 2, [ShareSpec("x", 200, 2000), ShareSpec("y", 300, 3000)])
    # The kubelet admits p before q: p's first container gets q's share (the agent cannot tell);
    # from its second container on, PodResources shows the kubelet part-way through p, so the
    # agent knows it is p and hands out p's own share.
    got_x = node.allocate_share(uid_p, "p", "x")
    got_y = node.allocate_share(uid_p, "p", "y")
    got_q = node.allocate_share(uid_q, "q", "main")
    assert got_x.envs["NVIDIA_VISIBLE_DEVICES"] == uuid_of(node, 3)
    assert got_x.envs["KUBEGPU_GPU_MEMORY_LIMIT_MIB"] == "4000"
    assert got_y.envs["NVIDIA_VISIBLE_DEVICES"] == uuid_of(node, 2)
    assert got_y.envs["KUBEGPU_GPU_MEMORY_LIMIT_MIB"] == "3000"
    assert got_q.envs["NVIDIA_VISIBLE_DEVICES"] == uuid_of(node, 2)
    assert got_q.envs["KUBEGPU_GPU_MEMORY_LIMIT_MIB"] == "2000"
    node.wait_verified("p", 2)
    node.wait_verified("q", 1)
    node.assert_records_match("p", {"x": got_x, "y": got_y})
    node.assert_records_match("q", {"main": got_q})
    # p now holds shares of two cards, and its decision says so, card by card.
    decided = {c.uuid: (c.compute_milli, c.gpu_memory_mib) for c in node.decision("p").cards}
    assert decided == {uuid_of(node, 3): (400, 4000), uuid_of(node, 2): (300, 3000)}
    node.wait_until(lambda: published_models(node) != [], "inventory published")
    assert node.over_capacity() == []


def test_whole_gpu_pods_admitted_out_of_order_get_records_of_the_cards_they_hold(
    node: SharedNode,
) -> None:
    uid_1 = node.add_whole_pod("w1", [2])
    uid_2 = node.add_whole_pod("w2", [3])
    got_2 = node.kubelet.allocate(WHOLE, 1, pod_uid=uid_2, pod_name="w2", container="main")
    got_1 = node.kubelet.allocate(WHOLE, 1, pod_uid=uid_1, pod_name="w1", container="main")
    # Steered to the older decision, w2 got w1's card; w1 then got the card w2 gave up.
    assert got_2.device_ids == (uuid_of(node, 2),)
    assert got_1.device_ids == (uuid_of(node, 3),)
    node.wait_until(
        lambda: node.decision("w1").gpu_uuids == got_1.device_ids,
        "w1's decision follows the card it holds",
    )
    node.wait_until(
        lambda: node.decision("w2").gpu_uuids == got_2.device_ids,
        "w2's decision follows the card it holds",
    )
    assert "the kubelet gave" in (node.drift("w2") or "")
    for name, got in (("w1", got_1), ("w2", got_2)):
        (container,) = node.decision(name).containers
        assert tuple(c.uuid for c in container.cards) == got.device_ids
        assert all(c.compute_milli == 1000 for c in container.cards)
    node.wait_until(lambda: published_models(node) != [], "inventory published")
    assert node.over_capacity() == []


def test_a_pod_without_a_decision_gets_a_clear_error_not_a_random_card(
    node: SharedNode,
) -> None:
    uid = node.add_shared_pod("rogue", None, [ShareSpec("main", 100, 1000)], decide=False)
    with pytest.raises(AllocationError) as caught:
        node.allocate_share(uid, "rogue", "main")
    message = str(caught.value)
    assert caught.value.grpc_code == "FAILED_PRECONDITION"
    assert f"node {NODE}" in message
    assert "::slot-" in message
    assert "no pending pod has a kubegpu decision" in message
    assert node.ledger("rogue") is None


def test_init_and_multi_container_pod_each_get_their_share_of_one_card(
    node: SharedNode,
) -> None:
    spec = [
        ShareSpec("setup", 200, 2000, init=True),
        ShareSpec("app", 300, 3000),
        ShareSpec("sidecar", 100, 1000),
    ]
    uid = node.add_shared_pod("multi", 2, spec)
    # The kubelet's order: init containers, then app containers; the init container's slot
    # goes back to the pod's reusable pool and the first app container takes it again.
    init = node.allocate_share(uid, "multi", "setup")
    app = node.allocate_share(uid, "multi", "app", must_include=init.device_ids)
    side = node.allocate_share(uid, "multi", "sidecar")
    card = uuid_of(node, 2)
    assert [a.envs["NVIDIA_VISIBLE_DEVICES"] for a in (init, app, side)] == [card] * 3
    assert [a.envs["KUBEGPU_GPU_MEMORY_LIMIT_MIB"] for a in (init, app, side)] == [
        "2000",
        "3000",
        "1000",
    ]
    assert app.device_ids == init.device_ids
    # PodResources lists app containers and sidecars, never a regular init container: setup's
    # entry stays unverified, and is neither missing nor drift; the pod still reconciles.
    ledger = node.wait_verified("multi", 3)
    assert {c.name: (c.uuid, c.verified) for c in ledger.containers} == {
        "setup": (card, False),
        "app": (card, True),
        "sidecar": (card, True),
    }
    assert node.drift("multi") is None and node.mismatch("multi") is None


@pytest.mark.parametrize("sidecar_first", [False, True], ids=["init-first", "sidecar-first"])
def test_init_containers_and_sidecars_get_their_shares_and_the_pod_reconciles(
    node: SharedNode, sidecar_first: bool
) -> None:
    setup = ShareSpec("setup", 200, 2000, init=True)
    proxy = ShareSpec("proxy", 100, 1000, sidecar=True)
    spec = [proxy, setup] if sidecar_first else [setup, proxy]
    spec.append(ShareSpec("app", 300, 3000))
    uid = node.add_shared_pod("multi", 1, spec)
    # The kubelet's order and device reuse: a regular init container's slot goes to the next
    # container of the pod (sidecar or app), which keeps it. PodResources never shows setup,
    # so after it only the ledger and the reused slot say the kubelet is admitting this pod.
    got: dict[str, Allocation] = {}
    reusable: tuple[str, ...] = ()
    for c in spec:
        got[c.name] = node.allocate_share(uid, "multi", c.name, must_include=reusable)
        reusable = got[c.name].device_ids if c.init else ()
    card = uuid_of(node, 1)
    assert {c.name: told(got[c.name]) for c in spec} == {
        "setup": (card, 200, 2000),
        "proxy": (card, 100, 1000),
        "app": (card, 300, 3000),
    }
    reuser = "app" if sidecar_first else "proxy"
    assert got[reuser].device_ids == got["setup"].device_ids
    ledger = node.wait_verified("multi", 3)
    assert {c.name: (c.slot, c.verified) for c in ledger.containers} == {
        "setup": (got["setup"].device_ids[0], False),
        "proxy": (got["proxy"].device_ids[0], True),
        "app": (got["app"].device_ids[0], True),
    }
    assert node.drift("multi") is None and node.mismatch("multi") is None
    assert card_totals(node, ["multi"]) == {card: (400, 4000)}  # app + sidecar, not setup


def test_a_node_agent_crash_between_bind_and_allocate_loses_nothing(node: SharedNode) -> None:
    spec = [ShareSpec("first", 250, 4000), ShareSpec("second", 250, 4000)]
    uid = node.add_shared_pod("p", 1, spec)
    other = node.add_shared_pod("q", 3, [ShareSpec("main", 900, 12000)])
    first = node.allocate_share(uid, "p", "first")

    # Decision written, one container done: the agent dies hard and comes back.
    registered = len(node.kubelet.registrations)
    node.plugin.proc.send_signal(signal.SIGKILL)
    node.plugin.proc.wait()
    node.plugin.stop()
    node.wait_until(lambda: not node.kubelet.is_connected(SLOT), "old stream ended")
    # Meanwhile someone mangles the node's inventory: the restarted agent re-asserts it.
    node.client.patch(Node, NODE, {"metadata": {"annotations": {INVENTORY_ANNOTATION: "junk"}}})
    node.plugin = node.start_plugin()
    node.wait_until(
        lambda: (
            len(node.kubelet.registrations) >= registered + 2
            and node.kubelet.is_connected(SLOT)
            and node.kubelet.is_connected(WHOLE)
        ),
        "both resources registered again",
    )
    node.wait_ready()

    second = node.allocate_share(uid, "p", "second")
    third = node.allocate_share(other, "q", "main")
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == uuid_of(node, 1)
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == uuid_of(node, 1)
    assert third.envs["NVIDIA_VISIBLE_DEVICES"] == uuid_of(node, 3)
    ledger = node.wait_verified("p", 2)
    assert [c.name for c in ledger.containers] == ["first", "second"]
    assert node.drift("p") is None
    node.wait_verified("q", 1)
    totals = card_totals(node, ["p", "q"])
    assert totals == {uuid_of(node, 1): (500, 8000), uuid_of(node, 3): (900, 12000)}

    def published() -> str:
        raw = node.api.store.get("nodes", None, NODE) or {}
        return str((raw.get("metadata", {}).get("annotations") or {}).get(INVENTORY_ANNOTATION))

    node.wait_until(lambda: published() != "junk", "inventory re-asserted")
    text = published()
    assert len(decode_inventory(text).gpus) == 4


def test_whole_gpus_and_shares_never_meet_on_one_card(node: SharedNode) -> None:
    uid = node.add_shared_pod("s", 0, [ShareSpec("main", 100, 1000)])
    shared = node.allocate_share(uid, "s", "main")
    card0 = uuid_of(node, 0)
    assert card_of(shared.device_ids[0]) == card0

    # The card holding a share is withdrawn from nvidia.com/gpu...
    node.kubelet.wait_for_devices(WHOLE, lambda d: not d[card0].healthy, timeout_s=10)
    # ...so a pod asking for every card cannot have it,
    with pytest.raises(AllocationError, match="Requested: 4, Available: 3"):
        node.kubelet.allocate(WHOLE, 4, pod_name="greedy", container="main")
    # and even asked directly, the agent refuses it whole.
    with pytest.raises(AllocationError) as caught:
        node.kubelet.allocate_raw(WHOLE, [card0])
    assert caught.value.grpc_code == "FAILED_PRECONDITION"
    assert "holds GPU shares of default/s" in str(caught.value)

    whole = node.kubelet.allocate(WHOLE, 3, pod_name="big", container="main")
    assert card0 not in whole.device_ids
    # The other way round: cards in whole use keep their share slots advertised (kube-scheduler
    # would not retry a shared pod turned away for slots), and Allocate refuses a share there.
    assert all(s.healthy for s in node.kubelet.devices(SLOT).values())
    late = node.add_shared_pod("late", 1, [ShareSpec("main", 100, 1000)])
    with pytest.raises(AllocationError) as refused:
        node.kubelet.allocate_raw(SLOT, [f"{uuid_of(node, 1)}::slot-0"])
    assert "in use as a whole GPU" in str(refused.value)
    assert node.ledger("late") is None
    assert late


def test_mixed_model_node_serves_a_t4_decision_on_the_t4(tempdir: Path) -> None:
    mixed = SharedNode(tempdir, preset="2xV100-2xT4")
    try:
        mixed.wait_ready()
        t4 = next(g for g in mixed.gpus if "T4" in g.product_name and g.index == 3)
        uid = mixed.add_shared_pod("t4pod", t4.index, [ShareSpec("main", 500, 6000)])
        got = mixed.allocate_share(uid, "t4pod", "main")
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == str(t4.uuid)
        assert card_of(got.device_ids[0]) == str(t4.uuid)
        ledger = mixed.wait_verified("t4pod", 1)
        assert ledger.containers[0].uuid == str(t4.uuid)
        # The V100s are untouched: still whole and healthy.
        v100s = [str(g.uuid) for g in mixed.gpus if "V100" in g.product_name]
        assert all(mixed.kubelet.devices(WHOLE)[u].healthy for u in v100s)
    finally:
        mixed.close()


def test_mixed_model_node_allocates_the_card_the_extender_chose_for_the_model(
    tempdir: Path,
) -> None:
    mixed = SharedNode(tempdir, preset="2xV100-2xT4")
    extender: ExtenderProcess | None = None
    try:
        mixed.wait_ready()
        models = {str(g.uuid): g.product_name for g in mixed.gpus}
        assert sorted(set(models.values())) == ["Tesla T4", "Tesla V100-SXM2-16GB"]
        mixed.wait_until(
            lambda: published_models(mixed) == [models[str(g.uuid)] for g in mixed.gpus],
            "the agent published both models in the node inventory",
        )
        extender = ExtenderProcess(mixed)
        for name, model in (("t4-share", "Tesla T4"), ("v100-share", "Tesla V100-SXM2-16GB")):
            pod = make_pod(
                name,
                requests={"cpu": "1", "memory": "1Gi"},
                limits={MEMORY: "6144", COMPUTE: "400", SLOT: "1"},
                annotations={GPU_MODELS_ANNOTATION: model},
            )
            uid = str(mixed.api.store.put("pods", pod)["metadata"]["uid"])
            answer = extender.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": [NODE]})
            assert answer["NodeNames"] == [NODE], answer
            bind = {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": NODE}
            assert extender.post("bind", bind) == {"Error": ""}
            decided = decode_allocation(mixed.annotations(name)[ALLOCATION_ANNOTATION])
            (card,) = decided.gpu_uuids
            assert models[card] == model
            got = mixed.allocate_share(uid, name, "main")
            assert got.envs["NVIDIA_VISIBLE_DEVICES"] == card
            assert card_of(got.device_ids[0]) == card
            assert mixed.wait_verified(name, 1).containers[0].uuid == card
    finally:
        if extender is not None:
            assert extender.stop() == 0, extender.log()[-3000:]
        mixed.close()


def published_models(node: SharedNode) -> list[str]:
    raw = node.api.store.get("nodes", None, NODE) or {}
    text = (raw.get("metadata", {}).get("annotations") or {}).get(INVENTORY_ANNOTATION)
    return [] if text is None else [g.model for g in decode_inventory(text).gpus]


def test_mps_mode_supervises_the_daemon_and_hands_out_per_client_limits(tempdir: Path) -> None:
    from tests.enforcement.fakes import install_fake_mps_control

    command = install_fake_mps_control(tempdir)
    mps = SharedNode(tempdir, enforcement="mps", mps_command=str(command))
    log = mps.mps_dir / "log" / "control.log"
    try:
        mps.wait_ready()
        mps.wait_until(lambda: log.exists() and "started" in log.read_text(), "daemon started")
        uid = mps.add_shared_pod("m", 1, [ShareSpec("main", 250, 4096)])
        got = mps.allocate_share(uid, "m", "main")
        card = uuid_of(mps, 1)
        assert got.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{card}=4096M"
        assert got.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert got.envs["CUDA_MPS_PIPE_DIRECTORY"] == str(mps.mps_dir / "pipe")
        assert got.envs["KUBEGPU_GPU_ENFORCEMENT"] == "mps"
        mounts = {m.container_path: m for m in got.mounts}
        assert not mounts[str(mps.mps_dir / "pipe")].read_only
        assert str(mps.mps_dir / "log") in mounts
        # Every shared card is visible to the one daemon.
        started = log.read_text().splitlines()[0]
        assert started.endswith("gpus=" + ",".join(str(g.uuid) for g in mps.gpus))

        # A reload that leaves the MPS settings alone keeps the daemon (and its clients).
        mps.config.write_text(mps.config.read_text().replace("slotsPerCard: 4", "slotsPerCard: 2"))
        mps.plugin.send(signal.SIGHUP)
        mps.kubelet.wait_for_devices(SLOT, lambda d: len(d) == 8, timeout_s=15)
        assert [line for line in log.read_text().splitlines() if "started" in line] == [started]
    finally:
        assert mps.close() == 0
    assert log.read_text().splitlines()[-1].startswith("quit ")


def test_a_health_change_is_published_in_the_node_inventory(node: SharedNode) -> None:
    from kubegpu.inventory.fake import send_fake_gpu_command

    def inventory_health() -> list[bool]:
        raw = node.api.store.get("nodes", None, NODE) or {}
        text = (raw.get("metadata", {}).get("annotations") or {}).get(INVENTORY_ANNOTATION)
        return [] if text is None else [g.healthy for g in decode_inventory(text).gpus]

    node.wait_until(lambda: inventory_health() == [True] * 4, "inventory published")
    reply = send_fake_gpu_command(node.plugin.control, "xid", gpu=2, xid=79)
    assert reply["ok"], reply
    node.wait_until(
        lambda: inventory_health() == [True, True, False, True], "unhealthy card published"
    )
