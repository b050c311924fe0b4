"""The sharing coordinator in-process, over real HTTP to the fake API server, with the
kubelet's PodResources answer scripted (the process tests use the emulator's real one)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import pytest

from kubegpu.config.model import AgentConfig
from kubegpu.core.health_feed import HealthFeed
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.kube.agent_api import LightkubeNodeApi
from kubegpu.kubelet.board import DeviceBoard
from kubegpu.kubelet.cluster import DeviceHolding
from kubegpu.kubelet.coordinator import SharingCoordinator
from kubegpu.kubelet.plans import build_plans
from kubegpu.kubelet.resources import AllocationRefused, BindMount, slot_id
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    AllocationDecision,
    CardShare,
    ContainerAllocation,
    decode_allocation,
    encode_allocation,
)
from kubegpu.sharing.contract import Grant, share_contract
from kubegpu.sharing.findings import DRIFT_ANNOTATION
from kubegpu.sharing.ledger import ALLOCATED_ANNOTATION, decode_ledger
from kubegpu.testing.apiserver import FakeApiServer, make_node
from kubegpu.testing.apiserver.errors import StatusError
from kubegpu.testing.waiting import wait_until_async

NODE = "n1"
INVENTORY = resolve_fake_spec("4xT4").inventory
CARDS = [str(g.uuid) for g in sorted(INVENTORY.gpus, key=lambda g: g.index)]
CONFIG = AgentConfig.model_validate({"sharing": {"gpuShare": {"enabled": True, "slotsPerCard": 2}}})


class ScriptedPodResources:
    def __init__(self) -> None:
        self.holdings: list[DeviceHolding] = []
        self.down = False

    async def list_holdings(self) -> list[DeviceHolding]:
        if self.down:
            raise ConnectionError("kubelet socket refused the connection")
        return list(self.holdings)


def shared_pod(
    name: str,
    card: int,
    containers: tuple[str, ...],
    *,
    compute: int = 200,
    memory: int = 2000,
    decided: str = "2026-01-01T00:00:00Z",
) -> dict[str, object]:
    share = CardShare(CARDS[card], card, compute, memory)
    decision = AllocationDecision(
        NODE,
        (CardShare(CARDS[card], card, compute * len(containers), memory * len(containers)),),
        tuple(ContainerAllocation(c, False, (share,)) for c in containers),
        decided,
        "test",
        True,
    )
    limits = {"kubegpu.io/gpu-shared": "1", "kubegpu.io/gpu-memory": str(memory)}
    limits["kubegpu.io/gpu-compute"] = str(compute)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {ALLOCATION_ANNOTATION: encode_allocation(decision)},
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": c, "image": "x", "resources": {"limits": limits}} for c in containers
            ],
        },
    }


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as api:
        api.store.put("nodes", make_node(NODE))
        yield api


@pytest.fixture
async def parts(
    server: FakeApiServer,
) -> AsyncIterator[tuple[SharingCoordinator, ScriptedPodResources, DeviceBoard]]:
    client = server.async_client()
    board = DeviceBoard(HealthFeed())
    pod_resources = ScriptedPodResources()
    coordinator = SharingCoordinator(
        NODE, CONFIG, LightkubeNodeApi(client, NODE), board, pod_resources=pod_resources
    )
    coordinator.set_plans(build_plans(CONFIG, INVENTORY))
    yield coordinator, pod_resources, board
    await client.close()


def pod_annotations(server: FakeApiServer, name: str) -> dict[str, str]:
    pod = server.store.get("pods", "default", name)
    assert pod is not None
    return dict(pod["metadata"].get("annotations") or {})


async def test_a_container_the_agent_never_recorded_is_learnt_from_podresources_and_flagged(
    server: FakeApiServer,
    parts: tuple[SharingCoordinator, ScriptedPodResources, DeviceBoard],
) -> None:
    coordinator, pod_resources, board = parts
    server.store.put("pods", shared_pod("p", 2, ("main",)))
    # E.g. allocated by an agent that crashed after answering but before its patch landed.
    slot = slot_id(INVENTORY.gpus[2].uuid, 1)
    pod_resources.holdings = [
        DeviceHolding("default", "p", "main", "kubegpu.io/gpu-shared", (slot,))
    ]
    assert await coordinator.reconcile() == 1
    ledger = decode_ledger(pod_annotations(server, "p")[ALLOCATED_ANNOTATION])
    (entry,) = ledger.containers
    assert (entry.uuid, entry.slot, entry.source, entry.verified) == (
        CARDS[2],
        slot,
        "podresources",
        True,
    )
    assert (entry.compute_milli, entry.gpu_memory_mib) == (200, 2000)
    assert "had no record of it; recorded" in pod_annotations(server, "p")[DRIFT_ANNOTATION]
    assert coordinator.drift_count == 1
    # The card now holds a share: its whole-GPU id is withdrawn.
    assert board.blocked["nvidia.com/gpu"] == frozenset({CARDS[2]})
    # A second pass finds nothing new and writes nothing.
    patches = server.count("patch", "pods")
    assert await coordinator.reconcile() == 0
    assert server.count("patch", "pods") == patches


async def test_whole_gpus_in_kubelet_use_keep_their_slots_advertised_but_refuse_shares(
    server: FakeApiServer,
    parts: tuple[SharingCoordinator, ScriptedPodResources, DeviceBoard],
) -> None:
    coordinator, pod_resources, board = parts
    server.store.put("pods", shared_pod("p", 0, ("main",)))
    pod_resources.holdings = [DeviceHolding("default", "w", "main", "nvidia.com/gpu", (CARDS[0],))]
    await coordinator.reconcile()
    # Withdrawn slots would lower the node's count, and kube-scheduler never retries a shared
    # pod it turned away for slots when they come back (found on the real scheduler).
    assert not board.blocked.get("kubegpu.io/gpu-shared")
    slot_plan = next(p for p in coordinator.plans if p.share_slots)
    with pytest.raises(AllocationRefused) as caught:
        await coordinator.allocate(slot_plan, [slot_id(INVENTORY.gpus[0].uuid, 0)])
    assert caught.value.code == "FAILED_PRECONDITION"
    assert f"node {NODE}: card {CARDS[0]} is in use as a whole GPU" in str(caught.value)


async def test_the_api_being_down_refuses_shares_but_not_whole_gpus(
    server: FakeApiServer,
    parts: tuple[SharingCoordinator, ScriptedPodResources, DeviceBoard],
) -> None:
    coordinator, _, _ = parts
    await server.stop()
    slot_plan = next(p for p in coordinator.plans if p.share_slots)
    whole_plan = next(p for p in coordinator.plans if not p.share_slots)
    with pytest.raises(AllocationRefused) as caught:
        await coordinator.allocate(slot_plan, [slot_id(INVENTORY.gpus[1].uuid, 0)])
    assert caught.value.code == "UNAVAILABLE"
    alloc = await coordinator.allocate(whole_plan, [CARDS[1]])
    assert alloc.envs["NVIDIA_VISIBLE_DEVICES"] == CARDS[1]


async def test_a_share_is_answered_with_the_share_contract_beside_the_strategys_device_list(
    server: FakeApiServer,
) -> None:
    config = AgentConfig.model_validate(
        {
            "flags": {"plugin": {"deviceIDStrategy": "index"}},
            "sharing": {"gpuShare": {"enabled": True, "slotsPerCard": 2, "enforcement": "mps"}},
        }
    )
    client = server.async_client()
    coordinator = SharingCoordinator(
        NODE, config, LightkubeNodeApi(client, NODE), DeviceBoard(HealthFeed())
    )
    coordinator.set_plans(build_plans(config, INVENTORY))
    server.store.put("pods", shared_pod("p", 2, ("main",), compute=333, memory=4096))
    slot_plan = next(p for p in coordinator.plans if p.share_slots)
    try:
        answer = await coordinator.allocate(slot_plan, [slot_id(INVENTORY.gpus[2].uuid, 0)])
    finally:
        await client.close()
    told = share_contract(Grant(CARDS[2], 2, 4096, 333), config.sharing.gpu_share)
    # The device-list strategy names the card (by index here); everything else is the contract.
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": "2", **told.share_env}
    assert told.mps is not None and told.mps.thread_percentage == 34
    pipe, log = "/run/kubegpu/mps/pipe", "/run/kubegpu/mps/log"
    assert answer.mounts == (
        BindMount(pipe, pipe, read_only=False),
        BindMount(log, log, read_only=False),
    )


async def test_a_conflicting_ledger_write_is_redone_on_fresh_data(
    server: FakeApiServer,
    parts: tuple[SharingCoordinator, ScriptedPodResources, DeviceBoard],
) -> None:
    coordinator, _, board = parts
    server.store.put("pods", shared_pod("p", 3, ("a", "b")))
    slot_plan = next(p for p in coordinator.plans if p.share_slots)
    server.inject_failures("pods", "p", namespace="default", count=2, code=409)
    first = await coordinator.allocate(slot_plan, [slot_id(INVENTORY.gpus[3].uuid, 0)])
    second = await coordinator.allocate(slot_plan, [slot_id(INVENTORY.gpus[3].uuid, 1)])
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == second.envs["NVIDIA_VISIBLE_DEVICES"] == CARDS[3]
    ledger = decode_ledger(pod_annotations(server, "p")[ALLOCATED_ANNOTATION])
    assert [(c.name, c.slot) for c in ledger.containers] == [
        ("a", slot_id(INVENTORY.gpus[3].uuid, 0)),
        ("b", slot_id(INVENTORY.gpus[3].uuid, 1)),
    ]
    assert server.count("patch", "pods") == 4  # two refused with 409, then two that landed
    assert board.blocked["nvidia.com/gpu"] == frozenset({CARDS[3]})
    # Every container served: a third slot on that card finds no pending pod.
    with pytest.raises(AllocationRefused, match="no pending pod has a kubegpu decision"):
        await coordinator.allocate(slot_plan, [slot_id(INVENTORY.gpus[3].uuid, 0)])


async def test_whole_gpus_follow_the_decision_else_the_extenders_highest_index_assumption(
    server: FakeApiServer,
    parts: tuple[SharingCoordinator, ScriptedPodResources, DeviceBoard],
) -> None:
    coordinator, _, _ = parts
    whole_plan = next(p for p in coordinator.plans if not p.share_slots)
    # Placed by another scheduler: the extender charges the highest-index free cards.
    assert await coordinator.preferred(whole_plan, CARDS, [], 2) == (CARDS[3], CARDS[2])
    assert await coordinator.preferred(whole_plan, CARDS[:2], [], 1) == (CARDS[1],)
    shares = tuple(CardShare(CARDS[i], i, 1000, 15360) for i in (0, 2))
    decision = AllocationDecision(
        NODE, shares, (ContainerAllocation("main", False, shares),), "t", "test", False
    )
    whole_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "w",
            "namespace": "default",
            "annotations": {ALLOCATION_ANNOTATION: encode_allocation(decision)},
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x"}]},
    }
    server.store.put("pods", whole_pod)
    assert await coordinator.preferred(whole_plan, CARDS, [], 2) == (CARDS[0], CARDS[2])


def slot_holding(pod: str, card: int, replica: int = 0) -> DeviceHolding:
    slot = slot_id(INVENTORY.gpus[card].uuid, replica)
    return DeviceHolding("default", pod, "main", "kubegpu.io/gpu-shared", (slot,))


async def test_an_exchange_cut_short_between_its_two_writes_is_finished_next_round(
    server: FakeApiServer,
    parts: tuple[SharingCoordinator, ScriptedPodResources, DeviceBoard],
) -> None:
    coordinator, pod_resources, _ = parts
    server.store.put("pods", shared_pod("a", 0, ("main",), compute=600, memory=8000))
    server.store.put(
        "pods",
        shared_pod("c", 1, ("main",), compute=300, memory=3000, decided="2026-01-01T00:00:01Z"),
    )
    slot_plan = next(p for p in coordinator.plans if p.share_slots)
    # The kubelet admits c first; the agent expects a (decided first) and hands out a's share.
    got = await coordinator.allocate(slot_plan, [slot_id(INVENTORY.gpus[0].uuid, 0)])
    assert (got.envs["NVIDIA_VISIBLE_DEVICES"], got.envs["KUBEGPU_GPU_MEMORY_LIMIT_MIB"]) == (
        CARDS[0],
        "8000",
    )
    pod_resources.holdings = [slot_holding("c", 0)]
    # The agent stops between the holder's write and the other pod's: here a 409 on a.
    server.inject_failures("pods", "a", namespace="default", count=1, code=409)
    await coordinator.reconcile()
    c_ledger = decode_ledger(pod_annotations(server, "c")[ALLOCATED_ANNOTATION])
    (entry,) = c_ledger.containers
    assert (entry.uuid, entry.gpu_memory_mib, entry.verified) == (CARDS[0], 8000, True)
    assert entry.trade is not None and entry.trade.pod == "default/a"
    c_decision = decode_allocation(pod_annotations(server, "c")[ALLOCATION_ANNOTATION])
    assert [(x.uuid, x.gpu_memory_mib) for x in c_decision.cards] == [(CARDS[0], 8000)]
    # a still says what it said: card 0 handed out. A restarted agent (a new coordinator, the
    # same API and kubelet) finishes the exchange from c's trade note.
    assert decode_allocation(pod_annotations(server, "a")[ALLOCATION_ANNOTATION]).gpu_uuids == (
        CARDS[0],
    )
    again = SharingCoordinator(
        NODE, CONFIG, coordinator.api, DeviceBoard(HealthFeed()), pod_resources=pod_resources
    )
    again.set_plans(coordinator.plans)
    assert await again.reconcile() == 1
    a_decision = decode_allocation(pod_annotations(server, "a")[ALLOCATION_ANNOTATION])
    assert [(x.uuid, x.compute_milli, x.gpu_memory_mib) for x in a_decision.cards] == [
        (CARDS[1], 300, 3000)
    ]
    assert decode_ledger(pod_annotations(server, "a")[ALLOCATED_ANNOTATION]).containers == ()
    assert "earlier agent started" in pod_annotations(server, "a")[DRIFT_ANNOTATION]
    # a, still to be admitted, now gets the share that was decided for c.
    got_a = await again.allocate(slot_plan, [slot_id(INVENTORY.gpus[1].uuid, 0)])
    assert (got_a.envs["NVIDIA_VISIBLE_DEVICES"], got_a.envs["KUBEGPU_GPU_MEMORY_LIMIT_MIB"]) == (
        CARDS[1],
        "3000",
    )


async def test_podresources_down_at_allocate_falls_back_to_the_ledgers(
    server: FakeApiServer,
    parts: tuple[SharingCoordinator, ScriptedPodResources, DeviceBoard],
    caplog: pytest.LogCaptureFixture,
) -> None:
    coordinator, pod_resources, _ = parts
    server.store.put("pods", shared_pod("p", 1, ("main",)))
    pod_resources.down = True
    slot_plan = next(p for p in coordinator.plans if p.share_slots)
    got = await coordinator.allocate(slot_plan, [slot_id(INVENTORY.gpus[1].uuid, 0)])
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == CARDS[1]
    assert (
        f"node {NODE}: cannot list the kubelet's PodResources for share slot "
        f"{slot_id(INVENTORY.gpus[1].uuid, 0)} (kubelet socket refused the connection); going "
        "by the pods' ledgers alone"
    ) in caplog.text


async def test_a_pod_being_admitted_is_not_handed_a_slot_of_another_card(
    server: FakeApiServer,
    parts: tuple[SharingCoordinator, ScriptedPodResources, DeviceBoard],
) -> None:
    coordinator, pod_resources, _ = parts
    server.store.put("pods", shared_pod("m", 2, ("a", "b")))
    server.store.put("pods", shared_pod("o", 3, ("main",)))
    slot_plan = next(p for p in coordinator.plans if p.share_slots)
    await coordinator.allocate(slot_plan, [slot_id(INVENTORY.gpus[2].uuid, 0)])
    pod_resources.holdings = [
        DeviceHolding(
            "default", "m", "a", "kubegpu.io/gpu-shared", (slot_id(INVENTORY.gpus[2].uuid, 0),)
        )
    ]
    # The kubelet is part-way through m; a slot on card 3 (o's card) is not for o.
    with pytest.raises(AllocationRefused) as caught:
        await coordinator.allocate(slot_plan, [slot_id(INVENTORY.gpus[3].uuid, 0)])
    assert caught.value.code == "FAILED_PRECONDITION"
    assert (
        f"the kubelet is admitting pod default/m, whose container b has its share on card "
        f"{CARDS[2]}" in str(caught.value)
    )
    assert ALLOCATED_ANNOTATION not in pod_annotations(server, "o")


WATCH_CONFIG = AgentConfig.model_validate(
    {"sharing": {"gpuShare": {"enabled": True, "slotsPerCard": 2, "syncIntervalS": 0.5}}}
)


@pytest.fixture
async def watching() -> AsyncIterator[tuple[FakeApiServer, SharingCoordinator, DeviceBoard]]:
    """A coordinator running its loops (no PodResources) against a server that keeps only the
    last 5 changes, so a watch resumed from further back is told 410 Expired."""
    async with running_coordinator(FakeApiServer(history_size=5)) as running:
        yield running


@contextlib.asynccontextmanager
async def running_coordinator(
    server: FakeApiServer,
) -> AsyncIterator[tuple[FakeApiServer, SharingCoordinator, DeviceBoard]]:
    async with server as api:
        api.store.put("nodes", make_node(NODE))
        client = api.async_client()
        board = DeviceBoard(HealthFeed())
        coordinator = SharingCoordinator(NODE, WATCH_CONFIG, LightkubeNodeApi(client, NODE), board)
        coordinator.set_plans(build_plans(WATCH_CONFIG, INVENTORY))
        task = asyncio.create_task(coordinator.run())
        try:
            async with asyncio.timeout(10):
                await coordinator.synced.wait()
            yield api, coordinator, board
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()


async def until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    # The coordinator's view is fed by a watch over real HTTP and announces no change.
    await wait_until_async(check, timeout_s=timeout_s, what=what)


async def test_the_pods_are_kept_current_by_one_list_and_a_watch_not_by_polling(
    watching: tuple[FakeApiServer, SharingCoordinator, DeviceBoard],
) -> None:
    server, coordinator, board = watching
    # A shared pod arriving withdraws its card's whole-GPU id, from the watch alone.
    server.store.put("pods", shared_pod("s", 1, ("main",)))
    await until(lambda: board.blocked.get("nvidia.com/gpu") == frozenset({CARDS[1]}), "blocked")
    # Pods of other nodes are not this agent's business (field selector spec.nodeName).
    other = shared_pod("elsewhere", 2, ("main",))
    other["spec"]["nodeName"] = "n2"  # type: ignore[index]
    server.store.put("pods", other)
    server.store.remove("pods", "default", "s")
    await until(lambda: not board.blocked.get("nvidia.com/gpu"), "unblocked after the delete")
    assert [p.name for p in coordinator.pods] == []
    # Four sync intervals later: still the one LIST the watch started from. A real wait, and
    # the point of the test: what it rules out is a timer (a poll every syncIntervalS) that
    # the coordinator must not have, so there is no event or fake clock to wait on instead.
    await asyncio.sleep(4 * WATCH_CONFIG.sharing.gpu_share.sync_interval_s)
    assert server.count("list", "pods") == 1
    assert coordinator.relists == 1
    # A stream the server ends (its timeout) is resumed from the last version, not re-listed.
    server.drop_watches()
    server.store.put("pods", shared_pod("t", 3, ("main",)))
    await until(lambda: board.blocked.get("nvidia.com/gpu") == frozenset({CARDS[3]}), "t seen")
    assert server.count("list", "pods") == 1


async def test_bookmarks_move_the_pod_watch_on_without_breaking_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # kube-apiserver sends a bookmark as a Pod's zero value ("containers": null), which
    # lightkube's Pod model refuses: the agent's watch once broke on each, about once a minute,
    # and was blind for a sync interval or more after it.
    async with running_coordinator(FakeApiServer(bookmark_interval_s=0.05)) as running:
        server, coordinator, board = running
        server.store.put("nodes", make_node("n2"))  # moves the head past the pods' version
        head = str(server.store.resource_version)
        await until(lambda: coordinator.view.resume_from == head, "pods bookmarked")
        server.store.put("pods", shared_pod("s", 1, ("main",)))
        await until(lambda: board.blocked.get("nvidia.com/gpu") == frozenset({CARDS[1]}), "s")
        assert server.count("watch", "pods") == 1  # the one stream, never re-opened
    assert "watching this node's pods failed" not in caplog.text


async def test_the_nodes_pods_are_listed_as_the_json_sent() -> None:
    # As the watch gives them: a pod lightkube's Pod model refuses ("containers": null) once
    # failed the agent's whole list of its node's pods.
    odd = shared_pod("odd", 0, ("main",))
    odd["spec"]["containers"] = None  # type: ignore[index]
    async with FakeApiServer() as server:
        server.store.put("pods", odd)
        server.store.put("pods", shared_pod("s", 1, ("main",)))
        client = server.async_client()
        try:
            listing = await LightkubeNodeApi(client, NODE).list_node_pods()
        finally:
            await client.close()
    assert sorted(p["metadata"]["name"] for p in listing.pods) == ["odd", "s"]
    assert listing.resource_version == str(server.store.resource_version)


async def test_a_watch_resumed_too_late_for_the_servers_history_lists_again(
    watching: tuple[FakeApiServer, SharingCoordinator, DeviceBoard],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, coordinator, board = watching
    caplog.set_level(logging.INFO, logger="kubegpu.kubelet.coordinator")
    server.store.put("pods", shared_pod("s", 1, ("main",)))
    await until(lambda: [p.name for p in coordinator.pods] == ["s"], "s seen")
    # The connection breaks; while the agent waits to retry, more changes happen than the
    # server keeps (5), among them the one that matters here: s is deleted, u added.
    server.drop_watches(abrupt=True)
    await until(lambda: "watching this node's pods failed" in caplog.text, "the break noticed")
    server.store.remove("pods", "default", "s")
    for i in range(6):
        elsewhere = shared_pod(f"e{i}", 0, ("main",))
        elsewhere["spec"]["nodeName"] = "n2"  # type: ignore[index]
        server.store.put("pods", elsewhere)
    server.store.put("pods", shared_pod("u", 2, ("main",)))
    await until(lambda: coordinator.relists == 2, "listed again after 410 Expired")
    await until(lambda: [p.name for p in coordinator.pods] == ["u"], "the list's view")
    assert f"node {NODE}: pod watch expired at version" in caplog.text
    assert board.blocked.get("nvidia.com/gpu") == frozenset({CARDS[2]})


async def test_without_rbac_to_watch_the_agent_lists_every_sync_interval_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def forbidden(store: object) -> None:
        raise StatusError("Forbidden", 'pods is forbidden: cannot "watch" pods')

    async with FakeApiServer() as server:
        # An older ClusterRole: list and patch on pods, no watch.
        server.before("watch", "pods", forbidden, count=1000)
        client = server.async_client()
        board = DeviceBoard(HealthFeed())
        coordinator = SharingCoordinator(NODE, WATCH_CONFIG, LightkubeNodeApi(client, NODE), board)
        coordinator.set_plans(build_plans(WATCH_CONFIG, INVENTORY))
        task = asyncio.create_task(coordinator.run())
        try:
            await until(lambda: "may not watch this node's pods" in caplog.text, "the refusal")
            server.store.put("pods", shared_pod("s", 0, ("main",)))
            await until(
                lambda: board.blocked.get("nvidia.com/gpu") == frozenset({CARDS[0]}),
                "the pod seen by polling",
            )
            assert "the node agent's ClusterRole needs watch on pods" in caplog.text
            assert server.count("list", "pods") >= 2
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()


RECONCILE_RARELY = AgentConfig.model_validate(
    {"sharing": {"gpuShare": {"enabled": True, "slotsPerCard": 2, "reconcileIntervalS": 3600}}}
)


async def test_a_shared_pod_leaving_gives_its_card_whole_back_without_waiting_a_round(
    server: FakeApiServer,
) -> None:
    """Found on the real kubelet: ids withdrawn for a pod stayed withdrawn until the next
    PodResources round (30 s by default) after the pod was gone, and a pod the scheduler bound
    in that window failed admission for good (the kubelet allocates no unhealthy device)."""
    client = server.async_client()
    board = DeviceBoard(HealthFeed())
    pod_resources = ScriptedPodResources()
    coordinator = SharingCoordinator(
        NODE, RECONCILE_RARELY, LightkubeNodeApi(client, NODE), board, pod_resources=pod_resources
    )
    coordinator.set_plans(build_plans(RECONCILE_RARELY, INVENTORY))
    slot = slot_id(INVENTORY.gpus[0].uuid, 0)
    pod_resources.holdings = [
        DeviceHolding("default", "s", "main", "kubegpu.io/gpu-shared", (slot,))
    ]
    task = asyncio.create_task(coordinator.run())
    try:
        await until(lambda: coordinator.synced.is_set(), "first list")
        await until(
            lambda: board.blocked.get("nvidia.com/gpu") == frozenset({CARDS[0]}),
            "the whole id of the card holding a share withdrawn",
        )
        # The kubelet has let the pod go: it is no longer in PodResources, and it is deleted.
        server.store.put("pods", shared_pod("s", 0, ("main",)))
        pod_resources.holdings = []
        server.store.remove("pods", "default", "s")
        await until(lambda: not board.blocked.get("nvidia.com/gpu"), "whole id given back", 10.0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()
