"""Live GPU metrics read from NVML: the only place besides the NVML backend that calls pynvml.

One :meth:`NvmlMetricsSource.read_metrics` reads every GPU once and freezes the result. A query
the GPU or driver does not support (``NVML_ERROR_NOT_SUPPORTED``), or that we may not make
(``NO_PERMISSION``, common for per-process memory inside a container), becomes ``None`` so the
metric is absent instead of a misleading zero. NVML calls can block for a long time on a wedged
GPU; callers must not call this on a latency-sensitive path (the exporter calls it from a
background refresher).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.metrics import GpuMetrics, ProcessGpuMemory
from kubegpu.inventory import nvml_session

log = logging.getLogger(__name__)

_T = TypeVar("_T")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlMetricsSource:
    name = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        # ``nvml``: the pynvml module, or a stand-in for tests; imported lazily when None.
        self._lock = threading.Lock()
        self._nvml: Any = None
        self._injected = nvml

    def _init(self) -> Any:
        """The NVML module, held (called with ``_lock`` held)."""
        if self._nvml is None:
            # One process-wide NVML session, shared with the inventory backend.
            self._nvml = nvml_session.acquire(self._injected)
        return self._nvml

    def _optional(self, uuid: str, what: str, call: Callable[[], _T]) -> _T | None:
        nvml = self._nvml
        try:
            return call()
        except nvml.NVMLError as exc:
            unsupported = (
                nvml.NVML_ERROR_NOT_SUPPORTED,
                nvml.NVML_ERROR_NO_PERMISSION,
                # The bindings know the call but the installed driver's library does not.
                nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            )
            if getattr(exc, "value", None) not in unsupported:
                log.warning("gpu %s: reading %s failed: %s", uuid, what, exc)
            return None

    def _processes(self, nvml: Any, handle: Any, uuid: str) -> tuple[ProcessGpuMemory, ...] | None:
        """The GPU's compute processes, MPS clients included. Under MPS a client's kernels run
        in the MPS server's context, so the plain list shows the server and NVML lists the
        clients (the pods' processes) separately; without them a shared pod under
        ``enforcement: mps`` would use no memory at all. ``None`` when the plain list cannot be
        read: the MPS list alone would pass for a complete one."""
        opt = self._optional
        procs = opt(uuid, "processes", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        if procs is None:
            return None
        mps_list = getattr(nvml, "nvmlDeviceGetMPSComputeRunningProcesses", None)
        mps = [] if mps_list is None else opt(uuid, "MPS processes", lambda: mps_list(handle))
        found: dict[int, ProcessGpuMemory] = {}
        for p in [*procs, *(mps or ())]:
            # pynvml reports an unknown per-process usage as None
            entry = ProcessGpuMemory(
                pid=int(p.pid),
                used_memory_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
            )
            known = found.get(entry.pid)
            # A process in both lists is counted once, with the reading that has a number.
            if known is None or known.used_memory_bytes is None:
                found[entry.pid] = entry
        return tuple(found.values())

    def read_metrics(self) -> tuple[GpuMetrics, ...]:
        with self._lock:
            nvml = self._init()
            readings = []
            for index in range(nvml.nvmlDeviceGetCount()):
                try:
                    readings.append(self._read_one(nvml, nvml.nvmlDeviceGetHandleByIndex(index)))
                except nvml.NVMLError as exc:
                    # One lost GPU must not blank the metrics of the others; its own series
                    # go absent and the health watcher reports it lost.
                    log.warning("gpu index %d: cannot read metrics: %s", index, exc)
            return tuple(readings)

    def _read_one(self, nvml: Any, handle: Any) -> GpuMetrics:
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        opt = self._optional
        util = opt(uuid, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        memory = opt(uuid, "memory info", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        temperature = opt(
            uuid,
            "temperature",
            lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
        )
        power_mw = opt(uuid, "power", lambda: nvml.nvmlDeviceGetPowerUsage(handle))

        def clock_hz(kind: int, what: str) -> float | None:
            # Current clocks in MHz, one cheap call each (no sampling, unlike utilisation).
            mhz = opt(uuid, what, lambda: nvml.nvmlDeviceGetClockInfo(handle, kind))
            return None if mhz is None else mhz * 1e6

        def ecc(kind: int) -> int | None:
            # Volatile counters (since the driver loaded): a reset reads as a counter reset,
            # which Prometheus handles; aggregate counters lag until the next InfoROM flush.
            return opt(
                uuid,
                "ECC errors",
                lambda: int(nvml.nvmlDeviceGetTotalEccErrors(handle, kind, nvml.NVML_VOLATILE_ECC)),
            )

        processes = self._processes(nvml, handle, uuid)
        return GpuMetrics(
            uuid=GpuUuid(uuid),
            utilization_ratio=None if util is None else util.gpu / 100.0,
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            temperature_celsius=None if temperature is None else float(temperature),
            power_watts=None if power_mw is None else power_mw / 1000.0,
            sm_clock_hertz=clock_hz(nvml.NVML_CLOCK_SM, "SM clock"),
            memory_clock_hertz=clock_hz(nvml.NVML_CLOCK_MEM, "memory clock"),
            graphics_clock_hertz=clock_hz(nvml.NVML_CLOCK_GRAPHICS, "graphics clock"),
            ecc_corrected_total=ecc(nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ecc_uncorrected_total=ecc(nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            processes=processes,
        )

    def close(self) -> None:
        with self._lock:
            if self._nvml is not None:
                nvml_session.release(self._nvml)
                self._nvml = None
