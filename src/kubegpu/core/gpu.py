"""What a node's GPUs are: an immutable inventory snapshot.

Every edge (NVML, the fake backend, the device plugin, labels, the exporter) speaks these
types; wire types (protobuf, Kubernetes JSON, NVML structs) are converted at the edge. Fields
that a driver cannot report are ``None``, never a sentinel that could leak into arithmetic.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NewType

GpuUuid = NewType("GpuUuid", str)


class PcieLink(enum.IntEnum):
    """How two GPUs reach each other over PCIe, best first when compared with ``>``.

    Names follow ``nvidia-smi topo -m`` (NVML's ``nvmlGpuTopologyLevel_t`` in reverse order):
    a higher value is a closer, faster path.
    """

    SYS = 10  # crosses the inter-socket link (QPI/UPI/Infinity Fabric)
    NODE = 20  # same NUMA node, across host bridges
    PHB = 30  # through one PCIe host bridge
    PXB = 40  # through several PCIe switches, no host bridge
    PIX = 50  # through one PCIe switch
    BOARD = 60  # same board (multi-GPU cards)


@dataclass(frozen=True)
class GpuLink:
    """The connection between one pair of GPUs."""

    pcie: PcieLink
    nvlinks: int = 0  # number of NVLink lanes joining the pair; 0 = none


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a GPU instance with its compute instance) on a card in MIG mode.

    What NVML reports for it: a ``MIG-…`` UUID of its own, the GPU-instance and
    compute-instance ids within the parent card, the profile and the memory slice it starts at,
    and its share of the card's engines. A container reaches it through the parent's device
    node and two capability nodes (``/dev/nvidia-caps/nvidia-cap<N>``) that grant access to the
    GPU instance and the compute instance.
    """

    uuid: str  # "MIG-…"
    parent_uuid: GpuUuid
    parent_index: int
    parent_minor: int
    index: int  # its position among the parent's MIG devices (NVML's MIG device index)
    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # "1g.10gb", "3g.40gb", "1g.10gb+me"
    profile_id: int  # nvidia-smi's GPU-instance profile id (19, 15, 9, …)
    start: int  # first memory slice of its placement
    memory_slices: int
    compute_slices: int
    memory_total_mib: int
    multiprocessors: int
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpeg_engines: int = 0
    ofa_engines: int = 0
    # Minors of /dev/nvidia-caps/nvidia-cap<N> for the GPU instance and the compute instance
    # (None when the driver's capability table could not be read).
    gi_cap_minor: int | None = None
    ci_cap_minor: int | None = None

    @property
    def address(self) -> str:
        """``<card index>:<MIG index>``, as NVIDIA's device plugin indexes MIG devices."""
        return f"{self.parent_index}:{self.index}"

    @property
    def device_nodes(self) -> tuple[str, ...]:
        """The character devices a container needs: the parent card's and the two caps."""
        nodes = [f"/dev/nvidia{self.parent_minor}"]
        for minor in (self.gi_cap_minor, self.ci_cap_minor):
            if minor is not None:
                nodes.append(f"/dev/nvidia-caps/nvidia-cap{minor}")
        return tuple(nodes)


def mig_cap_minors(
    parent_minor: int, gpu_instance_id: int, compute_instance_id: int
) -> tuple[int, int]:
    """The capability-device minors the driver gives a GPU instance and its compute instance.

    The NVIDIA driver numbers them in ``/proc/driver/nvidia-caps/mig-minors``: ``config`` is 1,
    ``monitor`` 2, then per card 15 GPU instances of 9 entries each (the GPU instance's
    ``access``, then its 8 compute instances). The NVML backend reads that file; this formula
    is what the fake backend uses and what the file holds on the drivers we know.
    """
    gi_minor = 3 + parent_minor * 15 * 9 + gpu_instance_id * 9
    return gi_minor, gi_minor + 1 + compute_instance_id


@dataclass(frozen=True)
class GpuDevice:
    """One physical GPU as the node sees it."""

    index: int
    uuid: GpuUuid
    product_name: str
    memory_total_mib: int
    pci_bus_id: str
    minor_number: int
    compute_capability: tuple[int, int] | None = None
    numa_node: int | None = None
    mig_enabled: bool | None = None
    # NVML's names as NVIDIA's go-nvlib spells them ("Nvidia", "Hopper", "Ada Lovelace"); the
    # architecture of a card NVML cannot name comes from its compute capability
    # (:func:`architecture_of`). None when neither is known.
    brand: str | None = None
    architecture: str | None = None
    # The PCIe root complex above the card, as sysfs names it ("pci0000:64"): which cards
    # hang off one root (the standard DRA attribute resource.kubernetes.io/pcieRoot).
    pcie_root: str | None = None
    # The card's MIG devices when it is in MIG mode (in NVML's MIG-index order), else empty.
    mig_devices: tuple[MigDevice, ...] = ()

    @property
    def device_node(self) -> str:
        """The character device the container needs, e.g. ``/dev/nvidia3``."""
        return f"/dev/nvidia{self.minor_number}"


def pci_address(bus_id: str) -> str:
    """NVML's bus id (``00000000:65:00.0``, 8-digit domain, upper case) in the form sysfs names
    the device's folder and the standard DRA attribute pciBusID takes: ``0000:65:00.0``."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{domain[-4:]}:{rest}" if rest else bus_id.lower()


# Compute capability (major, minor) -> NVIDIA's architecture name, for cards whose
# architecture NVML does not report (the fake backend, old drivers). From NVIDIA's CUDA
# programming guide's table of compute capabilities; more specific entries (major, minor) win
# over the major alone.
_ARCHITECTURE_BY_CAPABILITY: dict[tuple[int, int | None], str] = {
    (3, None): "Kepler",
    (5, None): "Maxwell",
    (6, None): "Pascal",
    (7, None): "Volta",
    (7, 5): "Turing",
    (8, None): "Ampere",
    (8, 9): "Ada Lovelace",
    (9, None): "Hopper",
    (10, None): "Blackwell",
    (11, None): "Blackwell",
    (12, None): "Blackwell",
}


def architecture_of(compute_capability: tuple[int, int] | None) -> str | None:
    """``(9, 0)`` -> ``"Hopper"``, ``(8, 9)`` -> ``"Ada Lovelace"``; None when unknown."""
    if compute_capability is None:
        return None
    major, minor = compute_capability
    return _ARCHITECTURE_BY_CAPABILITY.get(
        (major, minor), _ARCHITECTURE_BY_CAPABILITY.get((major, None))
    )


def _pair_key(a: GpuUuid, b: GpuUuid) -> tuple[GpuUuid, GpuUuid]:
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class NodeInventory:
    """Everything about a node's GPUs read in one refresh.

    ``links`` holds one entry per unordered pair of GPUs; use :meth:`link` to look one up.
    """

    gpus: tuple[GpuDevice, ...]
    links: Mapping[tuple[GpuUuid, GpuUuid], GpuLink] = field(default_factory=dict)
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # e.g. "12.4"

    def __post_init__(self) -> None:
        # Normalise pair order once so lookups never depend on which GPU came first.
        normalised = {_pair_key(a, b): link for (a, b), link in self.links.items()}
        object.__setattr__(self, "links", normalised)

    def __iter__(self) -> Iterator[GpuDevice]:
        return iter(self.gpus)

    def __len__(self) -> int:
        return len(self.gpus)

    def by_uuid(self, uuid: GpuUuid) -> GpuDevice:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise KeyError(uuid)

    def by_index(self, index: int) -> GpuDevice:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(index)

    @property
    def mig_devices(self) -> tuple[MigDevice, ...]:
        """Every MIG device of every card, card by card."""
        return tuple(mig for gpu in self.gpus for mig in gpu.mig_devices)

    def link(self, a: GpuUuid, b: GpuUuid) -> GpuLink | None:
        """The link between two distinct GPUs, or ``None`` when topology is unknown."""
        return self.links.get(_pair_key(a, b))
