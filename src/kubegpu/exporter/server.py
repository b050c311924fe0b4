"""Serving the exporter over HTTP: registry, refresher and server from sources it is handed.

What those sources are (NVML or the fake's metrics, the kubelet's PodResources, where pod
names come from, who judges health) is the role's choice: :mod:`kubegpu.roles.exporter`.

``/metrics`` is prometheus_client's own WSGI app over an explicit registry (never the global
one), so content negotiation between the text format and OpenMetrics (by ``Accept``) and gzip
are the library's. ``/healthz`` answers 200 while the snapshot is fresher than
``stale_after_s`` and 503 otherwise, so a liveness probe restarts an exporter whose NVML reads
are stuck.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app

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
from kubegpu.httpd import HttpThread, StartResponse, WsgiApp, text_reply

log = logging.getLogger(__name__)


def make_app(registry: CollectorRegistry, refresher: Refresher, stale_after_s: float) -> WsgiApp:
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        if path == "/healthz":
            latest = refresher.latest()
            since = refresher.started_at if latest is None else latest.taken_at
            age = refresher.clock() - since
            fresh = age <= stale_after_s
            text = f"{'ok' if fresh else 'stale'}: snapshot age {age:.1f}s"
            return text_reply(start_response, 200 if fresh else 503, text)
        return text_reply(start_response, 404, "kubegpu exporter: see /metrics and /healthz")

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
    app = make_app(registry, refresher, settings.stale_after_s)
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
