"""Asking every GPU node's exporter what is in use, within one deadline.

A report must come back even when half the exporters are down, firewalled or slow, so every
fetch runs concurrently (at most ``concurrency`` at a time) under one overall deadline; a node
that has not answered by then gets an error result and shows ``?``. Never raises for a node's
failure. The URL of a node's exporter comes from a template with ``{node}`` (the Node's name),
``{address}`` (its InternalIP, else ExternalIP, else hostname) and ``{pod_ip}`` (the IP of the
node agent pod on that node, found by label among the listed pods — the shipped DaemonSet
serves the exporter on its pod network, not the host's — else the node's address).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp

from kubegpu.inspect.usage import UsageParseError, UsageResult, parse_exporter_metrics

log = logging.getLogger(__name__)

DEFAULT_URL_TEMPLATE = "http://{pod_ip}:9400/metrics"
DEFAULT_EXPORTER_LABEL = "app.kubernetes.io/name=kubegpu-node-agent"
# A metrics page for 8 GPUs and 100 pods is ~100 KiB; anything far larger is not ours.
MAX_PAGE_BYTES = 16 * 2**20


def exporter_url(template: str, node: str, address: str, pod_ip: str = "") -> str:
    """``template`` filled for one node; raises ``ValueError`` for unknown placeholders."""
    try:
        return template.format(node=node, address=address or node, pod_ip=pod_ip or address or node)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"exporter URL template {template!r}: bad placeholder {exc}; "
            "use {node}, {address} and {pod_ip}"
        ) from None


def exporter_pod_ips(pods: Iterable[Mapping[str, Any]], label: str) -> dict[str, str]:
    """Node name -> IP of a running pod carrying ``label`` (``key=value``) on that node."""
    key, _, value = label.partition("=")
    found: dict[str, str] = {}
    for pod in pods:
        meta = pod.get("metadata")
        labels = meta.get("labels") if isinstance(meta, Mapping) else None
        if not isinstance(labels, Mapping) or labels.get(key) != value:
            continue
        spec, status = pod.get("spec"), pod.get("status")
        node = spec.get("nodeName") if isinstance(spec, Mapping) else None
        ip = status.get("podIP") if isinstance(status, Mapping) else None
        if isinstance(status, Mapping) and status.get("phase") != "Running":
            continue
        if isinstance(node, str) and node and isinstance(ip, str) and ip:
            found[node] = ip
    return found


async def fetch_usage(
    urls: Mapping[str, str],
    *,
    timeout_s: float = 2.0,
    concurrency: int = 64,
) -> dict[str, UsageResult]:
    """One :class:`UsageResult` per node in ``urls`` (node -> metrics URL), all within about
    ``timeout_s`` seconds in total."""
    results: dict[str, UsageResult] = {
        node: UsageResult(node, url, error=f"no answer within {timeout_s:g} s")
        for node, url in urls.items()
    }
    if not urls:
        return results
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)

    async def one(session: aiohttp.ClientSession, node: str, url: str) -> None:
        async with gate:
            results[node] = await _fetch_one(session, node, url)

    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        tasks = [asyncio.create_task(one(session, n, u)) for n, u in urls.items()]
        _, late = await asyncio.wait(tasks, timeout=timeout_s)
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)
    return results


async def _fetch_one(session: aiohttp.ClientSession, node: str, url: str) -> UsageResult:
    try:
        async with session.get(url, headers={"Accept": "text/plain"}) as response:
            if response.status != 200:
                return UsageResult(node, url, error=f"HTTP {response.status}")
            body = await response.content.read(MAX_PAGE_BYTES + 1)
            if len(body) > MAX_PAGE_BYTES:
                return UsageResult(node, url, error="metrics page too large")
        usage = parse_exporter_metrics(body.decode("utf-8", errors="replace"))
    except TimeoutError:
        return UsageResult(node, url, error="timed out")
    except UsageParseError as exc:
        return UsageResult(node, url, error=str(exc))
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        log.debug("node %s: exporter %s: %s", node, url, error)
        return UsageResult(node, url, error=error)
    return UsageResult(node, url, usage)
