"""kubegpu's watches against the real kube-apiserver: a BOOKMARK, which the server sends as the
kind's zero value with only the version set, reaches every view as a version to resume from,
and the fake API server of the unit tests sends the same object.

A watch whose ``timeoutSeconds`` is short gets its bookmark within seconds: the watch cache
sends one 2 s before a watch's deadline (k8s.io/apiserver's cacheWatcher), besides the one
about every minute that once stalled the extender's pod view after each (the Pod's zero value,
``"spec": {"containers": null}``, failed lightkube's model)."""

from __future__ import annotations

import asyncio
from typing import Any

import lightkube
import pytest
from kubegpu_e2e.cluster import Cluster
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from kubegpu.kube.client import load_kubeconfig_file
from kubegpu.kube.list_watch import watch_events
from kubegpu.testing.apiserver.resources import RESOURCE_TYPES
from kubegpu.testing.apiserver.store import bookmark_object

pytestmark = pytest.mark.e2e

SERVER_TIMEOUT_S = 4  # its bookmark comes 2 s before this deadline


async def _first_bookmark(cluster: Cluster, kind: type[Any], namespaced: bool) -> dict[str, Any]:
    """The object of the first BOOKMARK event of a watch of ``kind`` from version "0".

    From "0" (any version), not from a fresh list's: the watch cache drops a bookmark at a
    version the watch started past, and the version it holds for a kind nobody writes (the
    ResourceClaims of this cluster) can trail a list's for minutes."""
    client = lightkube.AsyncClient(load_kubeconfig_file(cluster.admin))
    where = {"namespace": "*"} if namespaced else {}
    try:
        stream = watch_events(
            client, kind, resource_version="0", server_timeout=SERVER_TIMEOUT_S, **where
        )
        async for event, obj in stream:
            if event == "BOOKMARK":
                return dict(obj)
        raise AssertionError("the watch ended without a bookmark")
    finally:
        await client.close()


@pytest.mark.parametrize(
    "kind", [Pod, Node, ResourceClaim, ResourceSlice], ids=lambda k: k.__name__
)
def test_a_real_bookmark_reaches_the_watch_as_a_version_and_the_fake_server_sends_the_same(
    cluster: Cluster, kind: type[Any]
) -> None:
    rtype = next(t for t in RESOURCE_TYPES if t.kind == kind.__name__)
    real = asyncio.run(
        asyncio.wait_for(_first_bookmark(cluster, kind, rtype.namespaced), timeout=60)
    )
    version = real["metadata"]["resourceVersion"]
    assert int(version) > 0

    fake = bookmark_object(rtype, version)
    # The server marks the bookmark that ends a watch's initial events; a resumed watch has none.
    real["metadata"].pop("annotations", None)
    assert fake == real
