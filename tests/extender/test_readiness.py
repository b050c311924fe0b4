"""Before its first list of nodes and pods the extender is alive but not ready, over real HTTP:
/readyz answers 503 (so no Service or probe sends it work), /healthz 200, and filter and bind
answer an Error instead of deciding on an empty view; once the list arrives it is ready. The
metrics listener, where the deploy overlays point their probes, says the same."""

from __future__ import annotations

import asyncio

from kubegpu.config.extender import ExtenderConfig
from kubegpu.kube.list_watch import Backoff
from kubegpu.roles.extender import ExtenderService
from kubegpu.testing.apiserver import FakeApiServer, Store
from tests.extender.cluster import filter_args, gpu_node, http_session, post, shared_pod

NOT_SYNCED = "kubegpu extender has not synced yet"


async def test_not_ready_until_the_first_list_then_ready() -> None:
    arrived = asyncio.Event()
    release = asyncio.Event()

    async def slow_list(store: Store) -> None:
        arrived.set()
        await release.wait()

    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a"))
        pod = server.store.put("pods", shared_pod("p", 1024, 100))
        server.before("list", "pods", slow_list)  # the pods list hangs until released
        client = server.async_client()
        config = ExtenderConfig(port=0, metrics_port=0)
        service = ExtenderService(config, client=client, backoff=Backoff(0.01, 0.05))
        try:
            async with service, http_session() as http:
                await asyncio.wait_for(arrived.wait(), 10)
                for url in (service.url, service.metrics_url):
                    async with http.get(f"{url}/readyz") as r:
                        assert (r.status, await r.text()) == (503, "not synced"), url
                    async with http.get(f"{url}/healthz") as r:
                        assert r.status == 200, url
                _, body = await post(http, f"{service.url}/filter", filter_args(pod, ["node-a"]))
                assert body["Error"] == NOT_SYNCED and body["NodeNames"] == []
                binding = {
                    "PodName": "p",
                    "PodNamespace": "default",
                    "PodUID": pod["metadata"]["uid"],
                    "Node": "node-a",
                }
                assert await post(http, f"{service.url}/bind", binding) == (
                    200,
                    {"Error": NOT_SYNCED},
                )

                release.set()
                await service.wait_synced(10)  # the first list is in
                async with http.get(f"{service.url}/readyz") as r:
                    assert (r.status, await r.text()) == (200, "ok")
                async with http.get(f"{service.metrics_url}/readyz") as r:
                    assert (r.status, await r.text()) == (200, "ok")
                _, body = await post(http, f"{service.url}/filter", filter_args(pod, ["node-a"]))
                assert body["Error"] == "" and body["NodeNames"] == ["node-a"]
        finally:
            await client.close()
    stored = server.store.get("pods", "default", "p")
    assert stored is not None and stored["spec"].get("nodeName") is None  # nothing bound early
