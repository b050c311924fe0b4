"""Reads everything the exporter reports, off the scrape path, into an immutable snapshot.

Why: NVML can block for seconds or forever on a wedged GPU, and a scrape that blocks makes
Prometheus mark the whole target down, hiding the one signal that matters (this GPU is stuck).
So a scrape only ever reads :meth:`Refresher.latest`. The refresher reads NVML in a daemon
thread and waits at most ``read_timeout_s`` for it; if the read is still stuck at the next
refresh it does not start another (NVML reads would pile up), it counts a failure and keeps the
last complete snapshot, whose age the collector exports so the staleness is visible.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TypeVar

from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.core.metrics import (
    ContainerGpu,
    ContainerMig,
    DeviceAssignment,
    GpuAllocation,
    GpuMetrics,
    MetricsSource,
    PodGpuShare,
    PodKey,
    ProcessAttribution,
    allocation_by_gpu,
    attribute_processes,
    containers_by_gpu,
    containers_by_mig,
)
from kubegpu.exporter.cgroups import ProcPodResolver
from kubegpu.exporter.pods import NoShares, PodDirectory, PodResourcesSource, PodShareLookup

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass(frozen=True)
class ExporterSnapshot:
    """One complete refresh. ``holders`` is ``None`` when PodResources could not be read, so
    per-pod allocation metrics are absent rather than wrongly empty."""

    node: str
    taken_at: float  # clock() when the refresh completed
    duration_seconds: float
    inventory: NodeInventory
    metrics: dict[GpuUuid, GpuMetrics]
    holders: tuple[ContainerGpu, ...] | None
    allocation: dict[GpuUuid, GpuAllocation]
    attribution: ProcessAttribution
    shares: dict[PodKey, tuple[PodGpuShare, ...]] = field(default_factory=dict)
    # False when no share lookup is configured or reading it failed: ``shares`` is then empty
    # for want of knowing, and comparing it with the kubelet's view would be meaningless.
    shares_known: bool = False
    # The MIG devices each container holds (None when PodResources could not be read).
    mig_holders: tuple[ContainerMig, ...] | None = None


def _describe(exc: Exception) -> str:
    # grpc.RpcError's str() is a multi-line dump; its code and details are what an admin needs.
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):
        return f"{getattr(code(), 'name', code())}: {details()}"
    return str(exc)


def _in_daemon_thread(fn: Callable[[], _T], name: str) -> Future[_T]:
    # Not a ThreadPoolExecutor: its workers are joined at interpreter exit, and a hung NVML
    # call would then hang shutdown too. A daemon thread is abandoned instead.
    future: Future[_T] = Future()

    def target() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=target, name=name, daemon=True).start()
    return future


class Refresher:
    def __init__(
        self,
        *,
        node: str,
        inventory: Callable[[], NodeInventory],
        metrics: MetricsSource,
        pod_resources: PodResourcesSource | None = None,
        pod_directory: PodDirectory | None = None,
        shares: PodShareLookup | None = None,
        pids: ProcPodResolver | None = None,
        clock: Callable[[], float] = time.time,
        interval_s: float = 10.0,
        read_timeout_s: float = 5.0,
    ) -> None:
        self.node = node
        self._inventory = inventory
        self._metrics = metrics
        self._pod_resources = pod_resources
        self._pod_directory = pod_directory
        self._shares = shares or NoShares()
        self._pids = pids or ProcPodResolver()
        self.clock = clock
        self.interval_s = interval_s
        self.read_timeout_s = read_timeout_s
        self.started_at = clock()
        self._latest: ExporterSnapshot | None = None
        self._pending: Future[tuple[NodeInventory, tuple[GpuMetrics, ...]]] | None = None
        self._lock = threading.Lock()  # one refresh at a time
        self._counts_lock = threading.Lock()
        self._failures: dict[str, int] = {}
        self.pod_resources_ok: bool | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> ExporterSnapshot | None:
        return self._latest  # a single reference read: atomic, never blocks

    def failures(self) -> dict[str, int]:
        with self._counts_lock:
            return dict(self._failures)

    def _fail(self, stage: str) -> None:
        with self._counts_lock:
            self._failures[stage] = self._failures.get(stage, 0) + 1

    def _read_gpus(self) -> tuple[NodeInventory, tuple[GpuMetrics, ...]]:
        return self._inventory(), self._metrics.read_metrics()

    def refresh_once(self) -> bool:
        """One refresh; ``True`` when a new snapshot was published."""
        with self._lock:
            return self._refresh()

    def _refresh(self) -> bool:
        started = self.clock()
        if self._pending is not None:
            # The last read overran its timeout. Give it one more timeout to finish (its data
            # is old by now, so it is dropped); if it is still stuck, do not pile a second
            # NVML call on top of it.
            try:
                self._pending.result(timeout=self.read_timeout_s)
            except FutureTimeout:
                self._fail("nvml_busy")
                log.warning(
                    "node %s: previous NVML read still running; keeping the snapshot from %s",
                    self.node,
                    "never"
                    if self._latest is None
                    else f"{started - self._latest.taken_at:.0f}s ago",
                )
                return False
            except Exception:
                pass  # already counted when it timed out
            self._pending = None
        self._pending = _in_daemon_thread(self._read_gpus, "kubegpu-nvml-read")
        try:
            inventory, readings = self._pending.result(timeout=self.read_timeout_s)
        except FutureTimeout:
            self._fail("nvml_timeout")
            log.warning(
                "node %s: NVML read exceeded %.1fs; serving the last snapshot",
                self.node,
                self.read_timeout_s,
            )
            return False
        except Exception:
            self._fail("nvml_error")
            log.exception("node %s: NVML read failed; serving the last snapshot", self.node)
            return False
        self._pending = None
        known = [gpu.uuid for gpu in inventory.gpus]
        assignments = self._read_assignments()
        holders = None if assignments is None else containers_by_gpu(assignments, known)
        shares, shares_known = self._read_shares()
        pod_of_pid, resolvable = self._read_pids(readings)
        memory_total = {gpu.uuid: gpu.memory_total_mib * 1024 * 1024 for gpu in inventory.gpus}
        snapshot = ExporterSnapshot(
            node=self.node,
            taken_at=self.clock(),
            duration_seconds=max(0.0, self.clock() - started),
            inventory=inventory,
            metrics={m.uuid: m for m in readings},
            holders=holders,
            allocation=(
                {} if holders is None else allocation_by_gpu(holders, shares, memory_total)
            ),
            attribution=attribute_processes(
                readings, pod_of_pid, shares, pods_resolvable=resolvable
            ),
            shares=shares,
            shares_known=shares_known,
            mig_holders=None if assignments is None else containers_by_mig(assignments, inventory),
        )
        self._latest = snapshot
        return True

    def _read_assignments(self) -> tuple[DeviceAssignment, ...] | None:
        if self._pod_resources is None:
            return None
        try:
            assignments = self._pod_resources.list_assignments()
        except Exception as exc:
            self._fail("pod_resources")
            if self.pod_resources_ok is not False:
                log.warning(
                    "node %s: kubelet PodResources unavailable: %s", self.node, _describe(exc)
                )
            self.pod_resources_ok = False
            return None
        self.pod_resources_ok = True
        return tuple(assignments)

    def _read_shares(self) -> tuple[dict[PodKey, tuple[PodGpuShare, ...]], bool]:
        """The pods' shares, and whether they are known (a lookup is configured and answered)."""
        try:
            shares = {pod: tuple(s) for pod, s in self._shares.shares().items()}
        except Exception:
            self._fail("shares")
            log.exception("node %s: reading pod shares failed", self.node)
            return {}, False
        return shares, not isinstance(self._shares, NoShares)

    def _read_pids(self, readings: tuple[GpuMetrics, ...]) -> tuple[dict[int, PodKey], bool]:
        """PID -> pod for the GPU processes, and whether pods could be resolved at all."""
        if self._pod_directory is None:
            return {}, False
        pids = {p.pid for m in readings for p in (m.processes or ())}
        try:
            uids = self._pids.pod_uids(pids)
            pods = self._pod_directory.pods_by_uid()
        except Exception:
            self._fail("pods")
            log.exception("node %s: mapping GPU processes to pods failed", self.node)
            return {}, False
        return {pid: pods[uid] for pid, uid in uids.items() if uid in pods}, True

    # -- background loop -------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="kubegpu-refresher", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                self.refresh_once()
            except Exception:
                self._fail("internal")
                log.exception("node %s: refresh failed", self.node)
            if self._stop.wait(self.interval_s):
                return

    def stop(self, timeout_s: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            # A refresh waits at most read_timeout_s on NVML, so this join is bounded.
            self._thread.join(self.read_timeout_s + 1.0 if timeout_s is None else timeout_s)
            self._thread = None
