"""The node agent's composition root: the kubelet edge's supervisor, wired to its neighbours.

:class:`~kubegpu.kubelet.agent.Agent` only sequences; this module builds what it sequences
(the plugin set, the device board over the one health record, the exporter slot, the CDI spec
file, GPU sharing and the inventory publisher when there is API access) and is the one place
that picks the real ports: the inventory edge's backend and health monitor, the exporter (when
``exporter.enabled``), and the kube edge's API server access. It imports each of
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

from kubegpu.config.health import health_policy
from kubegpu.config.model import AgentConfig
from kubegpu.config.model import Exporter as ExporterConfig
from kubegpu.core.backend import GpuBackend
from kubegpu.core.gpu import NodeInventory
from kubegpu.core.health_feed import HealthFeed
from kubegpu.kubelet.agent import Agent, AgentParts, AgentSettings, HealthJudge
from kubegpu.kubelet.board import DeviceBoard
from kubegpu.kubelet.cdi import CdiSpecFile
from kubegpu.kubelet.exporter_slot import ExporterSlot, ExporterStarter, RunningService
from kubegpu.kubelet.inventory_publisher import InventoryPublisher
from kubegpu.kubelet.plans import build_plans
from kubegpu.kubelet.plugin_set import PluginSet
from kubegpu.kubelet.reload import check_api_access
from kubegpu.kubelet.sharing_runtime import SharingRuntime

__all__ = ["KubeconfigError", "build_agent", "kube_config_for", "run_agent"]

# Makes the synchronous client the exporter lists the node's pods with (podDirectory: api).
KubeClientFactory = Callable[[], Any]


def judge_node_health(
    feed: HealthFeed, backend: GpuBackend, inventory: NodeInventory, node_name: str
) -> None:
    """The agent's :class:`~kubegpu.kubelet.agent.HealthJudge`: the inventory edge's monitor."""
    from kubegpu.roles.health import judge_health

    judge_health(feed, backend, inventory, node_name=node_name)


def exporter_starter(backend: GpuBackend, kube_client: KubeClientFactory | None) -> ExporterStarter:
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
    health_judge: HealthJudge = judge_node_health,
    start_exporter: ExporterStarter | None = None,
) -> Agent:
    """The node agent as it runs in production, with the ports a test may replace: every
    collaborator of the supervisor built here, and only the ones the config and access need.
    Raises PlanError for a config the node cannot serve."""
    node_name = settings.node_name
    node = node_name or "-"
    check_api_access(config, api=api is not None, node_name=node_name)
    inventory = backend.snapshot()
    plans = build_plans(config, inventory)
    # The one record of GPU health: the judge writes it, everything else reads it.
    health = HealthFeed(
        (gpu.uuid for gpu in inventory.gpus), health_policy(config.health, settings.env)
    )
    board = DeviceBoard(health)
    sharing = publisher = None
    if api is not None:
        sharing = SharingRuntime(node, api, board, pod_resources=pod_resources, sleep=sleep)
        if node_name:
            publisher = InventoryPublisher(api, node, inventory, health, settings.backoff, config)
    parts = AgentParts(
        inventory=inventory,
        health=health,
        board=board,
        plugins=PluginSet(settings.kubelet_dir, node, settings.backoff, sleep=sleep, clock=clock),
        exporter=ExporterSlot(
            start_exporter or exporter_starter(backend, kube_client), node_name, health
        ),
        cdi=CdiSpecFile(node),
        health_judge=health_judge,
        sharing=sharing,
        publisher=publisher,
    )
    return Agent(settings, config, backend, plans, parts, sleep=sleep)


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
