"""The machine facts beside the GPUs' (GFD's ``gpu.machine`` and ``gpu.mode``), read from a
hand-made sysfs tree: what the files say, GFD's ``unknown`` when they cannot be read, and PCI
classes only for real GPUs."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import pytest

from kubegpu.core.gpu import NodeInventory
from kubegpu.core.health import HealthCheckPolicy
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.labels.catalogue import PCI_CLASS_3D, PCI_CLASS_VGA, SharingSummary
from kubegpu.labels.host import read_host_facts, read_machine_type, read_pci_classes
from kubegpu.roles.labeller import run_labeller

from .memory_sink import MemorySink

A100 = "8xA100-80GB-NVLink"  # bus ids 00000000:07:00.0, 00000000:0F:00.0, ...


def sysfs_tree(root: Path, inventory: NodeInventory, classes: Mapping[int, str]) -> Path:
    """``bus/pci/devices`` with a ``class`` file for the GPUs of the given indices."""
    devices = root / "bus" / "pci" / "devices"
    for gpu in inventory.gpus:
        if gpu.index in classes:
            folder = devices / ("0000:" + gpu.pci_bus_id.split(":", 1)[1].lower())
            folder.mkdir(parents=True)
            (folder / "class").write_text(classes[gpu.index] + "\n")
    devices.mkdir(parents=True, exist_ok=True)
    return devices


def test_the_machine_type_is_the_files_text(tmp_path: Path) -> None:
    path = tmp_path / "product_name"
    path.write_text("DGX H100\n")
    assert read_machine_type(path) == "DGX H100"


def test_an_unreadable_machine_type_is_unknown_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="kubegpu.labels.host"):
        assert read_machine_type(tmp_path / "absent") == "unknown"
    assert "machine type unknown" in caplog.text


def test_pci_classes_are_read_by_sysfs_name_and_an_unreadable_one_is_left_out(
    tmp_path: Path,
) -> None:
    inventory = FakeGpuBackend.from_spec(A100).snapshot()
    devices = sysfs_tree(tmp_path, inventory, {0: "0x030200", 1: "0x030000", 2: "garbage"})
    classes = read_pci_classes(inventory, devices)
    first, second = inventory.gpus[0].pci_bus_id, inventory.gpus[1].pci_bus_id
    assert classes == {first: PCI_CLASS_3D, second: PCI_CLASS_VGA}


def test_without_a_pci_tree_no_class_is_read(tmp_path: Path) -> None:
    inventory = FakeGpuBackend.from_spec(A100).snapshot()
    facts = read_host_facts(inventory, machine_type_file=tmp_path / "absent", pci_devices=None)
    assert (facts.machine_type, dict(facts.pci_classes)) == ("unknown", {})


class NvmlNamed:
    """The fake's GPUs under the NVML backend's name: what the role decides on."""

    name = "nvml"

    def __init__(self, fake: FakeGpuBackend) -> None:
        self.fake = fake
        self.snapshot = fake.snapshot
        self.watch_health = fake.watch_health
        self.close = fake.close


@pytest.mark.parametrize(("nvml", "mode"), [(True, "compute"), (False, "unknown")])
def test_the_role_reads_pci_classes_for_real_gpus_only(
    tmp_path: Path, nvml: bool, mode: str
) -> None:
    fake = FakeGpuBackend.from_spec(A100)
    devices = sysfs_tree(tmp_path, fake.snapshot(), dict.fromkeys(range(8), "0x030200"))
    sink = MemorySink()
    code = run_labeller(
        NvmlNamed(fake) if nvml else fake,
        sink,
        SharingSummary(),
        HealthCheckPolicy(),
        node_name="gpu-a",
        sink_name="memory",
        once=True,
        timestamp=False,
        interval_s=60.0,
        poll_s=10.0,
        wait_for_stop=lambda: None,
        machine_type_file=tmp_path / "absent",
        pci_devices=devices,
    )
    assert code == 0
    assert sink.labels["nvidia.com/gpu.mode"] == mode
    assert sink.labels["nvidia.com/gpu.machine"] == "unknown"
