"""Where the node agent runs the Prometheus exporter (``exporter.enabled``), known only as a port.

The exporter is another edge, which this one may not import: the role hands the agent an
:data:`ExporterStarter` (:mod:`kubegpu.roles.node_agent` wires the real one, on the agent's GPU
backend and health record). The slot starts it off the event loop (it reads the backend once and
opens the PodResources channel), stops it, and restarts it when a reload changes its block; an
address that cannot be served leaves it off, the device plugin unaffected.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Protocol

from kubegpu.config.model import Exporter as ExporterConfig
from kubegpu.core.health_feed import HealthFeed

log = logging.getLogger(__name__)


class RunningService(Protocol):
    def stop(self) -> None: ...


# Starts the exporter (its config, the metrics' node label, the health record it reads) on the
# agent's backend; raises OSError when its address cannot be served. None: the role has none.
ExporterStarter = Callable[[ExporterConfig, str, HealthFeed], RunningService]


class ExporterServerError(Exception):
    """``exporter.listen`` cannot be served (the port is taken, or not this host's address)."""


class ExporterSlot:
    """The exporter of the agent's current config, or none."""

    def __init__(self, starter: ExporterStarter | None, node_name: str, health: HealthFeed) -> None:
        self._starter = starter
        # The metrics' node label: a node name is what dashboards join on.
        self._node_label = node_name or socket.gethostname()
        self._health = health
        self.running: RunningService | None = None

    async def start(self, config: ExporterConfig) -> None:
        """Raises ExporterServerError when ``config.listen`` cannot be served; nothing of the
        exporter is left running then."""
        if not config.enabled:
            return
        starter = self._starter
        if starter is None:
            # A wiring mistake of the role, not a setting the admin can fix.
            raise RuntimeError("exporter.enabled, but this agent was wired without an exporter")

        def start() -> RunningService:
            return starter(config, self._node_label, self._health)

        try:
            # Off the loop: it reads the backend once and opens the PodResources channel.
            self.running = await asyncio.get_running_loop().run_in_executor(None, start)
        except OSError as err:
            raise ExporterServerError(
                f"cannot serve the exporter's /metrics on {config.listen}: {err.strerror or err}"
            ) from err

    async def stop(self) -> None:
        running, self.running = self.running, None
        if running is not None:
            # Joins its HTTP and refresher threads (the refresher waits out an NVML read).
            await asyncio.get_running_loop().run_in_executor(None, running.stop)

    async def restart(self, config: ExporterConfig, node: str) -> None:
        """After a reload changed the ``exporter`` block; a failure leaves it off, logged."""
        await self.stop()
        try:
            await self.start(config)
        except ExporterServerError as err:
            log.error(
                "node %s: %s; the exporter is off until the next config change or restart",
                node,
                err,
            )
