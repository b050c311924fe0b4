"""``FakeApiServer.before``: a test's action runs just before a matching request is served, so a
concurrent writer lands between a client's read and its write, a request can be failed, or
held until the test lets it go. Over real HTTP with the async lightkube client."""

from __future__ import annotations

import asyncio

import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from kubegpu.testing.apiserver import FakeApiServer, StatusError, Store, make_pod


def bump(store: Store) -> None:
    """Another writer changes pod p between the client's read and its patch."""
    pod = store.get("pods", "default", "p")
    assert pod is not None
    pod["metadata"].setdefault("labels", {})["writer"] = "other"
    store.put("pods", pod)


async def test_a_write_landing_first_makes_the_clients_precondition_stale() -> None:
    async with FakeApiServer() as server:
        server.store.put("pods", make_pod("p"))
        client = server.async_client()
        try:
            read = await client.get(Pod, "p", namespace="default")
            version = read.metadata.resourceVersion  # type: ignore[union-attr]
            server.before("patch", "pods", bump, name="p")
            patch = {"metadata": {"resourceVersion": version, "labels": {"mine": "x"}}}
            with pytest.raises(ApiError) as excinfo:
                await client.patch(Pod, "p", patch, namespace="default", patch_type=PatchType.MERGE)
            assert excinfo.value.status.code == 409
            stored = server.store.get("pods", "default", "p")
            assert stored is not None
            assert stored["metadata"]["labels"] == {"writer": "other"}  # ours never applied
            # The hook ran once (count=1): a second patch, without a precondition, applies.
            await client.patch(
                Pod, "p", {"metadata": {"labels": {"mine": "x"}}}, namespace="default"
            )
            stored = server.store.get("pods", "default", "p")
            assert stored is not None
            assert stored["metadata"]["labels"] == {"writer": "other", "mine": "x"}
        finally:
            await client.close()


async def test_only_matching_requests_run_the_action_and_an_error_it_raises_is_the_answer() -> None:
    def fail(store: Store) -> None:
        raise StatusError("InternalError", "etcdserver: request timed out")

    async with FakeApiServer() as server:
        server.store.put("pods", make_pod("p"))
        server.store.put("pods", make_pod("q"))
        client = server.async_client()
        try:
            server.before("get", "pods", fail, name="p", count=2)
            assert (await client.get(Pod, "q", namespace="default")).metadata.name == "q"  # type: ignore[union-attr]
            for _ in range(2):
                with pytest.raises(ApiError) as excinfo:
                    await client.get(Pod, "p", namespace="default")
                assert excinfo.value.status.code == 500
                assert excinfo.value.status.message == "etcdserver: request timed out"
            assert (await client.get(Pod, "p", namespace="default")).metadata.name == "p"  # type: ignore[union-attr]
        finally:
            await client.close()


async def test_an_async_action_holds_the_request_until_released() -> None:
    release = asyncio.Event()
    arrived = asyncio.Event()

    async def hold(store: Store) -> None:
        arrived.set()
        await release.wait()

    async with FakeApiServer() as server:
        server.store.put("pods", make_pod("p"))
        client = server.async_client()
        try:
            server.before("patch", "pods", hold)
            patching = asyncio.create_task(
                client.patch(Pod, "p", {"metadata": {"labels": {"a": "b"}}}, namespace="default")
            )
            await asyncio.wait_for(arrived.wait(), 10)
            # A round trip through the same server: a hook that did not hold the patch would
            # have let it finish (it awaits nothing else) while this was served.
            await client.get(Pod, "p", namespace="default")
            assert not patching.done()
            stored = server.store.get("pods", "default", "p")
            assert stored is not None and stored["metadata"]["labels"] == {}
            release.set()
            patched = await asyncio.wait_for(patching, 10)
            assert patched.metadata.labels == {"a": "b"}  # type: ignore[union-attr]
        finally:
            await client.close()
