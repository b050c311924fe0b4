"""The NVML metrics reader on a real GPU (``-m gpu``); skipped everywhere else."""

from __future__ import annotations

import pytest

from kubegpu.inventory.nvml_metrics import NvmlMetricsSource

pytestmark = pytest.mark.gpu


def test_nvml_reads_every_gpu_with_plausible_values() -> None:
    source = NvmlMetricsSource()
    try:
        readings = source.read_metrics()
    finally:
        source.close()
    assert readings
    for gpu in readings:
        assert gpu.uuid.startswith(("GPU-", "MIG-"))
        assert gpu.memory_total_bytes and gpu.memory_total_bytes > 0
        assert gpu.memory_used_bytes is not None
        assert gpu.memory_used_bytes <= gpu.memory_total_bytes
        if gpu.utilization_ratio is not None:
            assert 0.0 <= gpu.utilization_ratio <= 1.0
        if gpu.temperature_celsius is not None:
            assert 0 < gpu.temperature_celsius < 120
        for clock in (gpu.sm_clock_hertz, gpu.memory_clock_hertz, gpu.graphics_clock_hertz):
            if clock is not None:
                assert clock > 1e6  # MHz were converted to Hz
