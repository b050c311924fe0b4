"""A thread-safe running tally of GPU health and Xid counts, fed by one health judge.

Health has one rule in kubegpu: the node agent's :class:`~kubegpu.inventory.health.
HealthMonitor` (the device plugin's :class:`~kubegpu.core.health.HealthCheckPolicy`, lost GPUs
back only on ``RECOVERED``, and ``health.recoverAfterHealthyChecks`` quiet checks bringing an
Xid-struck GPU back). This module never judges an event itself, so the exporter's
``kubegpu_gpu_healthy`` and the labeller's ``kubegpu.io/gpu.healthy-count`` cannot disagree
with what the device plugin tells the kubelet.

Inside the node agent (``exporter.enabled``) the agent's monitor is the one source: its
verdicts arrive through :meth:`HealthFeed.set_healthy` and every event it reads through
:meth:`HealthFeed.count`, which counts Xids (no second NVML event set, no second opinion).
Run standalone (``kubegpu exporter`` / ``kubegpu labels``), :meth:`HealthFeed.watch` runs a
monitor of the same class with the same policy, wired the same way. Listeners are told after
each change (the labeller relabels at once when health changes).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.core.health import HealthCheckPolicy, HealthEvent
from kubegpu.core.metrics import HealthTally, count_xid
from kubegpu.inventory.backend import GpuBackend
from kubegpu.inventory.health import HealthMonitor

log = logging.getLogger(__name__)


class HealthFeed:
    def __init__(
        self, gpus: Iterable[GpuUuid] = (), policy: HealthCheckPolicy | None = None
    ) -> None:
        self._policy = policy or HealthCheckPolicy()
        self._lock = threading.Lock()
        self._tally = HealthTally()
        self._gpus = tuple(gpus)
        self._listeners: list[Callable[[], None]] = []
        self._monitor: HealthMonitor | None = None

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def count(self, event: HealthEvent) -> None:
        """Count an event's Xid, leaving health to :meth:`set_healthy`'s judge."""
        with self._lock:
            self._tally = count_xid(self._tally, event, self._gpus)
        self._notify()

    def set_healthy(self, uuid: GpuUuid, healthy: bool) -> None:
        """Take a health verdict from the judge: a :class:`HealthMonitor`'s ``on_change`` (the
        node agent's, or the one :meth:`watch` runs)."""
        with self._lock:
            self._tally = self._tally.with_health(uuid, healthy)
        self._notify()

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()

    def tally(self) -> HealthTally:
        with self._lock:
            return self._tally

    def healthy_map(self) -> dict[GpuUuid, bool]:
        tally = self.tally()
        return {uuid: tally.healthy(uuid) for uuid in self._gpus}

    def watch(
        self,
        backend: GpuBackend,
        inventory: NodeInventory,
        *,
        node_name: str = "",
        poll_timeout_s: float | None = None,
    ) -> None:
        """Judge the GPUs of ``inventory`` here, with the node agent's monitor and this feed's
        policy. ``poll_timeout_s`` is one health check (the monitor's default, as the agent
        runs it, unless a test shortens it); ``recoverAfterHealthyChecks`` counts those."""
        if self._monitor is not None:
            raise RuntimeError("HealthFeed.watch() called twice")
        self._gpus = tuple(gpu.uuid for gpu in inventory.gpus)
        timing = {} if poll_timeout_s is None else {"poll_timeout_s": poll_timeout_s}
        monitor = HealthMonitor(
            backend,
            inventory,
            self._policy,
            lambda uuid, healthy, _reason: self.set_healthy(uuid, healthy),
            node_name=node_name,
            on_event=self.count,
            **timing,
        )
        monitor.start()
        self._monitor = monitor

    def close(self, timeout_s: float = 5.0) -> None:
        if self._monitor is not None:
            self._monitor.stop(timeout_s)
            self._monitor = None
