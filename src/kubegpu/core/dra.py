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


@dataclass(frozen=True)
class DraNaming:
    """The names our DRA driver publishes under: the driver (its slices, sockets, CDI kind and
    taint keys) and the DeviceClasses whose requests are for its GPUs.

    ``kubegpu`` is our own; ``nvidia`` is what NVIDIA's DRA driver (``gpu.nvidia.com``)
    publishes, so claims, CEL selectors and tests written for it run unchanged (the slice's
    attribute set follows too: :mod:`kubegpu.dra.slices`). A cluster uses one naming for the
    driver and the extender alike."""

    key: str
    driver: str
    device_classes: frozenset[str]
    # What a request that names no compute consumes of a card (the compute capacity's
    # requestPolicy default, in milli-cards). Ours: the whole card's, so a share names both
    # memory and compute. NVIDIA's devices have no compute capacity and its shares are by
    # memory alone: under its naming a request naming no compute consumes none, so two 2Gi
    # claims share a card as NVIDIA's consumable-shares tests expect, while a whole-GPU
    # request stays exclusive by its memory default (the whole card's memory).
    unnamed_compute_milli: int


KUBEGPU_NAMING = DraNaming(
    "kubegpu",
    DEFAULT_DRIVER_NAME,
    frozenset({"gpu.kubegpu.io", "gpu-share.kubegpu.io", "gpu-extended-resource.kubegpu.io"}),
    unnamed_compute_milli=1000,
)
# NVIDIA's chart ships gpu.nvidia.com (whole GPUs and, by capacity, shares), mig.nvidia.com and
# vfio.gpu.nvidia.com; we publish neither MIG nor VFIO devices.
NVIDIA_NAMING = DraNaming(
    "nvidia", "gpu.nvidia.com", frozenset({"gpu.nvidia.com"}), unnamed_compute_milli=0
)
DRA_NAMINGS: dict[str, DraNaming] = {n.key: n for n in (KUBEGPU_NAMING, NVIDIA_NAMING)}

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
