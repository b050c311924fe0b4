"""What the device plugin advertises and hands out, as our own values (no protobuf here).

A :class:`ResourcePlan` is one extended resource (``nvidia.com/gpu``, ``nvidia.com/gpu.shared``,
a per-model name, a MIG profile's ``nvidia.com/mig-1g.10gb``…) served on its own socket: its
device ids, which GPU (or MIG device, :mod:`~kubegpu.kubelet.mig`) each id maps to, and the rules
for answering ``Allocate``. Plans are built from the config and an inventory snapshot and
are immutable; a config reload or a new inventory builds new plans. The gRPC servicer only
converts these values to and from the wire.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from kubegpu.config.model import CDI_STRATEGIES, AgentConfig
from kubegpu.core.container import CONTROL_DEVICE_NODES, host_path
from kubegpu.core.gpu import GpuDevice, GpuUuid, MigDevice, NodeInventory
from kubegpu.placement.topology import (
    ReplicaId,
    ReplicaPolicy,
    best_gpu_set,
    pick_replicas,
)

REPLICA_SEPARATOR = "::"
# Share-slot ids are ``<uuid>::slot-<n>``: the card is recoverable from the id alone (and tools
# that strip everything from ``::``, as dcgm-exporter does for replicas, get the card's UUID).
SLOT_MARK = "slot-"
# The nvidia-container-toolkit's convention for the volume-mounts strategy.
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"


# Longest device id a message or log line shows in full: ids come from the caller, and a status
# message travels in gRPC trailers, which clients cap (8 KiB by default) and then fail on.
SHOWN_ID_CHARS = 80
SHOWN_IDS = 3  # ids named in one message; the rest are counted


def shown(device_id: str) -> str:
    """A caller's device id as messages show it: quoted, and cut to ``SHOWN_ID_CHARS``."""
    if len(device_id) <= SHOWN_ID_CHARS:
        return repr(device_id)
    return f"{device_id[:SHOWN_ID_CHARS]!r}… ({len(device_id)} characters)"


def shown_list(device_ids: Sequence[str]) -> str:
    """A few ids, then how many more: a message stays short however many ids were sent."""
    head = ", ".join(shown(i) for i in device_ids[:SHOWN_IDS])
    rest = len(device_ids) - SHOWN_IDS
    return f"{head} and {rest} more" if rest > 0 else head


class AllocationError(ValueError):
    """The kubelet asked for something we cannot give (mapped to INVALID_ARGUMENT)."""


class AllocationRefused(Exception):
    """A well-formed request we must not serve (no decision for the card, a whole/shared
    collision, the API unreachable); ``code`` is the gRPC status name to answer with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class PlanError(ValueError):
    """The config cannot be applied to this node's GPUs (e.g. ``devices`` names no GPU)."""


class MigLayoutError(PlanError):
    """The node's MIG layout does not fit ``flags.migStrategy`` (``single`` on a node that is
    not uniform): NVIDIA's plugin exits on it, and so does the agent (exit 1)."""


@dataclass(frozen=True)
class AdvertisedDevice:
    """One device id the kubelet sees, and the physical GPU behind it."""

    device_id: str
    gpu: GpuDevice
    replica: int | None = None  # time-slicing replica number; None for a whole GPU
    mig: MigDevice | None = None  # the MIG device the id hands out (on card ``gpu``)

    @property
    def unit(self) -> str:
        """What the id hands out: the MIG device's UUID, else the card's (replicas share it)."""
        return self.mig.uuid if self.mig is not None else self.gpu.uuid

    @property
    def health_keys(self) -> tuple[GpuUuid, ...]:
        """The verdicts of the health record this id follows: its card's and, for a MIG
        device, its own. A whole card in MIG mode (``migStrategy: none``) follows every MIG
        device on it, as NVIDIA's plugin marks the card on an Xid of any of its instances."""
        if self.mig is not None:
            return (self.gpu.uuid, GpuUuid(self.mig.uuid))
        return (self.gpu.uuid, *(GpuUuid(m.uuid) for m in self.gpu.mig_devices))

    def name(self, id_strategy: str) -> str:
        """What a container is told: UUID (``GPU-…``, ``MIG-…``) or index (``3``, ``3:1``)."""
        if self.mig is not None:
            return self.mig.uuid if id_strategy == "uuid" else self.mig.address
        return self.gpu.uuid if id_strategy == "uuid" else str(self.gpu.index)

    @property
    def device_nodes(self) -> tuple[str, ...]:
        """The character devices a container needs (a MIG device's: its card's and two caps)."""
        return self.mig.device_nodes if self.mig is not None else (self.gpu.device_node,)

    @property
    def order(self) -> tuple[int, int]:
        return (self.gpu.index, -1 if self.mig is None else self.mig.index)


def _first_reason(keys: Sequence[GpuUuid], verdicts: Mapping[GpuUuid, str]) -> str | None:
    return next((verdicts[k] for k in keys if k in verdicts), None)


def _any_in(keys: Sequence[GpuUuid], uuids: Collection[GpuUuid]) -> bool:
    return any(k in uuids for k in keys)


@dataclass(frozen=True)
class DeviceState:
    device_id: str
    healthy: bool
    numa_node: int | None


@dataclass(frozen=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class BindMount:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True)
class AllocateAnswer:
    """What Allocate answers for one container and one resource: its environment, mounts,
    device nodes, annotations and CDI devices (the kubelet caches it per container). Not the
    extender's per-container decision, which is
    :class:`kubegpu.sharing.annotations.ContainerAllocation`."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[BindMount, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


def socket_name_for(resource_name: str) -> str:
    """``nvidia.com/gpu`` → ``kubegpu-nvidia.com_gpu.sock`` (unique per resource)."""
    return f"kubegpu-{resource_name.replace('/', '_')}.sock"


def replica_id(uuid: str, replica: int) -> str:
    return f"{uuid}{REPLICA_SEPARATOR}{replica}"


def slot_id(uuid: GpuUuid, slot: int) -> str:
    return f"{uuid}{REPLICA_SEPARATOR}{SLOT_MARK}{slot}"


def card_of(device_id: str) -> GpuUuid:
    """The GPU UUID inside a whole, replica or slot id."""
    return GpuUuid(device_id.split(REPLICA_SEPARATOR, 1)[0])


@dataclass(frozen=True)
class ResourcePlan:
    resource_name: str
    devices: tuple[AdvertisedDevice, ...]
    shared: bool = False
    fail_requests_greater_than_one: bool = False
    # True for the card-level share-slot resource (sharing.gpuShare): Allocate needs the
    # extender's decision, so the agent's sharing coordinator answers for it.
    share_slots: bool = False

    @property
    def socket_name(self) -> str:
        return socket_name_for(self.resource_name)

    @property
    def gpus(self) -> tuple[GpuDevice, ...]:
        return tuple({d.gpu.uuid: d.gpu for d in self.devices}.values())

    @cached_property
    def mig(self) -> bool:
        """Its ids are MIG devices (``migStrategy`` ``single`` or ``mixed``)."""
        return any(d.mig is not None for d in self.devices)

    @cached_property
    def _by_id(self) -> dict[str, AdvertisedDevice]:
        return {d.device_id: d for d in self.devices}

    def lookup(self, device_id: str) -> AdvertisedDevice:
        try:
            return self._by_id[device_id]
        except KeyError:
            raise AllocationError(
                f"unknown device id {shown(device_id)} for resource {self.resource_name}"
            ) from None

    def check_ids(self, device_ids: Sequence[str], what: str = "device id") -> None:
        """Every id advertised and none listed twice; raises AllocationError naming a few.
        (Two replicas or slots of one card are two ids: only the very same id repeats.)"""
        unknown = [i for i in device_ids if i not in self._by_id]
        if unknown:
            raise AllocationError(
                f"unknown {what}{'s' if len(unknown) > 1 else ''} {shown_list(unknown)} "
                f"for resource {self.resource_name}"
            )
        twice = [i for i, n in collections.Counter(device_ids).items() if n > 1]
        if twice:
            raise AllocationError(
                f"{what} {shown_list(twice)} is listed twice for resource {self.resource_name}"
            )

    def check_allocate(self, device_ids: Sequence[str], unhealthy: Mapping[GpuUuid, str]) -> None:
        """What Allocate must refuse before anything else looks at the ids: none, unknown or
        repeated ids (AllocationError), and a device on an unhealthy GPU (AllocationRefused,
        FAILED_PRECONDITION): the kubelet only allocates healthy ones, so such a request is
        from before the health change reached it, and the container would get a broken card."""
        if not device_ids:
            raise AllocationError(f"empty device list for resource {self.resource_name}")
        self.check_ids(device_ids)
        for device_id in device_ids:
            reason = _first_reason(self._by_id[device_id].health_keys, unhealthy)
            if reason is not None:
                raise AllocationRefused(
                    "FAILED_PRECONDITION",
                    f"device {shown(device_id)} of resource {self.resource_name} is unhealthy "
                    f"({reason})",
                )

    def check_preferred(
        self,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        unusable: Collection[GpuUuid],
    ) -> list[str]:
        """Validate a GetPreferredAllocation container request against the kubelet's contract
        (known ids, none twice, must-include among the available, 1 <= size <= available) and
        return the available ids that may be offered: those on unusable cards (unhealthy, or
        withdrawn because in use the other way) never are. AllocationError for a malformed
        request; AllocationRefused (FAILED_PRECONDITION) when unusable cards make it unmet."""
        self.check_ids(available, "available id")
        self.check_ids(must_include, "must-include id")
        missing = [i for i in must_include if i not in set(available)]
        if missing:
            raise AllocationError(
                f"must-include id {shown_list(missing)} is not among the available ids "
                f"for resource {self.resource_name}"
            )
        if not len(must_include) <= size <= len(available) or size < 1:
            raise AllocationError(
                f"allocation size {size} is not between {max(1, len(must_include))} and the "
                f"{len(available)} available ids for resource {self.resource_name}"
            )
        bad = [i for i in must_include if _any_in(self._by_id[i].health_keys, unusable)]
        if bad:
            raise AllocationRefused(
                "FAILED_PRECONDITION",
                f"must-include id {shown_list(bad)} of resource {self.resource_name} is on an "
                "unhealthy or withdrawn GPU",
            )
        usable = [i for i in available if not _any_in(self._by_id[i].health_keys, unusable)]
        if len(usable) < size:
            raise AllocationRefused(
                "FAILED_PRECONDITION",
                f"only {len(usable)} of the {len(available)} available ids of resource "
                f"{self.resource_name} are on healthy GPUs; {size} asked",
            )
        return usable

    def states(self, unhealthy: Collection[GpuUuid]) -> list[DeviceState]:
        """Every id with its health: all ids of an unhealthy GPU are unhealthy, replicas and
        MIG devices too; a MIG device's own verdict reaches its ids only."""
        return [
            DeviceState(d.device_id, not _any_in(d.health_keys, unhealthy), d.gpu.numa_node)
            for d in self.devices
        ]

    def preferred(
        self,
        inventory: NodeInventory,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        policy: ReplicaPolicy,
    ) -> tuple[str, ...]:
        """The ids we would like the kubelet to pick (topology-aware for whole GPUs)."""
        for device_id in [*available, *must_include]:
            self.lookup(device_id)
        if self.shared or self.mig:
            # MIG devices have no topology worth choosing by; like replicas, they are spread
            # over (or packed into) their cards, and a MIG device's replicas over it.
            replicas = [
                ReplicaId(d.device_id, GpuUuid(d.unit), d.replica)
                if d.replica is not None
                else ReplicaId(d.device_id, d.gpu.uuid, d.mig.index if d.mig else 0)
                for d in self.devices
            ]
            return pick_replicas(replicas, available, must_include, size, policy)
        uuid_to_id = {d.gpu.uuid: d.device_id for d in self.devices}
        choice = best_gpu_set(
            inventory,
            [self.lookup(i).gpu.uuid for i in available],
            [self.lookup(i).gpu.uuid for i in must_include],
            size,
        )
        return tuple(uuid_to_id[u] for u in choice.uuids)

    def allocate(self, config: AgentConfig, device_ids: Sequence[str]) -> AllocateAnswer:
        """One container's response; replica ids resolve to their GPU (or MIG device),
        duplicates collapse."""
        if not device_ids:
            raise AllocationError(f"empty device list for resource {self.resource_name}")
        units = {self.lookup(i).unit: self.lookup(i) for i in device_ids}
        if self.shared and self.fail_requests_greater_than_one and len(device_ids) > 1:
            raise AllocationError(
                "invalid request: maximum request size for shared resources is 1, "
                f"got {len(device_ids)} for {self.resource_name}"
            )
        # Index order, so the answer never depends on the order the kubelet sent the ids in.
        devices = sorted(units.values(), key=lambda d: d.order)
        plugin = config.flags.plugin
        names = [d.name(plugin.device_id_strategy) for d in devices]
        strategies = set(plugin.device_list_strategy)
        envs: dict[str, str] = {}
        mounts: list[BindMount] = []
        annotations: dict[str, str] = {}
        cdi: tuple[str, ...] = ()
        if "envvar" in strategies:
            envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(names)
        if "volume-mounts" in strategies:
            envs["NVIDIA_VISIBLE_DEVICES"] = VOLUME_MOUNTS_ROOT
            mounts = [BindMount(f"{VOLUME_MOUNTS_ROOT}/{n}", "/dev/null") for n in names]
        if strategies & CDI_STRATEGIES:
            cdi_names = tuple(f"{plugin.cdi_kind}={n}" for n in names)
            if "cdi-cri" in strategies:
                cdi = cdi_names
            if "cdi-annotations" in strategies:
                key = f"{plugin.cdi_annotation_prefix}kubegpu-device-plugin_{self.socket_stem}"
                annotations[key] = ",".join(cdi_names)
        nodes: tuple[DeviceNode, ...] = ()
        if plugin.pass_device_specs:
            # Two MIG devices of one card share its node: each path once.
            paths = dict.fromkeys(
                [*CONTROL_DEVICE_NODES, *(p for d in devices for p in d.device_nodes)]
            )
            nodes = tuple(DeviceNode(p, host_path(plugin.dev_root, p)) for p in paths)
        return AllocateAnswer(envs, tuple(mounts), nodes, annotations, cdi)

    @property
    def socket_stem(self) -> str:
        return self.socket_name.removeprefix("kubegpu-").removesuffix(".sock")
