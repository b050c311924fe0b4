"""Health through NVML: one watcher per GPU on an NVML event set (Xids, double-bit ECC), plus a
lost-GPU check while it waits. The NVML backend opens one per GPU for the health monitor."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.health import HealthEvent, HealthEventKind
from kubegpu.inventory.nvml_mig import event_detail, event_instance
from kubegpu.inventory.nvml_session import (
    _LOST_ERRORS,
    _UNSUPPORTED_ERRORS,
    _code,
    _error_name,
    translate_nvml_error,
)

log = logging.getLogger(__name__)


class NvmlHealthWatcher:
    """One NVML event set for one GPU (Xid and ECC events) plus a device-lost check per wait.

    Meant to be waited on by one thread. ``close`` may come from another thread: the event set
    is then freed by the waiting thread when its wait returns, never under it.
    """

    def __init__(self, nvml: Any, handle: Any, uuid: GpuUuid) -> None:
        self._nvml = nvml
        self._handle = handle
        self.uuid = uuid
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._waiting = False
        self._lost = False
        self._wait_error_logged = False
        self._xid_type = _code(nvml, "nvmlEventTypeXidCriticalError") or 0
        self._dbe_type = _code(nvml, "nvmlEventTypeDoubleBitEccError") or 0
        self._sbe_type = _code(nvml, "nvmlEventTypeSingleBitEccError") or 0
        self._event_set: Any = None
        try:
            self._event_set = nvml.nvmlEventSetCreate()
            self._register()
        except nvml.NVMLError as exc:
            self._free()
            raise translate_nvml_error(
                nvml, exc, f"registering health events for GPU {uuid}"
            ) from exc

    def _register(self) -> None:
        nvml = self._nvml
        wanted = self._xid_type | self._dbe_type | self._sbe_type
        try:
            supported = int(nvml.nvmlDeviceGetSupportedEventTypes(self._handle))
        except nvml.NVMLError as exc:
            if _error_name(nvml, exc) not in _UNSUPPORTED_ERRORS:
                raise
            supported = 0
        mask = supported & wanted
        if mask:
            try:
                nvml.nvmlDeviceRegisterEvents(self._handle, mask, self._event_set)
                return
            except nvml.NVMLError as exc:
                # NOT_SUPPORTED means a GPU too old for events (NVIDIA skips it, #1562).
                if _error_name(nvml, exc) not in _UNSUPPORTED_ERRORS:
                    raise
        log.warning(
            "GPU %s supports no Xid/ECC events; only checking whether it still answers", self.uuid
        )
        self._free()

    def wait(self, timeout_s: float) -> list[HealthEvent]:
        with self._lock:
            if self._closing.is_set():
                return []
            self._waiting = True
        try:
            events = self._wait_events(timeout_s)
            events.extend(self._check_lost())
            return events
        finally:
            with self._lock:
                self._waiting = False
                if self._closing.is_set():
                    self._free()

    def _wait_events(self, timeout_s: float) -> list[HealthEvent]:
        nvml = self._nvml
        if self._event_set is None:
            self._closing.wait(timeout_s)
            return []
        try:
            data = nvml.nvmlEventSetWait_v2(self._event_set, max(1, int(timeout_s * 1000)))
        except nvml.NVMLError as exc:
            name = _error_name(nvml, exc)
            if name == "NVML_ERROR_TIMEOUT":
                return []
            # Waiting fails at once when the GPU is gone; pause so this is not a busy loop, and
            # let the lost check below decide what it means.
            if name not in _LOST_ERRORS and not self._wait_error_logged:
                log.warning("GPU %s: waiting for NVML events failed: %s", self.uuid, exc)
                self._wait_error_logged = True
            self._closing.wait(timeout_s)
            return []
        self._wait_error_logged = False
        return self._translate(data)

    def _translate(self, data: Any) -> list[HealthEvent]:
        kind = int(data.eventType)
        detail = event_detail(data)
        gi, ci = event_instance(data)
        if kind & self._xid_type:
            return [
                HealthEvent(
                    HealthEventKind.XID,
                    self.uuid,
                    xid=int(data.eventData),
                    detail=detail,
                    gpu_instance_id=gi,
                    compute_instance_id=ci,
                )
            ]
        if kind & self._dbe_type:
            # A double-bit ECC error is what Xid 48 reports; one code keeps one policy.
            return [
                HealthEvent(
                    HealthEventKind.XID,
                    self.uuid,
                    xid=48,
                    detail=", ".join(filter(None, ["double-bit ECC event", detail])),
                    gpu_instance_id=gi,
                    compute_instance_id=ci,
                )
            ]
        # Single-bit errors are corrected by the hardware; NVIDIA logs and skips them too.
        log.debug("GPU %s: NVML event 0x%x ignored", self.uuid, kind)
        return []

    def _check_lost(self) -> list[HealthEvent]:
        nvml = self._nvml
        try:
            nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except nvml.NVMLError as exc:
            if _error_name(nvml, exc) in _LOST_ERRORS and not self._lost:
                self._lost = True
                return [HealthEvent(HealthEventKind.LOST, self.uuid, detail=str(exc))]
            return []
        if self._lost:
            self._lost = False
            return [
                HealthEvent(HealthEventKind.RECOVERED, self.uuid, detail="GPU answers NVML again")
            ]
        return []

    def close(self) -> None:
        with self._lock:
            self._closing.set()
            if not self._waiting:
                self._free()

    def _free(self) -> None:
        event_set, self._event_set = self._event_set, None
        if event_set is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlEventSetFree(event_set)
