"""The backend contract against real NVML (run with ``pytest -m gpu`` on a GPU machine)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest

from kubegpu.inventory.nvml import NvmlBackend
from tests.inventory.contract import check_backend

pytestmark = pytest.mark.gpu


@pytest.fixture
def backend() -> Iterator[NvmlBackend]:
    nvml_backend = NvmlBackend()
    yield nvml_backend
    nvml_backend.close()


def test_real_nvml_meets_the_backend_contract(backend: NvmlBackend) -> None:
    inventory = check_backend(backend)
    assert len(inventory) >= 1
    assert inventory.driver_version
    assert inventory.cuda_driver_version


def test_every_real_gpu_can_be_watched_and_is_quiet(backend: NvmlBackend) -> None:
    for gpu in backend.snapshot():
        watcher = backend.watch_health(gpu.uuid)
        try:
            assert watcher.wait(0.1) == []
        finally:
            watcher.close()


def test_real_inventory_agrees_with_nvidia_smi(backend: NvmlBackend) -> None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH")
    output = subprocess.run(
        [smi, "--query-gpu=index,uuid,memory.total,pci.bus_id", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    rows = [[cell.strip() for cell in line.split(",")] for line in output.strip().splitlines()]
    inventory = backend.snapshot()
    assert [(int(r[0]), r[1], int(r[2]), r[3].upper()) for r in rows] == [
        (gpu.index, gpu.uuid, gpu.memory_total_mib, gpu.pci_bus_id) for gpu in inventory
    ]


def test_real_mig_mode_and_instances_agree_with_nvidia_smi(backend: NvmlBackend) -> None:
    """Reads only: MIG mode and, on a card in MIG mode, its instances. Never changes either."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH")
    output = subprocess.run(
        [smi, "--query-gpu=index,mig.mode.current", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    modes = {int(i): mode.strip() for i, mode in (line.split(",") for line in output.splitlines())}
    for gpu in backend.snapshot():
        # nvidia-smi says "[N/A]" for a card without MIG, where NVML answers NOT_SUPPORTED.
        expected = {"Enabled": True, "Disabled": False}.get(modes[gpu.index])
        assert gpu.mig_enabled is expected, (gpu.index, modes[gpu.index])
        if not gpu.mig_enabled:
            assert gpu.mig_devices == ()
            continue
        listing = subprocess.run(
            [smi, "-L", "-i", str(gpu.index)], capture_output=True, text=True, check=True
        ).stdout
        listed = {
            part.split("UUID: ")[1].rstrip(")") for part in listing.splitlines() if "MIG " in part
        }
        assert {m.uuid for m in gpu.mig_devices} == listed
        for mig in gpu.mig_devices:
            assert mig.parent_uuid == gpu.uuid and mig.memory_total_mib > 0
            assert 0 <= mig.start < 8 and mig.profile
