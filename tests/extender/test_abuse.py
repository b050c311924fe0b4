"""The extender's listeners under a hostile or broken client, over real sockets: bodies that are
not UTF-8, requests whose head or body never finishes, many large bodies at once. Each is
answered (400, 408, 413, 503) or dropped, within a bound the settings give, and the memory held
for bodies is bounded and given back. Behaviour is asserted, never how fast it happened: every
wait below is a generous upper bound."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kubegpu.roles.extender import ExtenderService
from kubegpu.testing.apiserver import FakeApiServer
from kubegpu.testing.waiting import wait_until_async
from tests.extender.cluster import filter_args, gpu_node, http_session, running_extender, whole_pod

KIB = 1024


@contextlib.asynccontextmanager
async def extender(**settings: Any) -> AsyncIterator[ExtenderService]:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a"))
        async with running_extender(server, **settings) as ext:
            yield ext


async def metric(ext: ExtenderService, line_start: str) -> float:
    async with http_session() as http, http.get(f"{ext.url}/metrics") as response:
        text = await response.text()
    found = [line for line in text.splitlines() if line.startswith(line_start)]
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0


async def raw_request(ext: ExtenderService, head: bytes, body: bytes = b"") -> tuple[Any, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", ext.port)
    writer.write(head + body)
    await writer.drain()
    return reader, writer


async def closed_by_server(reader: asyncio.StreamReader, within_s: float = 20.0) -> bytes:
    """Everything the server sent until it closed the connection (fails if it never does)."""
    return await asyncio.wait_for(reader.read(), within_s)


def head(path: str, length: int | None, *, chunked: bool = False) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: extender", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize(
    ("verb", "body"),
    [
        ("filter", b'{"Pod":{"metadata":{"name":"\xff"}},"Nodes":null,"NodeNames":["node-a"]}'),
        ("prioritize", b'{"Pod":{"metadata":{}},"Nodes":null,"NodeNames":["\xc3"]}'),
        ("bind", b'{"PodName":"\xff\xfe","PodNamespace":"d","PodUID":"u","Node":"node-a"}'),
    ],
)
async def test_a_body_that_is_not_utf8_is_a_counted_400(verb: str, body: bytes) -> None:
    async with extender() as ext, http_session() as http:
        before = await metric(ext, f'kubegpu_extender_bad_requests_total{{verb="{verb}"}}')
        async with http.post(f"{ext.url}/{verb}", data=body) as response:
            status, answer = response.status, await response.json(content_type=None)
        after = await metric(ext, f'kubegpu_extender_bad_requests_total{{verb="{verb}"}}')
    assert status == 400, answer
    assert "UTF-8" in answer["Error"] or "utf-8" in answer["Error"]
    assert after == before + 1


async def test_requests_whose_head_never_ends_are_dropped() -> None:
    async with extender(request_head_timeout_s=0.5) as ext:
        half = b"POST /filter HTTP/1.1\r\nHost: extender\r\nContent-Le"
        connections = [await raw_request(ext, half) for _ in range(50)]
        for reader, writer in connections:
            assert await closed_by_server(reader) == b""
            writer.close()
        # The listener still serves whole requests.
        async with http_session() as http, http.get(f"{ext.url}/healthz") as response:
            assert response.status == 200


async def test_a_body_that_never_ends_is_answered_408_and_dropped() -> None:
    async with extender(request_body_timeout_s=0.5) as ext:
        reader, writer = await raw_request(ext, head("/filter", 1000), b'{"Pod": {')
        answer = await closed_by_server(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert await metric(ext, "kubegpu_extender_request_body_bytes_in_flight") == 0
        assert await metric(ext, 'kubegpu_extender_requests_refused_total{reason="timeout"}') == 1


async def test_bodies_past_the_in_flight_budget_are_refused_at_once_and_the_bytes_given_back() -> (
    None
):
    async with extender(max_body_bytes=512 * KIB, max_inflight_body_bytes=1024 * KIB) as ext:
        # Two large bodies, each announced at 400 KiB and a quarter sent: 800 KiB held.
        held = []
        for _ in range(2):
            held.append(await raw_request(ext, head("/filter", 400 * KIB), b" " * (100 * KIB)))

        async def both_held() -> bool:
            return await metric(ext, "kubegpu_extender_request_body_bytes_in_flight") >= 800 * KIB

        await wait_until_async(both_held, timeout_s=10, what="800 KiB of bodies held", poll_s=0.02)
        # A third, announced and chunked: both refused before their bodies arrive.
        reader, writer = await raw_request(ext, head("/filter", 400 * KIB))
        answer = await closed_by_server(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        reader, writer = await raw_request(
            ext, head("/filter", None, chunked=True), b"40000\r\n" + b" " * 0x40000 + b"\r\n"
        )
        answer = await closed_by_server(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert await metric(ext, 'kubegpu_extender_requests_refused_total{reason="busy"}') == 2

        # The clients give up: what their bodies held is given back, and a whole request fits.
        for _, w in held:
            w.close()

        async def given_back() -> bool:
            return await metric(ext, "kubegpu_extender_request_body_bytes_in_flight") == 0

        with contextlib.suppress(TimeoutError):
            await wait_until_async(given_back, timeout_s=10, what="bodies given back", poll_s=0.02)
        assert await metric(ext, "kubegpu_extender_request_body_bytes_in_flight") == 0
        async with http_session() as http:
            body = filter_args(whole_pod("p", 1), ["node-a"])
            async with http.post(f"{ext.url}/filter", json=body) as response:
                assert response.status == 200
                assert (await response.json())["NodeNames"] == ["node-a"]


async def test_a_body_over_the_limit_is_413_before_it_is_read() -> None:
    async with extender(max_body_bytes=64 * KIB) as ext:
        reader, writer = await raw_request(ext, head("/filter", 10 * 1024 * KIB))
        answer = await closed_by_server(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"max-body-bytes" in answer
        # Chunked, no length announced: refused once the limit is passed.
        async with http_session() as http:

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(100):
                    yield b" " * (4 * KIB)

            with contextlib.suppress(aiohttp.ClientError):
                async with http.post(f"{ext.url}/filter", data=chunks()) as response:
                    assert response.status == 413
        assert await metric(ext, "kubegpu_extender_request_body_bytes_in_flight") == 0


def realistic_node(name: str) -> dict[str, Any]:
    """A Node as a real cluster serves it, about 15 KiB: the cached images make most of it."""
    node = gpu_node(name, cards=1)
    node["metadata"]["labels"].update(
        {f"feature.node.kubernetes.io/f-{i}": "true" for i in range(40)}
    )
    node["status"]["images"] = [
        {
            "names": [
                f"registry.example.com/team-{i}/image-{i}@sha256:{'0' * 64}",
                f"registry.example.com/team-{i}/image-{i}:v1.{i}.0",
            ],
            "sizeBytes": 123456789 + i,
        }
        for i in range(66)
    ]
    return node


async def test_without_node_caching_a_filter_of_1213_full_nodes_needs_the_matching_setting() -> (
    None
):
    nodes = [realistic_node(f"node-{i:04d}") for i in range(1213)]
    pod = whole_pod("p", 1)
    body = json.dumps(
        {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
    ).encode()
    assert len(body) > 16 * 1024 * 1024  # what the old 16 MiB default claimed to cover
    async with FakeApiServer() as server:
        server.store.put("nodes", nodes[0])
        server.store.put("nodes", nodes[1])
        # Set up for kube-scheduler's usual nodeCacheCapable: true: refused, saying why.
        async with running_extender(server) as ext, http_session() as http:
            headers = {"Content-Type": "application/json"}
            async with http.post(
                f"{ext.url}/filter", data=io.BytesIO(body), headers=headers
            ) as response:
                status, answer = response.status, await response.json(content_type=None)
            assert status == 413
            assert "nodeCacheCapable: false" in answer["Error"]
            assert "node-cache-capable: false" in answer["Error"]
        # Told the scheduler sends full Nodes: served, the passing Nodes echoed back whole.
        async with (
            running_extender(server, node_cache_capable=False) as ext,
            http_session() as http,
            http.post(f"{ext.url}/filter", data=io.BytesIO(body), headers=headers) as response,
        ):
            status, answer = response.status, await response.json()
    assert status == 200
    assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == ["node-0000", "node-0001"]
    assert answer["Nodes"]["items"][0]["status"]["images"] == nodes[0]["status"]["images"]
    assert len(answer["FailedNodes"]) + len(answer["FailedAndUnresolvableNodes"]) == 1211


async def test_the_metrics_listener_drops_heads_that_never_end_too() -> None:
    async with extender(metrics_port=0, request_head_timeout_s=0.5) as ext:
        assert ext.metrics_port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", ext.metrics_port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAcc")
        await writer.drain()
        assert await closed_by_server(reader) == b""
        writer.close()


async def test_a_post_to_no_verb_is_404_without_its_body_being_read() -> None:
    async with extender(max_body_bytes=64 * KIB) as ext:
        reader, writer = await raw_request(ext, head("/nosuch", 32 * KIB), b"{")
        status_line = await asyncio.wait_for(reader.readline(), 20)
        writer.close()
        assert status_line.startswith(b"HTTP/1.1 404")
        assert await metric(ext, "kubegpu_extender_request_body_bytes_in_flight") == 0
