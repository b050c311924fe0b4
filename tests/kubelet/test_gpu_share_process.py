"""Card-level sharing end to end: a real plugin process, the kubelet emulator (with PodResources)
and the fake API server over HTTP; decisions written as the scheduler extender writes them."""

from __future__ import annotations

import shutil
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
from kubegpu.testing.kubelet import AllocationError
from tests.kubelet.conftest import short_tempdir
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
)

T4_MIB = 15360


@pytest.fixture
def node() -> Iterator[SharedNode]:
    root = short_tempdir()
    shared = SharedNode(root)
    try:
        shared.wait_ready()
        yield shared
    finally:
        shared.close()
        shutil.rmtree(root, ignore_errors=True)


def uuid_of(node: SharedNode, index: int) -> str:
    return node.card(index).uuid


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
    # Out of the kubelet's usual order: the agent cannot tell, so it serves the oldest
    # decision; PodResources later shows the truth and the ledgers are corrected.
    got_b = node.allocate_share(uid_b, "b", "main")
    got_a = node.allocate_share(uid_a, "a", "main")
    node.wait_until(lambda: node.drift("a") is not None, "drift flagged on pod a")
    ledger_a = node.wait_verified("a", 1)
    ledger_b = node.wait_verified("b", 1)
    assert ledger_a.containers[0].uuid == card_of(got_a.device_ids[0])
    assert ledger_b.containers[0].uuid == card_of(got_b.device_ids[0])
    assert "repaired" in (node.drift("a") or "")
    assert "repaired" in (node.drift("b") or "")
    assert "pod default/a: container main: the agent recorded card" in node.plugin.log()

    # The extender's records follow the truth, so its accounting stays right after a restart.
    def decided(name: str) -> tuple[str, ...]:
        return decode_allocation(node.annotations(name)[ALLOCATION_ANNOTATION]).gpu_uuids

    real_a, real_b = card_of(got_a.device_ids[0]), card_of(got_b.device_ids[0])
    node.wait_until(lambda: decided("a") == (real_a,), "decision of a moved to its real card")
    node.wait_until(lambda: decided("b") == (real_b,), "decision of b moved to its real card")
    assert "decision moved so the extender accounts the truth" in (node.drift("a") or "")
    # Identical requests: whichever way round, no card holds more than it has.
    for compute, memory in card_totals(node, ["a", "b"]).values():
        assert compute <= 1000 and memory <= T4_MIB


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
    ledger = node.wait_verified("multi", 3)
    assert {c.name: c.uuid for c in ledger.containers} == {
        "setup": card,
        "app": card,
        "sidecar": card,
    }


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
    # The other way round: cards in whole use withdraw their share slots.
    node.kubelet.wait_for_devices(
        SLOT,
        lambda d: all(s.healthy == (card_of(i) == card0) for i, s in d.items()),
        timeout_s=10,
    )
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
