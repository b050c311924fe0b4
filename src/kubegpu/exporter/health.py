"""A thread-safe running tally of GPU health and Xid counts, fed by health events.

Inside the node agent (``exporter.enabled``) the agent's health monitor is the one source: its
verdicts arrive through :meth:`HealthFeed.set_healthy` and every event it reads through
:meth:`HealthFeed.count`, which counts Xids without judging health (no second NVML event set,
no second opinion). Run standalone (``kubegpu exporter`` / ``kubegpu labels``),
:meth:`HealthFeed.watch` opens one watcher thread per GPU on the backend. Listeners are told
after each event (the labeller relabels at once when health changes).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.health import HealthCheckPolicy, HealthEvent
from kubegpu.core.metrics import HealthTally, count_xid, tally_event
from kubegpu.inventory.backend import GpuBackend

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
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def record(self, event: HealthEvent) -> None:
        with self._lock:
            self._tally = tally_event(self._tally, event, self._gpus, self._policy)
        self._notify()

    def count(self, event: HealthEvent) -> None:
        """Count an event's Xid, leaving health to :meth:`set_healthy`'s judge."""
        with self._lock:
            self._tally = count_xid(self._tally, event, self._gpus)
        self._notify()

    def set_healthy(self, uuid: GpuUuid, healthy: bool) -> None:
        """Take a health verdict from an authoritative judge: inside the node agent, its
        HealthMonitor's ``on_change`` (which applies recovery rules this tally does not)."""
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

    def watch(self, backend: GpuBackend, gpus: Iterable[GpuUuid], poll_s: float = 1.0) -> None:
        """Start one daemon thread per GPU reading ``backend.watch_health``."""
        self._gpus = tuple(gpus)
        for uuid in self._gpus:
            thread = threading.Thread(
                target=self._watch_one,
                args=(backend, uuid, poll_s),
                name=f"kubegpu-health-{uuid}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def _watch_one(self, backend: GpuBackend, uuid: GpuUuid, poll_s: float) -> None:
        watcher = backend.watch_health(uuid)
        try:
            while not self._stop.is_set():
                for event in watcher.wait(poll_s):
                    log.info("gpu %s: health event %s xid=%s", uuid, event.kind.value, event.xid)
                    self.record(event)
        except Exception:
            log.exception("gpu %s: health watcher failed; health metrics may be stale", uuid)
        finally:
            watcher.close()

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
        self._threads.clear()
