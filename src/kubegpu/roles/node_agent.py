"""The node agent's composition root: the kubelet edge's supervisor, wired to its neighbours.

:class:`~kubegpu.kubelet.agent.Agent` knows its collaborators only as ports; this module is the
one place that picks the real ones: the inventory edge's backend and health monitor, the
exporter (when ``exporter.enabled``), and the kube edge's API server access. It imports each of
them only when the config asks for it, so a node agent serving whole GPUs does not pay for
lightkube or prometheus_client (the RSS target in docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kubegpu.config.model import AgentConfig
from kubegpu.config.model import Exporter as ExporterConfig
from kubegpu.core.backend import GpuBackend
from kubegpu.core.gpu import NodeInventory
from kubegpu.core.health_feed import HealthFeed
from kubegpu.kubelet.agent import Agent, AgentSettings, RunningService

__all__ = ["KubeconfigError", "build_agent", "kube_config_for", "run_agent"]

# Makes the synchronous client the exporter lists the node's pods with (podDirectory: api).
KubeClientFactory = Callable[[], Any]


def judge_node_health(
    feed: HealthFeed, backend: GpuBackend, inventory: NodeInventory, node_name: str
) -> None:
    """The agent's :class:`~kubegpu.kubelet.agent.HealthJudge`: the inventory edge's monitor."""
    from kubegpu.roles.health import judge_health

    judge_health(feed, backend, inventory, node_name=node_name)


def exporter_starter(
    backend: GpuBackend, kube_client: KubeClientFactory | None
) -> Callable[[ExporterConfig, str, HealthFeed], RunningService]:
    """The agent's exporter: same refresher, collector and server as ``kubegpu exporter``, on
    the agent's backend and health record (no watcher of its own)."""

    def start(config: ExporterConfig, node_name: str, health: HealthFeed) -> RunningService:
        from kubegpu.roles.exporter import start_agent_exporter

        return start_agent_exporter(
            backend, config, node_name=node_name, health=health, kube_client=kube_client
        )

    return start


def build_agent(
    settings: AgentSettings,
    config: AgentConfig,
    backend: GpuBackend,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    api: Any = None,
    pod_resources: Any = None,
    kube_client: KubeClientFactory | None = None,
) -> Agent:
    """The node agent as it runs in production, with the ports a test may replace."""
    return Agent(
        settings,
        config,
        backend,
        health_judge=judge_node_health,
        start_exporter=exporter_starter(backend, kube_client),
        sleep=sleep,
        clock=clock,
        api=api,
        pod_resources=pod_resources,
    )


# Where a pod's service account token is mounted: its presence (with the service host in the
# environment) means in-cluster API access.
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


class KubeconfigError(Exception):
    """``--kubeconfig`` names a file lightkube cannot use (exit 2, like any bad input)."""


def kube_config_for(kubeconfig: Path | None) -> Any:
    """lightkube config from ``--kubeconfig``, else in-cluster, else None (no API access).

    The kube edge (and lightkube's HTTP stack) is imported only when there may be API access
    to configure: without it the agent serves whole GPUs and does not pay their memory."""
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and SERVICE_ACCOUNT_TOKEN.exists()
    if kubeconfig is None and not in_cluster:
        return None
    from kubegpu.kube import agent_api

    try:
        return agent_api.kube_config_for(kubeconfig)
    except agent_api.AgentKubeconfigError as err:
        raise KubeconfigError(str(err)) from err


async def run_agent(
    settings: AgentSettings, config: AgentConfig, backend: GpuBackend, kube_config: Any
) -> int:
    """Run the node agent until SIGTERM; with ``kube_config`` and a node name, with API access
    (the client is made on the running loop and closed on it)."""
    api = None
    pod_resources = None
    kube_client: KubeClientFactory | None = None
    if kube_config is not None and settings.node_name:
        from kubegpu.kube.agent_api import open_node_api, sync_client_factory
        from kubegpu.kubelet.cluster import KubeletPodResourcesApi

        api = open_node_api(kube_config, settings.node_name)
        pod_resources = KubeletPodResourcesApi(Path(config.sharing.gpu_share.pod_resources_socket))
        # The exporter's pod directory lists pods from its refresher thread: a synchronous
        # client of its own, not the loop's.
        kube_client = sync_client_factory(kube_config)

    try:
        agent = build_agent(
            settings, config, backend, api=api, pod_resources=pod_resources, kube_client=kube_client
        )
        return await agent.run()
    finally:
        if api is not None:
            await api.close()
