"""Health monitoring: one thread per physical GPU turns backend events into healthy/unhealthy.

Health is kept per *physical* GPU (UUID). Consumers that expose several logical devices per GPU
(time-slicing replicas, MIG slices) fan a change out to all of them; keying by logical device is
the defect NVIDIA's plugin shipped in v0.20.0 (one replica marked, the others left healthy).

Which events matter is :class:`~kubegpu.core.health.HealthCheckPolicy`'s decision; this module
only waits, applies it, and reports changes through one callback, called from the GPU's monitor
thread, only when a GPU's state actually flips. An optional second callback sees every event
read, judged or not, so a consumer that counts them (the exporter inside the node agent counts
Xids) needs no event set of its own.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kubegpu.core.backend import GpuBackend, HealthWatcher, InventoryError
from kubegpu.core.gpu import GpuDevice, GpuUuid, NodeInventory
from kubegpu.core.health import (
    HealthCheckPolicy,
    HealthEvent,
    HealthEventKind,
    describe_event,
)

log = logging.getLogger(__name__)

# One health check: one wait for GPU events, returning after this long when none came (sooner
# when a non-critical one ends it). health.recoverAfterHealthyChecks counts these.
HEALTH_CHECK_S = 0.2

HealthCallback = Callable[[GpuUuid, bool, str], None]
EventCallback = Callable[[HealthEvent], None]


@dataclass
class _GpuState:
    healthy: bool = True
    lost: bool = False  # unhealthy because it stopped answering: only RECOVERED brings it back
    quiet_checks: int = 0  # consecutive waits without a critical event while unhealthy


def describe_ignored_xids(policy: HealthCheckPolicy) -> str:
    """Which Xids ``policy`` lets pass, after the enable list has taken its Xids back.

    ``"Xids [31, 43]"``, ``"every Xid except [13, 79]"`` or ``"no Xid (every Xid is
    critical)"``: the start-up log must say what the agent will actually do, not the lists it
    was given (``DP_ENABLE_HEALTHCHECKS=13`` makes 13 critical although it is an application Xid).
    """
    if policy.all_xids_enabled:
        return "no Xid (every Xid is critical)"
    if policy.all_xids_disabled:
        enabled = sorted(policy.enabled_xids)
        return f"every Xid except {enabled}" if enabled else "every Xid"
    ignored = (policy.ignored_xids | policy.disabled_xids) - policy.enabled_xids
    return f"Xids {sorted(ignored)}" if ignored else "no Xid (every Xid is critical)"


class HealthMonitor:
    """Watches every GPU of ``inventory`` and calls ``on_change(uuid, healthy, reason)``.

    ``start()`` opens every watcher before returning, so an event raised after it returns is
    seen. A GPU whose watcher cannot be opened is reported unhealthy at once (as NVIDIA does: a
    GPU we cannot watch is not one we can vouch for).
    """

    def __init__(
        self,
        backend: GpuBackend,
        inventory: NodeInventory,
        policy: HealthCheckPolicy,
        on_change: HealthCallback,
        *,
        poll_timeout_s: float = HEALTH_CHECK_S,
        node_name: str = "",
        on_event: EventCallback | None = None,
    ) -> None:
        if poll_timeout_s <= 0:
            raise ValueError(f"poll_timeout_s must be positive, got {poll_timeout_s}")
        self._backend = backend
        self._inventory = inventory
        self._policy = policy
        self._on_change = on_change
        self._on_event = on_event
        self._poll_timeout_s = poll_timeout_s
        self._node = node_name or "-"
        self._lock = threading.Lock()
        self._states = {gpu.uuid: _GpuState() for gpu in inventory}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False

    @property
    def policy(self) -> HealthCheckPolicy:
        return self._policy

    def health(self) -> dict[GpuUuid, bool]:
        """Current health per physical GPU UUID (every GPU of the inventory is present)."""
        with self._lock:
            return {uuid: state.healthy for uuid, state in self._states.items()}

    def start(self) -> None:
        if self._started:
            raise RuntimeError("HealthMonitor.start() called twice")
        self._started = True
        if self._policy.disabled:
            log.warning(
                "node %s: health checks disabled by policy; all %d GPUs stay healthy",
                self._node,
                len(self._inventory),
            )
            return
        log.info(
            "node %s: watching %d GPUs; ignoring %s",
            self._node,
            len(self._inventory),
            describe_ignored_xids(self._policy),
        )
        for gpu in self._inventory:
            try:
                watcher = self._backend.watch_health(gpu.uuid)
            except InventoryError as exc:
                self._set(gpu, healthy=False, reason=f"cannot watch health: {exc}")
                continue
            thread = threading.Thread(
                target=self._run,
                args=(gpu, watcher),
                name=f"health-gpu{gpu.index}",
                daemon=True,
            )
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every thread, waiting at most about ``timeout_s`` in total."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning(
                    "node %s: health thread %s did not stop in time", self._node, thread.name
                )
        self._threads = [thread for thread in self._threads if thread.is_alive()]

    def __enter__(self) -> HealthMonitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- per-GPU thread -----------------------------------------------------------------------

    def _run(self, gpu: GpuDevice, watcher: HealthWatcher) -> None:
        try:
            while not self._stop.is_set():
                try:
                    events = watcher.wait(self._poll_timeout_s)
                except Exception:
                    # A watcher that fails must not end monitoring: log and retry after a pause,
                    # so a driver hiccup is not a busy loop.
                    log.exception(
                        "node %s: health wait failed for GPU %d (%s)",
                        self._node,
                        gpu.index,
                        gpu.uuid,
                    )
                    self._stop.wait(self._poll_timeout_s)
                    continue
                if self._stop.is_set():
                    break
                self._apply(gpu, events)
        finally:
            # The waiting thread closes its own watcher: freeing an NVML event set while another
            # thread is blocked on it is undefined behaviour.
            try:
                watcher.close()
            except Exception:
                log.exception(
                    "node %s: closing the health watcher of GPU %d (%s) failed",
                    self._node,
                    gpu.index,
                    gpu.uuid,
                )

    def _apply(self, gpu: GpuDevice, events: list[HealthEvent]) -> None:
        critical_seen = False
        for event in events:
            self._tell(gpu, event)
            reason = describe_event(event)
            if event.kind is HealthEventKind.RECOVERED:
                with self._lock:
                    self._states[gpu.uuid].lost = False
                self._set(gpu, healthy=True, reason=reason)
            elif self._policy.is_critical(event):
                critical_seen = True
                if event.kind is HealthEventKind.LOST:
                    with self._lock:
                        self._states[gpu.uuid].lost = True
                self._set(gpu, healthy=False, reason=reason)
            else:
                log.info(
                    "node %s: GPU %d (%s): ignoring %s (not critical under the health policy)",
                    self._node,
                    gpu.index,
                    gpu.uuid,
                    reason,
                )
        if not critical_seen:
            self._count_quiet_check(gpu)

    def _tell(self, gpu: GpuDevice, event: HealthEvent) -> None:
        if self._on_event is None:
            return
        if event.uuid is None:
            # This thread's watcher is this GPU's: an event naming no GPU is about this one here
            # (every GPU's watcher gets its own copy, so it must not count for all of them).
            event = dataclasses.replace(event, uuid=gpu.uuid)
        try:
            self._on_event(event)
        except Exception:
            log.exception(
                "node %s: health event callback failed for GPU %d (%s)",
                self._node,
                gpu.index,
                gpu.uuid,
            )

    def _count_quiet_check(self, gpu: GpuDevice) -> None:
        needed = self._policy.recover_after_healthy_checks
        if needed is None:
            return
        with self._lock:
            state = self._states[gpu.uuid]
            if state.healthy or state.lost:
                return
            state.quiet_checks += 1
            if state.quiet_checks < needed:
                return
        self._set(
            gpu,
            healthy=True,
            reason=f"no critical event in {needed} consecutive health checks",
        )

    def _set(self, gpu: GpuDevice, *, healthy: bool, reason: str) -> None:
        with self._lock:
            state = self._states[gpu.uuid]
            state.quiet_checks = 0
            if state.healthy == healthy:
                return
            state.healthy = healthy
        if healthy:
            log.info(
                "node %s: GPU %d (%s) healthy again: %s", self._node, gpu.index, gpu.uuid, reason
            )
        else:
            log.warning(
                "node %s: GPU %d (%s) unhealthy: %s", self._node, gpu.index, gpu.uuid, reason
            )
        try:
            self._on_change(gpu.uuid, healthy, reason)
        except Exception:
            log.exception(
                "node %s: health callback failed for GPU %d (%s)", self._node, gpu.index, gpu.uuid
            )
