"""Assertions every GPU backend must satisfy; run against the fake, the NVML stand-in, real NVML."""

from __future__ import annotations

import ctypes
import itertools
import re

from kubegpu.core.backend import GpuBackend
from kubegpu.core.gpu import NodeInventory

UUID_FORM = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
BUS_ID_FORM = re.compile(r"^[0-9A-F]{4,8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")


def check_inventory(inventory: NodeInventory) -> None:
    """Ids are unique and well formed, sizes sane, and a link is known for every pair."""
    gpus = list(inventory)
    assert [gpu.index for gpu in gpus] == list(range(len(gpus)))
    assert len({gpu.uuid for gpu in gpus}) == len(gpus)
    assert len({gpu.minor_number for gpu in gpus}) == len(gpus)
    assert len({gpu.pci_bus_id for gpu in gpus}) == len(gpus)
    for gpu in gpus:
        assert UUID_FORM.match(gpu.uuid), gpu.uuid
        assert BUS_ID_FORM.match(gpu.pci_bus_id), gpu.pci_bus_id
        assert gpu.product_name
        assert 1024 <= gpu.memory_total_mib <= 1024 * 1024, gpu.memory_total_mib
        assert gpu.device_node == f"/dev/nvidia{gpu.minor_number}"
        if gpu.compute_capability is not None:
            assert gpu.compute_capability[0] >= 3
        if gpu.numa_node is not None:
            assert gpu.numa_node >= 0
    for a, b in itertools.combinations(gpus, 2):
        link = inventory.link(a.uuid, b.uuid)
        assert link is not None, f"no topology for GPUs {a.index} and {b.index}"
        assert link.nvlinks >= 0
        assert inventory.link(b.uuid, a.uuid) == link
    assert len(inventory.links) == len(gpus) * (len(gpus) - 1) // 2


def check_backend(backend: GpuBackend) -> NodeInventory:
    """The snapshot is valid and stable across reads; an idle watcher waits and reports nothing."""
    first = backend.snapshot()
    check_inventory(first)
    assert backend.snapshot() == first
    if len(first):
        watcher = backend.watch_health(first.gpus[0].uuid)
        try:
            assert watcher.wait(0.1) == []
        finally:
            watcher.close()
    return first


def nvml_present() -> bool:
    """Whether this machine has the NVML library (tests about its absence skip otherwise)."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True
