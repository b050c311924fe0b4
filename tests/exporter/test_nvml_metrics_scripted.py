"""The NVML metrics reader against a scripted ``pynvml`` (the inventory tests' stand-in, with
NVML's real constants, errors and structs), extended with the live-metric calls: unit
conversions, unsupported readings as ``None``, and a lost GPU not blanking the others."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pynvml as real
import pytest

from kubegpu.core.backend import InventoryError
from kubegpu.inventory.nvml_metrics import NvmlMetricsSource
from tests.inventory.scripted_nvml import ScriptedGpu, ScriptedNvml, nvml_error


@dataclass
class Live:
    gpu_percent: int = 37
    used_bytes: int = 3 * 1024**3
    temperature_c: int = 64
    power_mw: int = 215_500
    sm_mhz: int = 1410
    mem_mhz: int = 1593
    graphics_mhz: int = 1395
    unsupported_clocks: set[int] = field(default_factory=set)  # NVML_CLOCK_* not supported
    ecc: dict[int, int] = field(default_factory=lambda: {0: 5, 1: 1})  # error type -> count
    # pid -> used bytes (None: NVML_VALUE_NOT_AVAILABLE, as pynvml reports it)
    processes: dict[int, int | None] = field(default_factory=lambda: {4242: 1024**3})
    # MPS clients, listed by nvmlDeviceGetMPSComputeRunningProcesses (pid -> used bytes)
    mps_processes: dict[int, int | None] = field(default_factory=dict)
    mps_error: int | None = None  # an NVML error code the MPS list answers with


class MetricsNvml(ScriptedNvml):
    def __init__(self, gpus: list[ScriptedGpu], live: list[Live]) -> None:
        super().__init__(gpus)
        self.live = live

    def _live(self, name: str, handle: Any) -> Live:
        self._gpu(name, handle)  # init, lost and NOT_SUPPORTED checks
        return self.live[handle.index]

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        rates = real.c_nvmlUtilization_t()
        rates.gpu = self._live("nvmlDeviceGetUtilizationRates", handle).gpu_percent
        return rates

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        memory = super().nvmlDeviceGetMemoryInfo(handle)
        memory.used = self.live[handle.index].used_bytes
        memory.free = memory.total - memory.used
        return memory

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        if sensor != real.NVML_TEMPERATURE_GPU:
            raise nvml_error(real.NVML_ERROR_INVALID_ARGUMENT)
        return self._live("nvmlDeviceGetTemperature", handle).temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._live("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        live = self._live("nvmlDeviceGetClockInfo", handle)
        if clock in live.unsupported_clocks:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        readings = {
            real.NVML_CLOCK_SM: live.sm_mhz,
            real.NVML_CLOCK_MEM: live.mem_mhz,
            real.NVML_CLOCK_GRAPHICS: live.graphics_mhz,
        }
        if clock not in readings:
            raise nvml_error(real.NVML_ERROR_INVALID_ARGUMENT)
        return readings[clock]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        if counter != real.NVML_VOLATILE_ECC:
            raise nvml_error(real.NVML_ERROR_INVALID_ARGUMENT)
        return self._live("nvmlDeviceGetTotalEccErrors", handle).ecc[error_type]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        live = self._live("nvmlDeviceGetComputeRunningProcesses", handle)
        return process_infos(live.processes)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        live = self._live("nvmlDeviceGetMPSComputeRunningProcesses", handle)
        if live.mps_error is not None:
            raise nvml_error(live.mps_error)
        return process_infos(live.mps_processes)


def process_infos(processes: dict[int, int | None]) -> list[Any]:
    found = []
    for pid, used in processes.items():
        info = real.nvmlStructToFriendlyObject(real.c_nvmlProcessInfo_t())
        info.pid = pid
        info.usedGpuMemory = used
        found.append(info)
    return found


UUIDS = [f"GPU-0000000{i}-0000-0000-0000-000000000000" for i in range(3)]


def node(**unsupported: set[str]) -> MetricsNvml:
    gpus = [
        ScriptedGpu(uuid=uuid, minor=i, unsupported=unsupported.get(f"gpu{i}", set()))
        for i, uuid in enumerate(UUIDS)
    ]
    return MetricsNvml(gpus, [Live() for _ in UUIDS])


def test_readings_are_converted_to_base_units() -> None:
    nvml = node()
    nvml.live[1].processes = {7: 2 * 1024**3, 8: None}
    source = NvmlMetricsSource(nvml)
    readings = {r.uuid: r for r in source.read_metrics()}
    gpu = readings[UUIDS[1]]
    assert gpu.utilization_ratio == pytest.approx(0.37)
    assert gpu.memory_used_bytes == 3 * 1024**3
    assert gpu.memory_total_bytes == nvml.gpus[1].memory_total_bytes
    assert gpu.temperature_celsius == 64.0
    assert gpu.power_watts == pytest.approx(215.5)
    assert gpu.sm_clock_hertz == 1410e6
    assert gpu.memory_clock_hertz == 1593e6
    assert gpu.graphics_clock_hertz == 1395e6
    assert (gpu.ecc_corrected_total, gpu.ecc_uncorrected_total) == (5, 1)
    assert [(p.pid, p.used_memory_bytes) for p in gpu.processes or ()] == [
        (7, 2 * 1024**3),
        (8, None),
    ]
    source.close()
    assert nvml.initialised == 0


def test_unsupported_readings_become_none_and_the_rest_still_reads() -> None:
    nvml = node(
        gpu2={
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetComputeRunningProcesses",
        }
    )
    gpu = {r.uuid: r for r in NvmlMetricsSource(nvml).read_metrics()}[UUIDS[2]]
    assert gpu.power_watts is None
    assert gpu.ecc_corrected_total is None and gpu.ecc_uncorrected_total is None
    assert gpu.processes is None  # "cannot list", not "no processes"
    assert gpu.temperature_celsius == 64.0


def test_a_lost_gpu_is_left_out_and_the_others_are_read() -> None:
    nvml = node()
    nvml.set_lost(0, True)
    readings = NvmlMetricsSource(nvml).read_metrics()
    assert [r.uuid for r in readings] == UUIDS[1:]


def test_init_failure_is_an_inventory_error_with_a_hint() -> None:
    nvml = node()
    nvml.init_error = real.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(InventoryError) as info:
        NvmlMetricsSource(nvml).read_metrics()
    assert "driver" in info.value.hint


MIB = 1024**2


def processes_of(nvml: MetricsNvml, index: int) -> dict[int, int | None] | None:
    gpu = {r.uuid: r for r in NvmlMetricsSource(nvml).read_metrics()}[UUIDS[index]]
    if gpu.processes is None:
        return None
    pids = [p.pid for p in gpu.processes]
    assert len(pids) == len(set(pids)), pids  # each process once
    return {p.pid: p.used_memory_bytes for p in gpu.processes}


def test_mps_clients_are_listed_beside_the_compute_processes_once_each() -> None:
    nvml = node()
    # Under MPS the plain list has the MPS server; the pods' processes are its clients.
    nvml.live[0].processes = {100: 300 * MIB, 4242: 1024 * MIB, 7: None}
    nvml.live[0].mps_processes = {4242: 1024 * MIB, 5001: 2048 * MIB, 7: 64 * MIB}
    assert processes_of(nvml, 0) == {
        100: 300 * MIB,
        4242: 1024 * MIB,
        5001: 2048 * MIB,
        7: 64 * MIB,  # the reading with a number wins over "not available"
    }


def test_bindings_without_the_mps_call_read_the_compute_list_alone() -> None:
    nvml = node()
    nvml.live[0].mps_processes = {5001: 2048 * MIB}
    nvml.missing = {"nvmlDeviceGetMPSComputeRunningProcesses"}
    assert processes_of(nvml, 0) == {4242: 1024**3}


@pytest.mark.parametrize(
    "code",
    [real.NVML_ERROR_NOT_SUPPORTED, real.NVML_ERROR_FUNCTION_NOT_FOUND],
    ids=["not-supported", "driver-lacks-the-function"],
)
def test_an_mps_list_the_driver_cannot_give_is_left_out_quietly(
    code: int, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = node()
    nvml.live[0].mps_error = code
    with caplog.at_level(logging.WARNING):
        assert processes_of(nvml, 0) == {4242: 1024**3}
    assert not caplog.records


def test_mps_clients_alone_are_not_passed_off_as_the_full_process_list() -> None:
    nvml = node(gpu1={"nvmlDeviceGetComputeRunningProcesses"})
    nvml.live[1].mps_processes = {5001: 2048 * MIB}
    assert processes_of(nvml, 1) is None


def test_a_clock_the_gpu_does_not_report_is_absent_and_the_others_read() -> None:
    nvml = node()
    nvml.live[0].unsupported_clocks = {real.NVML_CLOCK_MEM}
    gpu = {r.uuid: r for r in NvmlMetricsSource(nvml).read_metrics()}[UUIDS[0]]
    assert gpu.memory_clock_hertz is None
    assert (gpu.sm_clock_hertz, gpu.graphics_clock_hertz) == (1410e6, 1395e6)
