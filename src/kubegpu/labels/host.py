"""The machine facts GFD labels beside the GPUs' own: the machine type and the GPUs' PCI class.

NVML knows neither. GFD reads the DMI product name (``--machine-type-file``, for
``nvidia.com/gpu.machine``) and each GPU's sysfs ``class`` (for ``nvidia.com/gpu.mode``), and
so does this module, once when the labeller starts: neither changes while a machine runs. A
file that cannot be read gives GFD's own fallback (``unknown``) and a warning, never a failed
labeller. The PCI classes are read only for GPUs that are real (``pci_devices`` is ``None``
for the fake backend, whose bus ids would name whatever device the host has there).
"""

from __future__ import annotations

import logging
from pathlib import Path

from kubegpu.core.gpu import NodeInventory, pci_address
from kubegpu.labels.catalogue import HostFacts

log = logging.getLogger(__name__)

# GFD's default --machine-type-file, readable by every user and inside containers (sysfs).
DMI_PRODUCT_NAME = Path("/sys/class/dmi/id/product_name")
SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")


def read_machine_type(path: Path) -> str:
    """The machine type as the file says it (GFD's ``unknown`` when it cannot be read)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError as exc:
        log.warning("machine type unknown: cannot read %s: %s", path, exc)
        return "unknown"


def read_pci_classes(inventory: NodeInventory, pci_devices: Path) -> dict[str, int]:
    """Each GPU's PCI class by its NVML bus id; a GPU whose class cannot be read is left out."""
    classes: dict[str, int] = {}
    for gpu in inventory.gpus:
        path = pci_devices / pci_address(gpu.pci_bus_id) / "class"
        try:
            classes[gpu.pci_bus_id] = int(path.read_text(encoding="ascii").strip(), 0)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            log.warning("GPU %s: PCI class unknown: cannot read %s: %s", gpu.uuid, path, exc)
    return classes


def read_host_facts(
    inventory: NodeInventory, *, machine_type_file: Path, pci_devices: Path | None
) -> HostFacts:
    """The machine type, and the PCI classes of ``inventory``'s GPUs when ``pci_devices``
    (sysfs's ``bus/pci/devices``) is given."""
    return HostFacts(
        machine_type=read_machine_type(machine_type_file),
        pci_classes={} if pci_devices is None else read_pci_classes(inventory, pci_devices),
    )
