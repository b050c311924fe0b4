"""Serving the exporter over HTTP: registry, refresher and server from sources it is handed.

What those sources are (NVML or the fake's metrics, the kubelet's PodResources, where pod
names come from, who judges health) is the role's choice: :mod:`kubegpu.roles.exporter`.

``/metrics`` renders an explicit registry (never the global one) with prometheus_client's own
encoders, so content negotiation between the text format and OpenMetrics (by ``Accept``), the
``name[]`` filter and gzip follow the library. Rendering runs in a worker thread, so a slow
scrape never holds up ``/healthz``. ``/healthz`` answers 200 while the snapshot is fresher than
``stale_after_s`` and 503 otherwise, so a liveness probe restarts an exporter whose NVML reads
are stuck.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.core.health_feed import HealthFeed
from kubegpu.core.metrics import MetricsSource
from kubegpu.exporter.cgroups import ProcPodResolver
from kubegpu.exporter.collector import GpuCollector
from kubegpu.exporter.pods import (
    PodDirectory,
    PodResourcesSource,
    PodShareLookup,
)
from kubegpu.exporter.refresher import Refresher
from kubegpu.httpd import HttpLimits, HttpThread, hardened_app, text_response

log = logging.getLogger(__name__)


# Scrapes and probes are GETs without a body.
EXPORTER_LIMITS = HttpLimits(max_body_bytes=1024, max_inflight_body_bytes=64 * 1024)


def render_metrics(
    registry: CollectorRegistry, accept: str, accept_encoding: str, names: list[str]
) -> tuple[bytes, dict[str, str]]:
    """The registry as a scrape asked for it: body and headers."""
    encoder, content_type = choose_encoder(accept)
    source = registry.restricted_registry(names) if names else registry
    body = encoder(source)
    headers = {"Content-Type": content_type}
    if gzip_accepted(accept_encoding):
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    return body, headers


def make_app(
    registry: CollectorRegistry,
    refresher: Refresher,
    stale_after_s: float,
    limits: HttpLimits = EXPORTER_LIMITS,
) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        body, headers = await asyncio.to_thread(
            render_metrics,
            registry,
            request.headers.get("Accept", ""),
            request.headers.get("Accept-Encoding", ""),
            request.query.getall("name[]", []),
        )
        return web.Response(body=body, headers=headers)

    async def healthz(request: web.Request) -> web.Response:
        latest = refresher.latest()
        since = refresher.started_at if latest is None else latest.taken_at
        age = refresher.clock() - since
        fresh = age <= stale_after_s
        return text_response(
            200 if fresh else 503, f"{'ok' if fresh else 'stale'}: snapshot age {age:.1f}s"
        )

    async def elsewhere(request: web.Request) -> web.Response:
        return text_response(404, "kubegpu exporter: see /metrics and /healthz")

    app = hardened_app(limits)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_route("*", "/{path:.*}", elsewhere)
    return app


@dataclass
class ExporterSettings:
    node_name: str
    listen_host: str = "127.0.0.1"
    listen_port: int = 9400  # 0 picks a free port (tests)
    interval_s: float = 10.0
    read_timeout_s: float = 5.0
    stale_after_s: float = 60.0
    proc: Path = field(default_factory=lambda: Path("/proc"))


class RunningExporter:
    """A started exporter: refresher thread plus HTTP server thread. Stop with :meth:`stop`."""

    def __init__(
        self,
        refresher: Refresher,
        registry: CollectorRegistry,
        server: HttpThread,
        health: HealthFeed,
    ) -> None:
        self._on_stop: list[Callable[[], None]] = []
        self.refresher = refresher
        self.registry = registry
        self.health = health
        self._server = server

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        return self._server.url

    def close_on_stop(self, close: Callable[[], None]) -> None:
        """Run ``close`` after the server and refresher have stopped."""
        self._on_stop.append(close)

    def set_gpu_health(self, uuid: GpuUuid, healthy: bool) -> None:
        """A GPU's health as the node's health record judged it (the role wires this)."""
        self.health.set_healthy(uuid, healthy)

    def stop(self) -> None:
        self._server.stop()
        self.refresher.stop()
        for close in self._on_stop:
            close()


def build_registry(refresher: Refresher, health: HealthFeed) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(refresher, health=health.tally, clock=refresher.clock))
    return registry


def start_exporter(
    settings: ExporterSettings,
    *,
    inventory: Callable[[], NodeInventory],
    metrics: MetricsSource,
    pod_resources: PodResourcesSource | None = None,
    pod_directory: PodDirectory | None = None,
    shares: PodShareLookup | None = None,
    health: HealthFeed | None = None,
    clock: Callable[[], float] = time.time,
    limits: HttpLimits = EXPORTER_LIMITS,
) -> RunningExporter:
    """Start the refresher and the HTTP server in daemon threads and return at once.

    The node agent calls this with its own backend's ``snapshot`` and a :class:`HealthFeed`
    its health monitor feeds; the CLI passes a feed that runs a monitor of its own.
    """
    health = health or HealthFeed()
    refresher = Refresher(
        node=settings.node_name,
        inventory=inventory,
        metrics=metrics,
        pod_resources=pod_resources,
        pod_directory=pod_directory,
        shares=shares,
        pids=ProcPodResolver(settings.proc),
        clock=clock,
        interval_s=settings.interval_s,
        read_timeout_s=settings.read_timeout_s,
    )
    registry = build_registry(refresher, health)
    app = make_app(registry, refresher, settings.stale_after_s, limits)
    server = HttpThread(
        settings.listen_host, settings.listen_port, app, name="kubegpu-exporter-http"
    )
    try:
        refresher.start()
    except BaseException:
        server.stop()
        raise
    running = RunningExporter(refresher, registry, server, health)
    log.info(
        "node %s: exporter serving %s/metrics (refresh every %.0fs, NVML timeout %.1fs)",
        settings.node_name,
        running.url,
        settings.interval_s,
        settings.read_timeout_s,
    )
    return running


def stale_after(interval_s: float) -> float:
    """When ``/healthz`` calls the snapshot stale: six refreshes missed, at least a minute."""
    return max(60.0, 6 * interval_s)
