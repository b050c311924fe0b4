"""Serving the exporter over HTTP, and the composition roots the CLI and the node agent call.

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
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, make_wsgi_app

from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.core.metrics import MetricsSource
from kubegpu.exporter.cgroups import ProcPodResolver
from kubegpu.exporter.collector import GpuCollector
from kubegpu.exporter.health import HealthFeed
from kubegpu.exporter.http import HttpThread, StartResponse, WsgiApp, text_reply
from kubegpu.exporter.pods import (
    DEFAULT_POD_RESOURCES_SOCKET,
    KubeletPodResources,
    KubeNodePods,
    PodDirectory,
    PodLogDirectory,
    PodResourcesSource,
    PodShareLookup,
    allocation_annotation_shares,
)
from kubegpu.exporter.refresher import Refresher
from kubegpu.inventory.backend import GpuBackend

if TYPE_CHECKING:
    from kubegpu.config.model import Exporter as ExporterConfig

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
        """For the node agent: its health monitor's verdict."""
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


def metrics_source_for(backend: GpuBackend) -> MetricsSource:
    """The live-metrics reader that goes with a backend: the fake's, or NVML."""
    if backend.name == "fake":
        from kubegpu.inventory.fake_metrics import FakeMetricsSource

        return FakeMetricsSource(backend.snapshot())
    from kubegpu.inventory.nvml_metrics import NvmlMetricsSource

    return NvmlMetricsSource()


def start_node_exporter(
    backend: GpuBackend,
    settings: ExporterSettings,
    *,
    pod_resources_socket: Path | None = DEFAULT_POD_RESOURCES_SOCKET,
    pod_directory: PodDirectory | None = None,
    shares: PodShareLookup | None = None,
    metrics: MetricsSource | None = None,
    health: HealthFeed | None = None,
    watch_health: bool = True,
) -> RunningExporter:
    """The exporter for an open GPU backend, in this process: what the node agent calls.

    ``watch_health`` makes ``health`` run its own health monitor on the backend (one watcher
    per GPU; NVML delivers every event to every event set, so this steals nothing from another
    monitor), judging with the feed's policy exactly as the agent does; without it, the
    caller feeds verdicts and events (the agent, from its monitor). ``pod_resources_socket=None``
    skips the kubelet.
    Stopping the returned exporter closes what this function opened, not the backend.
    """
    inventory = backend.snapshot()
    uuids = [gpu.uuid for gpu in inventory.gpus]
    # What this function opens, closed in reverse when the exporter stops, or at once when it
    # cannot start (a taken port): a node agent that retries on every SIGHUP must not pile up
    # watcher threads and gRPC channels.
    opened: list[Callable[[], None]] = []
    try:
        if metrics is None:
            metrics = metrics_source_for(backend)
            opened.append(metrics.close)
        feed = health if health is not None else HealthFeed(uuids)
        if watch_health:
            opened.append(feed.close)
            feed.watch(backend, inventory, node_name=settings.node_name)
        client = None
        if pod_resources_socket is not None:
            client = KubeletPodResources(pod_resources_socket)
            opened.append(client.close)
        running = start_exporter(
            settings,
            inventory=backend.snapshot,
            metrics=metrics,
            pod_resources=client,
            pod_directory=pod_directory if pod_directory is not None else PodLogDirectory(),
            shares=shares,
            health=feed,
        )
    except BaseException:
        for close in reversed(opened):
            close()
        raise
    for close in reversed(opened):
        running.close_on_stop(close)
    return running


def pod_sources(
    pod_directory: str, pod_log_dir: Path, node_name: str, kube_client: Callable[[], Any] | None
) -> tuple[PodDirectory, PodShareLookup | None]:
    """Where pod names (and shares) come from: ``logs`` reads the kubelet's pod log directory;
    ``api`` lists the node's pods with ``kube_client()`` (a synchronous lightkube ``Client``,
    called here once), which also gives each shared pod's share."""
    if pod_directory == "api":
        if kube_client is None:
            raise ValueError("the api pod directory needs API access")
        pods = KubeNodePods(kube_client(), node_name, parse_shares=allocation_annotation_shares)
        return pods, pods
    return PodLogDirectory(pod_log_dir), None


def start_agent_exporter(
    backend: GpuBackend,
    config: ExporterConfig,
    *,
    node_name: str,
    health: HealthFeed,
    kube_client: Callable[[], Any] | None = None,
) -> RunningExporter:
    """The exporter inside the node agent (``exporter`` in its config): the agent's open backend,
    and ``health`` fed by the agent's health monitor, so no watcher of its own.

    Raises ``OSError`` when ``config.listen`` cannot be bound; nothing is left running then.
    """
    from kubegpu.config.model import parse_listen_address

    host, port = parse_listen_address(config.listen)
    directory, shares = pod_sources(
        config.pod_directory, Path(config.pod_log_dir), node_name, kube_client
    )
    settings = ExporterSettings(
        node_name=node_name,
        listen_host=host,
        listen_port=port,
        interval_s=config.interval_s,
        read_timeout_s=config.read_timeout_s,
        stale_after_s=stale_after(config.interval_s),
        proc=Path(config.proc),
    )
    return start_node_exporter(
        backend,
        settings,
        pod_resources_socket=Path(config.pod_resources_socket)
        if config.pod_resources_socket
        else None,
        pod_directory=directory,
        shares=shares,
        health=health,
        watch_health=False,
    )


def stale_after(interval_s: float) -> float:
    """When ``/healthz`` calls the snapshot stale: six refreshes missed, at least a minute."""
    return max(60.0, 6 * interval_s)
