"""Bind under interference, over real HTTP against the fake API server: a writer that changes
the pod between the extender's read and its decision patch (409 on the resourceVersion the
patch carries, then a re-read and a fresh decision), a pod that keeps changing, a Binding that
fails (the recorded decision is rolled back, so its cards are free for the next pod) and one
whose reply is lost after it landed (the decision stays with the bound pod)."""

from __future__ import annotations

from typing import Any

import aiohttp

from kubegpu.kube.list_watch import Backoff
from kubegpu.roles.extender import ExtenderService
from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION, decode_allocation
from kubegpu.sharing.podstore import PodStoreError
from kubegpu.sharing.resources import GPU_MODELS_ANNOTATION
from kubegpu.testing.apiserver import FakeApiServer, StatusError, Store
from kubegpu.testing.waiting import wait_until_async
from tests.extender.cluster import (
    T4,
    V100,
    gpu_node,
    http_session,
    mixed_node,
    post,
    running_extender,
    shared_pod,
    whole_pod,
)


def stored(server: FakeApiServer, name: str) -> dict[str, Any]:
    pod = server.store.get("pods", "default", name)
    assert pod is not None
    return pod


async def seen(ext: ExtenderService, server: FakeApiServer, name: str) -> None:
    """Wait until the extender's watch holds the stored version of pod ``name`` (its bind then
    starts from that cached copy, as it does in a running cluster)."""
    want = stored(server, name)["metadata"]["resourceVersion"]

    def holds_it() -> bool:
        pod = ext.view.pod_json.get(("default", name))
        return pod is not None and pod["metadata"]["resourceVersion"] == want

    await wait_until_async(holds_it, timeout_s=10, what=f"the extender's view holding pod {name}")


async def bind(
    http: aiohttp.ClientSession, ext: ExtenderService, server: FakeApiServer, name: str, node: str
) -> str:
    uid = stored(server, name)["metadata"]["uid"]
    status, body = await post(
        http,
        f"{ext.url}/bind",
        {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": node},
    )
    assert status == 200, body
    error: str = body["Error"]
    return error


def decision_of(server: FakeApiServer, name: str) -> Any:
    raw = (stored(server, name)["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION)
    return None if raw is None else decode_allocation(raw)


async def metric(http: aiohttp.ClientSession, ext: ExtenderService, line_start: str) -> str:
    async with http.get(f"{ext.url}/metrics") as response:
        text = await response.text()
    return next(line for line in text.splitlines() if line.startswith(line_start))


async def test_a_pod_changed_between_read_and_patch_is_read_again_and_decided_afresh() -> None:
    async with FakeApiServer() as server:
        # Two identical mixed nodes: on node-c an unrestricted pod shows which card the policy
        # picks; on node-m the same pod is restricted to the *other* model by a writer that
        # lands between the extender's read and its decision patch.
        for node in ("node-c", "node-m"):
            server.store.put("nodes", mixed_node(node, [(V100, 16384), (T4, 15360)]))
        server.store.put("pods", shared_pod("control", 4096, 300))
        server.store.put("pods", shared_pod("p", 4096, 300))
        async with running_extender(server) as ext, http_session() as http:
            assert await bind(http, ext, server, "control", "node-c") == ""
            picked = decision_of(server, "control").cards[0].index
            other_model = T4 if picked == 0 else V100
            await seen(ext, server, "p")

            def restrict(store: Store) -> None:
                pod = stored(server, "p")
                pod["metadata"]["annotations"][GPU_MODELS_ANNOTATION] = other_model
                pod["metadata"]["labels"]["changed-by"] = "someone-else"
                store.put("pods", pod)

            server.before("create", "pods/binding", restrict, name="p")
            gets, bindings = server.count("get", "pods"), server.count("create", "pods/binding")
            assert await bind(http, ext, server, "p", "node-m") == ""
            conflicts = await metric(http, ext, "kubegpu_extender_bind_conflicts_total ")
        pod = stored(server, "p")
    decision = decision_of(server, "p")
    # Decided again on the pod as the other writer left it: the card of the model it now asks.
    assert decision.node == pod["spec"]["nodeName"] == "node-m"
    assert decision.cards[0].index == 1 - picked
    assert pod["metadata"]["labels"]["changed-by"] == "someone-else"  # nothing clobbered
    # The stale Binding was refused (409), the pod read again, and a second one applied.
    assert conflicts == "kubegpu_extender_bind_conflicts_total 1.0"
    assert server.count("create", "pods/binding") - bindings == 2
    assert server.count("get", "pods") - gets == 1


async def test_a_pod_that_keeps_changing_is_refused_and_its_cards_stay_free() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=1))
        server.store.put("pods", whole_pod("busy", 1))
        server.store.put("pods", whole_pod("next", 1))

        def touch(store: Store) -> None:
            pod = stored(server, "busy")
            pod["metadata"]["labels"]["touched"] = str(int(pod["metadata"]["resourceVersion"]))
            store.put("pods", pod)

        async with running_extender(server, bind_attempts=3) as ext, http_session() as http:
            await seen(ext, server, "busy")
            server.before("create", "pods/binding", touch, name="busy", count=3)
            error = await bind(http, ext, server, "busy", "node-a")
            assert error == "pod default/busy: kept changing while binding (3 attempts)"
            assert decision_of(server, "busy") is None
            assert ext.view.reservations == {}
            # The one card it was reserved on went back: the next pod gets it.
            assert await bind(http, ext, server, "next", "node-a") == ""
    assert stored(server, "busy")["spec"].get("nodeName") is None
    assert stored(server, "next")["spec"]["nodeName"] == "node-a"


async def test_a_failed_binding_rolls_the_decision_back_and_frees_the_cards() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=1))
        server.store.put("pods", whole_pod("first", 1))
        server.store.put("pods", whole_pod("second", 1))

        def etcd_timeout(store: Store) -> None:
            raise StatusError("InternalError", "etcdserver: request timed out")

        async with running_extender(server) as ext, http_session() as http:
            server.before("create", "pods/binding", etcd_timeout, name="first")
            error = await bind(http, ext, server, "first", "node-a")
            assert error == (
                "pod default/first: binding to node-a failed: etcdserver: request timed out"
            )
            assert decision_of(server, "first") is None  # rolled back on the pod
            assert ext.view.usage(stored(server, "first")["metadata"]["uid"]) is None
            # Its card is free again: the second pod takes it.
            assert await bind(http, ext, server, "second", "node-a") == ""
    assert stored(server, "first")["spec"].get("nodeName") is None
    assert decision_of(server, "second").cards[0].index == 0
    assert stored(server, "second")["spec"]["nodeName"] == "node-a"


async def test_a_binding_that_landed_though_its_reply_was_lost_keeps_its_decision() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=1))
        server.store.put("pods", whole_pod("first", 1))
        server.store.put("pods", whole_pod("second", 1))

        async with running_extender(server) as ext, http_session() as http:
            real_bind = ext.app.pods.bind

            async def lands_then_times_out(*args: Any, **kwargs: Any) -> None:
                # The API server applies the Binding (decision and node in one write), and
                # the reply is lost on the way back.
                await real_bind(*args, **kwargs)
                raise PodStoreError("the server was unable to return a response in time")

            ext.app.pods.bind = lands_then_times_out  # type: ignore[method-assign]
            # The pod is on node-a with the cards the decision names: the bind did happen.
            assert await bind(http, ext, server, "first", "node-a") == ""
            assert decision_of(server, "first").cards[0].index == 0
            # So its card is not free: the second pod is refused instead of sharing it.
            assert await bind(http, ext, server, "second", "node-a") == (
                "node-a: needs 1 whole GPUs, 0 free"
            )
    assert stored(server, "second")["spec"].get("nodeName") is None


async def test_a_pod_recreated_under_its_name_is_bound_though_the_watch_lags() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=1))
        server.store.put("pods", whole_pod("p", 1))
        # Watches dropped below stay down for a minute: the view keeps the deleted pod.
        async with (
            running_extender(server) as ext,
            http_session() as http,
        ):
            ext.view.backoff = Backoff(60.0, 60.0)
            await seen(ext, server, "p")
            old_uid = stored(server, "p")["metadata"]["uid"]
            await server.wait_for_watches(2)
            server.drop_watches(abrupt=True)
            server.store.remove("pods", "default", "p")
            server.store.put("pods", whole_pod("p", 1))  # same name, new UID
            assert ext.view.pod_json[("default", "p")]["metadata"]["uid"] == old_uid
            # kube-scheduler binds the new pod: the extender reads it instead of refusing.
            assert await bind(http, ext, server, "p", "node-a") == ""
    assert stored(server, "p")["spec"]["nodeName"] == "node-a"
    assert decision_of(server, "p") is not None
