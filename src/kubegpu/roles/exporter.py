"""The exporter's composition root: the exporter edge on a GPU backend, a health judge, the
kubelet's PodResources and a pod directory, for ``kubegpu exporter`` and the node agent.

The exporter edge serves what it is handed (:func:`~kubegpu.exporter.server.start_exporter`);
this module chooses it: the inventory edge's metrics reader for the backend, the health
monitor (standalone) or the node agent's health record (inside the agent), and where pod names
come from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubegpu.config.model import Exporter as ExporterConfig
from kubegpu.core.backend import GpuBackend
from kubegpu.core.health_feed import HealthFeed
from kubegpu.core.metrics import MetricsSource
from kubegpu.exporter.pods import (
    KubeNodePods,
    PodDirectory,
    PodLogDirectory,
    PodShareLookup,
    allocation_annotation_shares,
)
from kubegpu.exporter.server import (
    ExporterSettings,
    RunningExporter,
    stale_after,
    start_exporter,
)
from kubegpu.kubelet.pod_resources import DEFAULT_POD_RESOURCES_SOCKET, KubeletPodResources
from kubegpu.roles.health import judge_health


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
    judge: bool = True,
) -> RunningExporter:
    """The exporter for an open GPU backend, in this process: what the node agent calls.

    ``judge`` makes ``health`` run its own health monitor on the backend (one watcher
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
        if judge:
            opened.append(feed.close)
            judge_health(feed, backend, inventory, node_name=settings.node_name)
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
        from kubegpu.kube.node_pods import LightkubeNodePods

        api = LightkubeNodePods(kube_client())
        pods = KubeNodePods(api, node_name, parse_shares=allocation_annotation_shares)
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
        judge=False,
    )
