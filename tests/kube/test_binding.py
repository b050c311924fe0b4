"""The extender's pod port on lightkube, against the fake API server over HTTP: annotation
patches with a resourceVersion precondition, the Binding, and lightkube's errors translated."""

from __future__ import annotations

import pytest

from kubegpu.kube.binding import ApiPodStore
from kubegpu.sharing.podstore import PodConflict, PodGone, PodStoreError
from kubegpu.testing.apiserver import FakeApiServer, make_pod


async def test_patches_annotations_on_the_version_read_and_refuses_a_stale_one() -> None:
    async with FakeApiServer() as server:
        server.store.put("pods", make_pod("p"))
        client = server.async_client()
        try:
            store = ApiPodStore(client)
            pod = await store.get("default", "p")
            version = pod["metadata"]["resourceVersion"]
            patched = await store.patch_annotations("default", "p", {"a": "1"}, version)
            assert patched["metadata"]["annotations"] == {"a": "1"}
            with pytest.raises(PodConflict) as conflict:
                await store.patch_annotations("default", "p", {"a": None}, version)
            assert conflict.value.code == 409
            cleared = await store.patch_annotations("default", "p", {"a": None}, "")
            assert "a" not in (cleared["metadata"].get("annotations") or {})
        finally:
            await client.close()


async def test_binds_and_names_a_missing_pod() -> None:
    async with FakeApiServer() as server:
        server.store.put("pods", make_pod("p"))
        client = server.async_client()
        try:
            store = ApiPodStore(client)
            uid = (await store.get("default", "p"))["metadata"]["uid"]
            await store.bind("default", "p", uid, "n1")
            assert (await store.get("default", "p"))["spec"]["nodeName"] == "n1"
            with pytest.raises(PodGone) as gone:
                await store.get("default", "nope")
            assert gone.value.code == 404 and isinstance(gone.value, PodStoreError)
        finally:
            await client.close()
