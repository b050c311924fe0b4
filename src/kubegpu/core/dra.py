"""The DRA driver's own values: claims, what the scheduler allocated, what we prepared.

Wire types (DRA protobufs, ResourceClaim JSON) are converted into these at the edge. A share
(KEP-5075 consumable capacity) is an allocation with a ``share_id`` and the capacity it consumed;
a whole-GPU allocation has neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kubegpu.core.names import is_dns_label, is_dns_subdomain

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


# UIDs end up in file names: what Kubernetes generates (UUIDs), nothing path-like.
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it in NodePrepare/NodeUnprepare."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"

    def problem(self) -> str | None:
        """Why this is not a claim Kubernetes could have named, or None. Checked before a
        name goes into a request URL or a UID into a file name: the kubelet sends only real
        names, but a name such as ``../../api/v1/namespaces/kube-system/secrets/x`` would
        otherwise make the driver read another object with its own credentials."""
        if not is_dns_label(self.namespace):
            return f"namespace {self.namespace!r:.80} is not a Kubernetes namespace (a DNS label)"
        if not is_dns_subdomain(self.name):
            return f"name {self.name!r:.80} is not a Kubernetes object name (a DNS subdomain)"
        if not _UID.fullmatch(self.uid):
            return f"uid {self.uid!r:.80} is not a Kubernetes UID"
        return None


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
