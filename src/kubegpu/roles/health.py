"""The health judge a role runs: the inventory edge's monitor writing into the core's feed.

The node agent, a standalone exporter and the labeller all judge GPUs with the same monitor
and policy; this is where that monitor meets the :class:`~kubegpu.core.health_feed.HealthFeed`
the role's edges read, so no edge imports the inventory edge to get it.
"""

from __future__ import annotations

from kubegpu.core.backend import GpuBackend
from kubegpu.core.gpu import NodeInventory
from kubegpu.core.health_feed import HealthFeed
from kubegpu.inventory.health import HEALTH_CHECK_S, HealthMonitor


def judge_health(
    feed: HealthFeed,
    backend: GpuBackend,
    inventory: NodeInventory,
    *,
    node_name: str = "",
    poll_timeout_s: float | None = None,
) -> None:
    """Judge the GPUs of ``inventory`` into ``feed`` with its policy until ``feed.close()``.

    ``poll_timeout_s`` is one health check (the monitor's default, as the agent runs it, unless
    a test shortens it); ``recoverAfterHealthyChecks`` counts those."""
    feed.set_gpus(gpu.uuid for gpu in inventory.gpus)
    monitor = HealthMonitor(
        backend,
        inventory,
        feed.policy,
        record=feed,
        node_name=node_name,
        on_event=feed.count,
        poll_timeout_s=HEALTH_CHECK_S if poll_timeout_s is None else poll_timeout_s,
    )
    monitor.start()
    feed.attach_judge(monitor.stop)
