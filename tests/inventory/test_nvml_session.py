"""NVML is initialised once per process, however many readers use it: the inventory backend
and the metrics source share one session, and only the last to close shuts NVML down."""

from __future__ import annotations

import pynvml as real
import pytest

from kubegpu.core.backend import InventoryError
from kubegpu.inventory import nvml_session
from kubegpu.inventory.nvml import NvmlBackend
from kubegpu.inventory.nvml_metrics import NvmlMetricsSource
from tests.exporter.test_nvml_metrics_scripted import MetricsNvml, node
from tests.inventory.scripted_nvml import ScriptedNvml


def counting_nvml() -> MetricsNvml:
    """A scripted pynvml (three GPUs, live metrics) whose calls are recorded, so nvmlInit
    and nvmlShutdown can be counted."""
    return node()


def inits(nvml: ScriptedNvml) -> int:
    return nvml.calls.count("nvmlInit")


def test_backend_and_metrics_source_initialise_nvml_once_and_shut_it_down_once() -> None:
    nvml = counting_nvml()
    backend = NvmlBackend(nvml)
    metrics = NvmlMetricsSource(nvml)
    backend.snapshot()
    metrics.read_metrics()
    backend.snapshot()
    metrics.read_metrics()
    assert (inits(nvml), nvml.shutdowns) == (1, 0)
    assert nvml_session.holders(nvml) == 2
    backend.close()
    # The metrics source still reads: closing the backend did not shut NVML down under it.
    assert nvml.shutdowns == 0
    assert len(metrics.read_metrics()) == 3
    metrics.close()
    assert (inits(nvml), nvml.shutdowns) == (1, 1)
    assert nvml_session.holders(nvml) == 0


def test_closing_twice_releases_once() -> None:
    nvml = counting_nvml()
    first, second = NvmlBackend(nvml), NvmlBackend(nvml)
    first.init()
    second.init()
    first.close()
    first.close()
    assert nvml.shutdowns == 0
    second.close()
    assert (inits(nvml), nvml.shutdowns) == (1, 1)


def test_a_failed_init_holds_nothing_and_the_next_reader_tries_again() -> None:
    nvml = counting_nvml()
    nvml.init_error = real.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(InventoryError, match="driver not loaded"):
        NvmlMetricsSource(nvml).read_metrics()
    assert nvml_session.holders(nvml) == 0
    nvml.init_error = None
    backend = NvmlBackend(nvml)
    backend.snapshot()
    assert nvml_session.holders(nvml) == 1
    backend.close()
    assert nvml.shutdowns == 1
