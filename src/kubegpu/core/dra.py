"""The DRA driver's own values: claims, what the scheduler allocated, what we prepared.

Wire types (DRA protobufs, ResourceClaim JSON) are converted into these at the edge. A share
(KEP-5075 consumable capacity) is an allocation with a ``share_id`` and the capacity it consumed;
a whole-GPU allocation has neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_DRIVER_NAME = "gpu.kubegpu.io"

# Capacity names in the ResourceSlice (unqualified: they live in the driver's domain).
CAPACITY_MEMORY = "memory"
CAPACITY_COMPUTE = "compute"

# A device in a slice is named after the GPU's index: a DNS label, stable across restarts of the
# driver as long as the card stays in its slot.
_DEVICE_NAME = re.compile(r"^gpu-(\d+)$")


def device_name(index: int) -> str:
    return f"gpu-{index}"


def device_index(name: str) -> int | None:
    """The GPU index a device name stands for; None for a name we never publish."""
    match = _DEVICE_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it in NodePrepare/NodeUnprepare."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class AllocatedDevice:
    """One ``status.allocation.devices.results`` entry of our driver.

    ``memory_bytes`` / ``compute_milli`` are the consumed capacity of a share; None when the
    allocation consumed none (whole-device allocation, or a device without multiple allocations).
    """

    request: str
    pool: str
    device: str
    share_id: str | None = None
    memory_bytes: int | None = None
    compute_milli: int | None = None


@dataclass(frozen=True)
class ClaimAllocation:
    claim: ClaimRef
    devices: tuple[AllocatedDevice, ...]


@dataclass(frozen=True)
class PreparedDevice:
    """What NodePrepareResources answers for one allocated device."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PreparedClaim:
    claim: ClaimRef
    devices: tuple[PreparedDevice, ...]
