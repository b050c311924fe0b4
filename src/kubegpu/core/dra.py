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
# vfio.gpu.nvidia.com; we publish MIG devices (type "mig", class mig.nvidia.com: docs/mig.md),
# no VFIO devices. The classes here are those whose claims the extender ranks as card shares.
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


# A MIG device (a static instance, or a placement dynamic MIG may create) is named as NVIDIA's
# DRA driver names it: the card, the profile without dots ("+" as "-"), nvidia-smi's profile
# id and the first memory slice: gpu-0-mig-1g10gb-19-3, gpu-0-mig-1g10gb-me-20-0.
_MIG_DEVICE_NAME = re.compile(r"^gpu-(\d+)-mig-([a-z0-9-]+)-(\d+)-(\d+)$")


@dataclass(frozen=True)
class MigPlacement:
    """What a MIG device's name says: which card, which profile, from which memory slice."""

    index: int
    profile_id: int
    start: int


def mig_device_name(index: int, profile: str, profile_id: int, start: int) -> str:
    label = profile.replace(".", "").replace("+", "-").lower()
    return f"gpu-{index}-mig-{label}-{profile_id}-{start}"


def mig_placement(name: str) -> MigPlacement | None:
    """The placement a MIG device name stands for; None for any other name."""
    match = _MIG_DEVICE_NAME.fullmatch(name)
    if match is None:
        return None
    return MigPlacement(int(match.group(1)), int(match.group(3)), int(match.group(4)))


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


# The one opaque config kubegpu reads: NVIDIA's GpuConfig, under either naming (docs/dra.md,
# "Opaque configs"). Its wire format is read by kubegpu.kube.gpu_config.
GPU_CONFIG_API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG_KIND = "GpuConfig"
DEFAULT_TIME_SLICE = "Default"


@dataclass(frozen=True)
class TimeSlicing:
    """GpuConfig ``sharing.strategy: TimeSlicing``; ``interval`` Default, Short, Medium or
    Long (absent: Default)."""

    interval: str = DEFAULT_TIME_SLICE


@dataclass(frozen=True)
class MpsSharing:
    """GpuConfig ``sharing.strategy: MPS`` with its ``mpsConfig``, in our units."""

    active_thread_percentage: int | None = None
    pinned_memory_bytes: int | None = None  # for every device the config applies to
    # Overrides of it: (key as written, bytes); a key is a GPU UUID or an index into the
    # devices the config applies to, in allocation order (as NVIDIA's driver reads it).
    per_device_pinned_memory_bytes: tuple[tuple[str, int], ...] = ()
    multi_user: bool = False


@dataclass(frozen=True)
class DeviceConfig:
    """One opaque config for our driver in ``status.allocation.devices.config``, decoded.

    ``problem``: why it cannot be read (an unknown kind or field, a bad value), one line;
    ``sharing`` is then None. A config naming no request applies to all of them."""

    index: int  # its place in status.allocation.devices.config, for messages
    source: str  # FromClass (the DeviceClass's) or FromClaim
    requests: tuple[str, ...]
    kind: str  # "<apiVersion> <kind>" as written
    sharing: TimeSlicing | MpsSharing | None = None
    problem: str | None = None

    def __str__(self) -> str:
        return f"status.allocation.devices.config[{self.index}] ({self.source} {self.kind})"

    def applies_to(self, request: str) -> bool:
        """Whether it applies to a result of ``request`` (``<request>[/<subrequest>]``): a
        config naming a parent request applies to each of its subrequests (the API's rule)."""
        return (
            not self.requests
            or request in self.requests
            or request.split("/", 1)[0] in self.requests
        )


@dataclass(frozen=True)
class ClaimAllocation:
    claim: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    # Our driver's opaque configs, lowest precedence first: the DeviceClass's, then the
    # claim's own, each in the order written.
    configs: tuple[DeviceConfig, ...] = ()

    def config_for(self, request: str) -> DeviceConfig | None:
        """The config that applies to a result of ``request``: the last one that names it or
        names no request, so the claim's word overrides its class's (NVIDIA's driver picks
        the same way); None when none applies."""
        found = None
        for config in self.configs:
            if config.applies_to(request):
                found = config
        return found

    def configs_in_use(self) -> list[DeviceConfig]:
        """The configs that apply to at least one of our results, overridden or not: each
        must be one we can read, as NVIDIA's strict decoder requires of every config."""
        return [c for c in self.configs if any(c.applies_to(d.request) for d in self.devices)]


# The request name of the NodePrepare answer's device that only a container naming the whole
# claim gets (the kubelet hands a container that names request R the devices whose request
# names hold R, and one naming no request all of them): not a DNS label, so no request of a
# claim has it and no container naming a request gets it (dra/driver.py).
WHOLE_CLAIM_REQUEST = "kubegpu.io/whole-claim"


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
