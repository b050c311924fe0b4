"""Health monitoring: one thread per physical GPU turns backend events into healthy/unhealthy.

Health is kept per *physical* GPU (UUID). Consumers that expose several logical devices per GPU
(time-slicing replicas, MIG devices) fan a change out to all of them; keying by logical device is
the defect NVIDIA's plugin shipped in v0.20.0 (one replica marked, the others left healthy). A
MIG device has a verdict of its own besides (keyed by its ``MIG-…`` UUID): an Xid that NVML
reports for one GPU instance (and compute instance) marks only the MIG devices it concerns,
while one on the whole card marks the card, and with it every MIG device on it (NVIDIA's plugin
after its fix for issue #1929). An answer again (``RECOVERED``) and quiet checks clear both.

Which events matter is :class:`~kubegpu.core.health.HealthCheckPolicy`'s decision; this module
only waits, applies it, and writes each verdict into its record, a
:class:`~kubegpu.core.health_feed.HealthFeed` (the role's, or one of its own): the monitor keeps
only what judging needs (a lost GPU, healthy checks counted towards recovery), never a second
copy of the verdicts; a GPU that waits for a node reboot is noted in the record too, so a judge
started again on it (a reload) keeps it out. An optional callback hears, on the GPU's
monitor thread, each verdict that actually flips. An optional second callback sees every event
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
    describe_xid,
)
from kubegpu.core.health_feed import HealthFeed

log = logging.getLogger(__name__)

# One health check: one wait for GPU events, returning after this long when none came (sooner
# when a non-critical one ends it). health.recoverAfterHealthyChecks counts these.
HEALTH_CHECK_S = 0.2

HealthCallback = Callable[[GpuUuid, bool, str], None]
EventCallback = Callable[[HealthEvent], None]


@dataclass
class _GpuJudging:
    """What judging one GPU needs besides its verdict (which lives in the record)."""

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


def describe_reboot_xids(policy: HealthCheckPolicy) -> str:
    """``"; Xids [54, 79, 151] wait for a node reboot"``, those the policy still calls critical;
    "" when there are none (NVIDIA's device plugin's rule)."""
    waiting = sorted(xid for xid in policy.reboot_xids if policy.is_xid_critical(xid))
    return f"; Xids {waiting} wait for a node reboot" if waiting else ""


class HealthMonitor:
    """Watches every GPU of ``inventory``, writes its verdicts into ``record`` and calls
    ``on_change(uuid, healthy, reason)`` when one flips.

    ``start()`` opens every watcher before returning, so an event raised after it returns is
    seen. A GPU whose watcher cannot be opened is reported unhealthy at once (as NVIDIA does: a
    GPU we cannot watch is not one we can vouch for).
    """

    def __init__(
        self,
        backend: GpuBackend,
        inventory: NodeInventory,
        policy: HealthCheckPolicy,
        on_change: HealthCallback | None = None,
        *,
        poll_timeout_s: float = HEALTH_CHECK_S,
        node_name: str = "",
        on_event: EventCallback | None = None,
        record: HealthFeed | None = None,
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
        # The verdicts: the role's record when given (one per node), else this monitor's own.
        self._record = record if record is not None else HealthFeed(g.uuid for g in inventory)
        self._judging = {gpu.uuid: _GpuJudging() for gpu in inventory}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False

    @property
    def policy(self) -> HealthCheckPolicy:
        return self._policy

    def health(self) -> dict[GpuUuid, bool]:
        """Current health per physical GPU UUID (every GPU of the inventory is present)."""
        return {uuid: self._record.healthy(uuid) for uuid in self._judging}

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
            "node %s: watching %d GPUs; ignoring %s%s",
            self._node,
            len(self._inventory),
            describe_ignored_xids(self._policy),
            describe_reboot_xids(self._policy),
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
                    self._judging[gpu.uuid].lost = False
                for key, what in _verdicts_of(gpu):
                    held_by = self._held_for_reboot(key)
                    if held_by is not None:
                        if self._record.healthy(key):
                            continue
                        log.warning(
                            "node %s: GPU %d %s(%s) answers again but stays unhealthy: %s "
                            "needs a node reboot",
                            self._node,
                            gpu.index,
                            what,
                            key,
                            describe_xid(held_by),
                        )
                        continue
                    self._set(gpu, healthy=True, reason=reason, key=key, what=what)
            elif self._policy.is_critical(event):
                critical_seen = True
                if event.kind is HealthEventKind.LOST:
                    with self._lock:
                        self._judging[gpu.uuid].lost = True
                concerned = _concerned(gpu, event)
                if not concerned:
                    log.warning(
                        "node %s: GPU %d (%s): %s names a MIG GPU instance the agent did not "
                        "find at start; no device marked",
                        self._node,
                        gpu.index,
                        gpu.uuid,
                        reason,
                    )
                for key, what in concerned:
                    self._set(gpu, healthy=False, reason=reason, key=key, what=what)
                    if event.xid is not None and self._policy.needs_node_reboot(event):
                        self._record.hold_for_reboot(key, event.xid)
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
            state = self._judging[gpu.uuid]
            waiting = [
                (key, what)
                for key, what in _verdicts_of(gpu)
                if not self._record.healthy(key)
                and self._held_for_reboot(key) is None
                and not (state.lost and key == gpu.uuid)
            ]
            if not waiting:
                return
            state.quiet_checks += 1
            if state.quiet_checks < needed:
                return
        for key, what in waiting:
            self._set(
                gpu,
                healthy=True,
                reason=f"no critical event in {needed} consecutive health checks",
                key=key,
                what=what,
            )

    def _held_for_reboot(self, key: GpuUuid) -> int | None:
        """The Xid that keeps ``key`` (a GPU or a MIG device) unhealthy until a node reboot, if
        this policy still says so: a reload to a policy that ignores it, or does not hold it,
        lets it recover as any other."""
        xid = self._record.held_for_reboot(key)
        if xid is None or not self._policy.needs_node_reboot(
            HealthEvent(HealthEventKind.XID, key, xid=xid)
        ):
            return None
        return xid

    def _set(
        self,
        gpu: GpuDevice,
        *,
        healthy: bool,
        reason: str,
        key: GpuUuid | None = None,
        what: str = "",
    ) -> None:
        """Write the verdict on ``key``: the GPU (by default) or one of its MIG devices."""
        key = gpu.uuid if key is None else key
        with self._lock:
            self._judging[gpu.uuid].quiet_checks = 0
        # Only this GPU's thread judges it, so the verdict cannot change between the look and
        # the write; the line is logged before the record tells its readers (the kubelet).
        if self._record.healthy(key) == healthy:
            return
        if healthy:
            log.info(
                "node %s: GPU %d %s(%s) healthy again: %s",
                self._node,
                gpu.index,
                what,
                key,
                reason,
            )
        else:
            log.warning(
                "node %s: GPU %d %s(%s) unhealthy: %s", self._node, gpu.index, what, key, reason
            )
        if not self._record.set_healthy(key, healthy, reason):
            return
        if self._on_change is None:
            return
        try:
            self._on_change(key, healthy, reason)
        except Exception:
            log.exception(
                "node %s: health callback failed for GPU %d (%s)", self._node, gpu.index, gpu.uuid
            )


def _verdicts_of(gpu: GpuDevice) -> list[tuple[GpuUuid, str]]:
    """Every verdict the record holds on ``gpu``: its own and each MIG device's, with the words
    a log line names it by (``"MIG device 0:2 "``, or nothing for the card)."""
    return [
        (gpu.uuid, ""),
        *((GpuUuid(m.uuid), f"MIG device {m.address} ") for m in gpu.mig_devices),
    ]


def _concerned(gpu: GpuDevice, event: HealthEvent) -> list[tuple[GpuUuid, str]]:
    """Whose verdict a critical event changes: the card's, unless NVML names a GPU instance on
    a card that has MIG devices; then each MIG device the event concerns (none when it names an
    instance the inventory does not know, as NVIDIA's plugin marks none)."""
    if event.gpu_instance_id is None or not gpu.mig_devices:
        return [(gpu.uuid, "")]
    return [
        (GpuUuid(m.uuid), f"MIG device {m.address} ")
        for m in gpu.mig_devices
        if event.concerns(m.gpu_instance_id, m.compute_instance_id)
    ]
