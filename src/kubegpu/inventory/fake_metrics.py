"""A scriptable stand-in for NVML's live metrics, for tests, demos and benchmarks without a GPU.

Values start from plausible idle readings derived from the inventory and are changed with
:meth:`FakeMetricsSource.set` / :meth:`set_processes`. :meth:`hang` makes the next reads block
until :meth:`release`, the way NVML can block on a wedged GPU, so the exporter's bounded scrape
can be tested.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.core.metrics import GpuMetrics, ProcessGpuMemory

_MIB = 1024 * 1024


class FakeMetricsSource:
    name = "fake"

    def __init__(self, inventory: NodeInventory) -> None:
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._released.set()
        self.reads = 0  # how many reads completed (tests wait on refreshes with it)
        self._metrics: dict[GpuUuid, GpuMetrics] = {
            gpu.uuid: GpuMetrics(
                uuid=gpu.uuid,
                utilization_ratio=0.0,
                memory_used_bytes=0,
                memory_total_bytes=gpu.memory_total_mib * _MIB,
                temperature_celsius=35.0,
                power_watts=50.0,
                sm_clock_hertz=1_410_000_000.0,
                memory_clock_hertz=1_215_000_000.0,
                graphics_clock_hertz=1_410_000_000.0,
                ecc_corrected_total=0,
                ecc_uncorrected_total=0,
                processes=(),
            )
            for gpu in inventory.gpus
        }

    def set(self, uuid: GpuUuid, **fields: Any) -> None:
        """Change some fields of one GPU's reading (``None`` makes a metric unsupported)."""
        with self._lock:
            self._metrics[uuid] = replace(self._metrics[uuid], **fields)

    def set_processes(self, uuid: GpuUuid, processes: dict[int, int | None] | None) -> None:
        """Replace the GPU's running processes (pid -> used bytes); memory used follows their
        sum. ``None`` means the driver cannot list processes on this GPU."""
        with self._lock:
            current = self._metrics[uuid]
            if processes is None:
                self._metrics[uuid] = replace(current, processes=None)
                return
            listed = tuple(ProcessGpuMemory(pid, used) for pid, used in sorted(processes.items()))
            total = sum(used or 0 for used in processes.values())
            self._metrics[uuid] = replace(current, processes=listed, memory_used_bytes=total)

    def hang(self) -> None:
        """Make reads block (as NVML does on a wedged GPU) until :meth:`release`."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def read_metrics(self) -> tuple[GpuMetrics, ...]:
        self._released.wait()
        with self._lock:
            self.reads += 1
            return tuple(self._metrics.values())

    def close(self) -> None:
        self.release()  # never leave a reader thread blocked behind us
