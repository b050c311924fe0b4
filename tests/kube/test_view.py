"""The cluster view's list + watch against the fake API server: resume after a dropped stream,
relist after 410, stale events ignored, bounded backoff."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
from collections.abc import AsyncIterator, Callable

import pytest

from kubegpu.kube.list_watch import Backoff
from kubegpu.kube.view import ClusterView, ReservationHeld
from kubegpu.sharing.accounting import CardShare, PodUsage
from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION
from kubegpu.testing.apiserver import FakeApiServer, make_pod
from kubegpu.testing.waiting import wait_until_async
from tests.extender.cluster import gpu_node, whole_pod


async def eventually(check: Callable[[], bool], what: str) -> None:
    # The view is fed by its watches over real HTTP and announces no change.
    await wait_until_async(check, timeout_s=10, what=what)


@contextlib.asynccontextmanager
async def watching(server: FakeApiServer, **kwargs: object) -> AsyncIterator[ClusterView]:
    client = server.async_client()
    view = ClusterView(client, **kwargs)  # type: ignore[arg-type]
    task = asyncio.create_task(view.run())
    try:
        await asyncio.wait_for(view.synced.wait(), 10)
        yield view
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()


def bound(name: str, node: str, namespace: str = "default") -> dict[str, object]:
    pod = whole_pod(name, 1, namespace=namespace)
    pod["spec"]["nodeName"] = node  # type: ignore[index]
    return pod


async def test_lists_then_follows_changes_in_every_namespace() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("n1", cards=2))
        server.store.put("pods", bound("a", "n1"))
        async with watching(server) as view:
            assert set(view.nodes) == {"n1"}
            assert [u.key for u in view.usages_on("n1")] == ["default/a"]
            server.store.put("nodes", gpu_node("n2", cards=4))
            server.store.put("pods", bound("b", "n2", namespace="ml"))  # every namespace
            await eventually(lambda: "n2" in view.nodes and view.usages_on("n2"), "n2 and b seen")
            server.store.remove("pods", "default", "a")
            await eventually(lambda: not view.usages_on("n1"), "a's deletion seen")


async def test_resumes_after_an_abrupt_drop_with_backoff() -> None:
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        await asyncio.sleep(0)

    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("n1"))
        async with watching(server, backoff=Backoff(1.0, 4.0), sleep=sleep) as view:
            relists = view.relists
            await eventually(lambda: server.store.open_watches == 2, "both watches open")
            server.drop_watches(abrupt=True)
            server.store.put("pods", bound("late", "n1"))
            await eventually(lambda: bool(view.usages_on("n1")), "event after the drop seen")
            assert view.relists == relists  # resumed from the version, no relist
    assert delays and all(d == 1.0 for d in delays)  # first retry of each loop: initial delay


def test_backoff_doubles_up_to_its_bound() -> None:
    backoff = Backoff(0.5, 4.0)
    assert [backoff.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


async def test_relists_when_the_resume_version_has_expired() -> None:
    async with FakeApiServer(history_size=3) as server:
        server.store.put("nodes", gpu_node("n1"))
        server.store.put("pods", bound("a", "n1"))
        async with watching(server, backoff=Backoff(0.01, 0.01)) as view:
            relists = view.relists
            await eventually(lambda: server.store.open_watches == 2, "both watches open")
            # Cut the streams and make history move on past the versions the view holds.
            server.drop_watches(abrupt=True)
            server.store.remove("pods", "default", "a")
            for i in range(10):
                server.store.put("nodes", gpu_node(f"m{i}"))
            # Both loops relist (nodes and pods), in either order.
            await eventually(lambda: view.relists >= relists + 2, "both relists")
            assert len(view.nodes) == 11
            assert view.usages_on("n1") == []  # the deletion it missed is reflected


async def test_an_idle_watch_kept_current_by_bookmarks_resumes_without_a_relist() -> None:
    # History of 5 changes: the pods' churn pushes the nodes watch's version out of it. Only
    # the bookmarks the view asks for (allowWatchBookmarks) move that version on, so the
    # stream re-opened at the server's timeout resumes instead of relisting 5,000 nodes.
    async with FakeApiServer(history_size=5, bookmark_interval_s=0.05) as server:
        server.store.put("nodes", gpu_node("n1"))
        async with watching(server) as view:
            await eventually(lambda: server.store.open_watches == 2, "both watches open")
            for i in range(12):
                server.store.put("pods", bound(f"p{i}", "n1"))
            head = str(server.store.resource_version)
            await eventually(lambda: view._versions.get("nodes") == head, "nodes bookmarked")
            server.drop_watches()  # as the real server ends a stream at its timeout
            server.store.put("nodes", gpu_node("n2"))
            await eventually(lambda: "n2" in view.nodes, "n2 seen on the resumed watch")
            assert server.count("list", "nodes") == 1
            assert view.relists == 2  # the first list of nodes and of pods, no more


async def test_pod_bookmarks_move_the_pod_watch_on_without_breaking_it(caplog) -> None:  # type: ignore[no-untyped-def]
    # The server sends a bookmark as the kind's zero value: a Pod's has "containers": null,
    # which lightkube's Pod model refuses. The view once failed its pods watch on every one
    # and waited a growing pause (up to 30 s) before resuming, blind to deletions meanwhile.
    async with FakeApiServer(bookmark_interval_s=0.05) as server:
        server.store.put("nodes", gpu_node("n1"))
        server.store.put("pods", bound("a", "n1"))
        async with watching(server) as view:
            await eventually(lambda: server.store.open_watches == 2, "both watches open")
            server.store.put("nodes", gpu_node("n2"))  # moves the head past the pods' version
            head = str(server.store.resource_version)
            await eventually(lambda: view._versions.get("pods") == head, "pods bookmarked")
            server.store.remove("pods", "default", "a")
            await eventually(lambda: not view.usages_on("n1"), "a's deletion seen")
            assert server.count("watch", "pods") == 1  # the one stream, never re-opened
            assert view.relists == 2
    assert "watch failed" not in caplog.text


async def test_lists_read_the_json_as_sent_like_the_watches(caplog) -> None:  # type: ignore[no-untyped-def]
    # A listed pod lightkube's Pod model refuses ("containers": null, as in a bookmark) once
    # failed the whole relist, and the view never synced; the list now gives plain JSON.
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("n1"))
        server.store.put("pods", bound("a", "n1"))
        odd = bound("odd", "n1")
        odd["spec"]["containers"] = None  # type: ignore[index]
        server.store.put("pods", odd)
        async with watching(server) as view:
            assert view.relists == 2
            assert "default/a" in [u.key for u in view.usages_on("n1")]
    assert "relist failed" not in caplog.text and "list failed" not in caplog.text


async def test_a_stale_event_never_rolls_a_pod_back() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("n1"))
        async with watching(server) as view:
            old = server.store.put("pods", bound("a", "n1"))
            await eventually(lambda: bool(view.usages_on("n1")), "pod seen")
            newer = dict(old)
            newer["metadata"] = dict(
                old["metadata"], resourceVersion=str(int(old["metadata"]["resourceVersion"]) + 100)
            )
            newer["status"] = {"phase": "Succeeded"}
            view.apply_pod(newer)  # e.g. our own patch reply, ahead of the watch
            assert view.usages_on("n1") == []
            view.apply_pod(old)  # the watch delivering the older version afterwards
            assert view.usages_on("n1") == []


async def test_malformed_allocation_annotation_is_logged_not_fatal(caplog) -> None:  # type: ignore[no-untyped-def]
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("n1"))
        pod = bound("odd", "n1")
        pod["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: "{not json"}  # type: ignore[index]
        server.store.put("pods", pod)
        async with watching(server) as view:
            usage = view.usages_on("n1")
    assert [u.cards for u in usage] == [()]
    assert "annotation kubegpu.io/gpu-allocation: not JSON" in caplog.text


def plain_pod(name: str) -> dict[str, object]:
    """A pod without GPUs: the view keeps its JSON (for binds) but charges it nothing."""
    pod = make_pod(name, requests={"cpu": "100m"})
    pod["spec"]["nodeName"] = "n1"  # type: ignore[index]
    return pod


async def test_per_pod_state_follows_the_live_pods_through_churn() -> None:
    now = [0.0]
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("n1", cards=8))
        async with watching(server, tombstone_s=60.0, clock=lambda: now[0]) as view:
            for wave in range(5):
                names = [f"w{wave}-{i}" for i in range(40)]
                for i, name in enumerate(names):
                    server.store.put("pods", bound(name, "n1") if i % 2 else plain_pod(name))
                for name in names[:30]:  # most go again; ten of each wave stay
                    server.store.remove("pods", "default", name)
                now[0] += 1.0
            live = len(server.store.list("pods"))
            assert live == 50
            await eventually(lambda: view.bookkeeping()["pods"] == live, "churn applied")
            kept = view.bookkeeping()
            assert kept["uids"] == kept["versions"] == kept["claims"] == live
            assert kept["observed"] == kept["on_node"] == live  # all bound: each holds its CPU
            assert kept["tombstones"] == 150  # deletions of the last minute
            # A minute later, one more deletion: the old tombstones are let go.
            now[0] += 61.0
            server.store.remove("pods", "default", "w4-39")
            await eventually(lambda: view.bookkeeping()["pods"] == live - 1, "deletion seen")
            assert view.bookkeeping()["tombstones"] == 1
            assert view.bookkeeping()["versions"] == view.bookkeeping()["claims"] == live - 1


async def test_a_reply_in_flight_when_its_pod_was_deleted_does_not_bring_it_back() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("n1"))
        async with watching(server) as view:
            reply = server.store.put(
                "pods", bound("a", "n1")
            )  # e.g. a patch reply, not applied yet
            await eventually(lambda: bool(view.usages_on("n1")), "pod seen")
            server.store.remove("pods", "default", "a")
            await eventually(lambda: not view.usages_on("n1"), "deletion seen")
            view.apply_pod(reply)  # the bind applying the reply it got before the deletion
            assert view.usages_on("n1") == []
            assert ("default", "a") not in view.pod_json


async def test_a_relist_forgets_every_pod_deleted_while_the_watch_was_down() -> None:
    async with FakeApiServer(history_size=3) as server:
        server.store.put("nodes", gpu_node("n1"))
        server.store.put("pods", bound("gpu", "n1"))
        # Pending pods without GPUs hold nothing (not in view.observed), only their JSON.
        server.store.put("pods", make_pod("plain", requests={"cpu": "100m"}))
        server.store.put("pods", make_pod("stays", requests={"cpu": "100m"}))
        async with watching(server, backoff=Backoff(0.01, 0.01)) as view:
            relists = view.relists
            await eventually(lambda: server.store.open_watches == 2, "both watches open")
            server.drop_watches(abrupt=True)
            server.store.remove("pods", "default", "gpu")
            server.store.remove("pods", "default", "plain")
            for i in range(10):
                server.store.put("nodes", gpu_node(f"m{i}"))
            # Both loops relist (nodes and pods), in either order.
            await eventually(lambda: view.relists >= relists + 2, "both relists")
            assert len(view.nodes) == 11
            assert set(view.pod_json) == {("default", "stays")}
            kept = view.bookkeeping()
            assert kept["uids"] == kept["versions"] == kept["pods"] == 1
            assert kept["observed"] == 0


async def test_the_deletion_of_a_pod_leaves_a_namesake_created_since_alone() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("n1"))
        async with watching(server) as view:
            old = server.store.put("pods", bound("a", "n1"))
            await eventually(lambda: ("default", "a") in view.pod_json, "pod seen")
            # A bind read the namesake created after a deletion the watch has not told of yet.
            new = copy.deepcopy(old)
            new["metadata"]["uid"] = "uid-of-the-namesake"
            new["metadata"]["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 2)
            view.apply_pod(new)
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 1)
            view.apply_pod(gone, deleted=True)  # then the watch's DELETED of the old one
            assert view.pod_json[("default", "a")]["metadata"]["uid"] == "uid-of-the-namesake"
            assert [u.uid for u in view.usages_on("n1")] == ["uid-of-the-namesake"]


def test_a_second_reservation_of_a_pod_is_refused_not_written_over_the_first() -> None:
    view = ClusterView(None)  # type: ignore[arg-type]  # no I/O: reservations are local
    card = CardShare("GPU-a", 0, 600, 4096)
    first = PodUsage("uid-a", "default/a", "node-1", 1000, 1024, (card,), bound=False)
    view.reserve(first)
    with pytest.raises(ReservationHeld, match="default/a"):
        view.reserve(dataclasses.replace(first, node="node-2"))
    # The first still holds its card on node-1; once released, a new one may be made.
    assert view.usages_on("node-1") == [first] and view.usages_on("node-2") == []
    view.unreserve("uid-a")
    view.reserve(dataclasses.replace(first, node="node-2"))
    assert view.usages_on("node-1") == [] and len(view.usages_on("node-2")) == 1


def test_a_tentative_reservation_counts_only_while_the_pod_holds_nothing_else() -> None:
    """One pod counts once: its bind's reservation, then what the API server says, then where
    prioritize expects it (kubegpu.extender.inflight); deleting or binding the pod drops the
    tentative one."""
    view = ClusterView(None)  # type: ignore[arg-type]  # no I/O: reservations are local
    card = CardShare("GPU-a", 0, 600, 4096)
    expected = PodUsage("uid-a", "default/a", "node-1", 1000, 1024, (card,), bound=False)
    view.hold_tentative(expected)
    view.hold_tentative(dataclasses.replace(expected, node="node-2"))  # scored again: replaced
    assert view.usages_on("node-1") == [] and len(view.usages_on("node-2")) == 1
    view.reserve(expected)  # its bind: the reservation wins, the tentative one is not added
    assert view.usages_on("node-1") == [expected] and view.usages_on("node-2") == []
    view.unreserve("uid-a")
    assert [u.node for u in view.usages_on("node-2")] == ["node-2"]
    assert view.drop_tentative("uid-a") is not None and view.usages_on("node-2") == []
    assert view.drop_tentative("uid-a") is None

    pod = whole_pod("a", 1)
    pod["metadata"].update(uid="uid-a", resourceVersion="5")
    view.hold_tentative(expected)
    view.apply_pod(pod)  # pending, nothing decided: still expected on node-1
    assert view.usages_on("node-1") == [expected]
    bound = copy.deepcopy(pod)
    bound["metadata"]["resourceVersion"] = "6"
    bound["spec"]["nodeName"] = "node-3"  # bound by someone else
    view.apply_pod(bound)
    assert view.tentative == {} and view.usages_on("node-1") == []
    assert [u.node for u in view.usages_on("node-3")] == ["node-3"]
    view.hold_tentative(dataclasses.replace(expected, uid="uid-b", key="default/b"))
    other = whole_pod("b", 1)
    other["metadata"].update(uid="uid-b", resourceVersion="7")
    view.apply_pod(other, deleted=True)
    assert view.tentative == {} and view.usages_on("node-1") == []


def test_a_pod_the_view_holds_is_parsed_once_and_reread_when_it_changes() -> None:
    """A bind reads the pod the watch brought (``claim_of``): the claim the view read when it
    stored that object, not a second parse; a newer object, or one the view does not hold,
    is read afresh."""
    view = ClusterView(None)  # type: ignore[arg-type]  # no I/O
    pod = whole_pod("a", 1)
    pod["metadata"].update(uid="uid-a", resourceVersion="5")
    view.apply_pod(pod)
    held = view.pod_json[("default", "a")]
    claim = view.claim_of(held)
    assert view.claim_of(held) is claim
    assert (claim.uid, claim.node, claim.request is not None) == ("uid-a", "", True)
    outside = copy.deepcopy(held)  # equal, but not the object the view holds
    assert view.claim_of(outside) is not claim and view.claim_of(outside) == claim
    bound = copy.deepcopy(pod)
    bound["metadata"]["resourceVersion"] = "6"
    bound["spec"]["nodeName"] = "node-1"
    view.apply_pod(bound)
    assert view.claim_of(view.pod_json[("default", "a")]).node == "node-1"
    view.apply_pod(bound, deleted=True)
    assert view.bookkeeping()["claims"] == 0
