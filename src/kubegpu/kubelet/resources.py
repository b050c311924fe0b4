"""What the device plugin advertises and hands out, as our own values (no protobuf here).

A :class:`ResourcePlan` is one extended resource (``nvidia.com/gpu``, ``nvidia.com/gpu.shared``,
a per-model name…) served on its own socket: its device ids, which GPU each id maps to, and the
rules for answering ``Allocate``. Plans are built from the config and an inventory snapshot and
are immutable; a config reload or a new inventory builds new plans. The gRPC servicer only
converts these values to and from the wire.
"""

from __future__ import annotations

import collections
import fnmatch
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from kubegpu.config.model import CDI_STRATEGIES, AgentConfig, SharedResource
from kubegpu.core.container import CONTROL_DEVICE_NODES, host_path
from kubegpu.core.gpu import GpuDevice, GpuUuid, NodeInventory
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


@dataclass(frozen=True)
class AdvertisedDevice:
    """One device id the kubelet sees, and the physical GPU behind it."""

    device_id: str
    gpu: GpuDevice
    replica: int | None = None  # time-slicing replica number; None for a whole GPU


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


def replica_id(uuid: GpuUuid, replica: int) -> str:
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
            reason = unhealthy.get(self._by_id[device_id].gpu.uuid)
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
        bad = [i for i in must_include if self._by_id[i].gpu.uuid in unusable]
        if bad:
            raise AllocationRefused(
                "FAILED_PRECONDITION",
                f"must-include id {shown_list(bad)} of resource {self.resource_name} is on an "
                "unhealthy or withdrawn GPU",
            )
        usable = [i for i in available if self._by_id[i].gpu.uuid not in unusable]
        if len(usable) < size:
            raise AllocationRefused(
                "FAILED_PRECONDITION",
                f"only {len(usable)} of the {len(available)} available ids of resource "
                f"{self.resource_name} are on healthy GPUs; {size} asked",
            )
        return usable

    def states(self, unhealthy: Collection[GpuUuid]) -> list[DeviceState]:
        """Every id with its health: all ids of an unhealthy GPU are unhealthy, replicas too."""
        return [
            DeviceState(d.device_id, d.gpu.uuid not in unhealthy, d.gpu.numa_node)
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
        if self.shared:
            replicas = [ReplicaId(d.device_id, d.gpu.uuid, d.replica or 0) for d in self.devices]
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
        """One container's response; replica ids resolve to their GPU, duplicates collapse."""
        if not device_ids:
            raise AllocationError(f"empty device list for resource {self.resource_name}")
        gpus_by_uuid = {self.lookup(i).gpu.uuid: self.lookup(i).gpu for i in device_ids}
        if self.shared and self.fail_requests_greater_than_one and len(device_ids) > 1:
            raise AllocationError(
                "invalid request: maximum request size for shared resources is 1, "
                f"got {len(device_ids)} for {self.resource_name}"
            )
        # Index order, so the answer never depends on the order the kubelet sent the ids in.
        gpus = sorted(gpus_by_uuid.values(), key=lambda g: g.index)
        plugin = config.flags.plugin
        names = [g.uuid if plugin.device_id_strategy == "uuid" else str(g.index) for g in gpus]
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
            paths = [*CONTROL_DEVICE_NODES, *(g.device_node for g in gpus)]
            nodes = tuple(DeviceNode(p, host_path(plugin.dev_root, p)) for p in paths)
        return AllocateAnswer(envs, tuple(mounts), nodes, annotations, cdi)

    @property
    def socket_stem(self) -> str:
        return self.socket_name.removeprefix("kubegpu-").removesuffix(".sock")


def _select(shared: SharedResource, gpus: Sequence[GpuDevice]) -> list[GpuDevice]:
    where = f"sharing.timeSlicing.resources[{shared.name}].devices"
    return select_devices(shared.devices, gpus, where, f"of resource {shared.name}")


def select_devices(
    devices: str | int | Sequence[int | str], gpus: Sequence[GpuDevice], where: str, what: str
) -> list[GpuDevice]:
    """``all``, the first N by index, or the GPUs named by index or UUID (in that order)."""
    if devices == "all":
        return list(gpus)
    if isinstance(devices, int):
        return list(gpus[:devices])
    chosen: list[GpuDevice] = []
    for ref in devices:
        match = [
            g
            for g in gpus
            if (isinstance(ref, int) and g.index == ref)
            or (isinstance(ref, str) and (g.uuid == ref or ref == str(g.index)))
        ]
        if not match:
            raise PlanError(
                f"{where}: {ref!r} is not a GPU{' ' + what if what else ''} on this node"
            )
        chosen.extend(g for g in match if g not in chosen)
    return chosen


def build_plans(config: AgentConfig, inventory: NodeInventory) -> list[ResourcePlan]:
    """One plan per advertised resource name; GPUs go to the first resource whose pattern
    matches their product name, and resources with no GPU are not advertised."""
    by_resource: dict[str, list[GpuDevice]] = {r.name: [] for r in config.resources.gpus}
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        for res in config.resources.gpus:
            if fnmatch.fnmatchcase(gpu.product_name, res.pattern):
                by_resource[res.name].append(gpu)
                break
    slicing = config.sharing.time_slicing
    sharing = {s.name: s for s in slicing.resources}
    plans: list[ResourcePlan] = []
    for name, gpus in by_resource.items():
        shared = sharing.get(name)
        if shared is None:
            whole = gpus
            shared_gpus: list[GpuDevice] = []
        else:
            shared_gpus = _select(shared, gpus)
            whole = [g for g in gpus if g not in shared_gpus]
        if whole:
            devices = tuple(AdvertisedDevice(g.uuid, g) for g in whole)
            plans.append(ResourcePlan(name, devices))
        if shared is not None and shared_gpus:
            shared_name = shared.rename or (f"{name}.shared" if slicing.rename_by_default else name)
            devices = tuple(
                AdvertisedDevice(replica_id(g.uuid, k), g, k)
                for g in shared_gpus
                for k in range(shared.replicas)
            )
            plans.append(
                ResourcePlan(
                    shared_name,
                    devices,
                    shared=True,
                    fail_requests_greater_than_one=slicing.fail_requests_greater_than_one,
                )
            )
    share = config.sharing.gpu_share
    if share.enabled:
        cards = select_devices(
            share.devices,
            sorted(inventory.gpus, key=lambda g: g.index),
            "sharing.gpuShare.devices",
            "",
        )
        if cards:
            devices = tuple(
                AdvertisedDevice(slot_id(g.uuid, k), g, k)
                for g in cards
                for k in range(share.slots_per_card)
            )
            plans.append(
                ResourcePlan(
                    share.resource_name,
                    devices,
                    shared=True,
                    fail_requests_greater_than_one=True,
                    share_slots=True,
                )
            )
    names = [p.resource_name for p in plans]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PlanError(f"resource {dupes[0]} would be advertised twice; check rename settings")
    return plans


def all_gpus(plans: Iterable[ResourcePlan]) -> list[GpuDevice]:
    seen: dict[GpuUuid, GpuDevice] = {}
    for p in plans:
        for g in p.gpus:
            seen.setdefault(g.uuid, g)
    return sorted(seen.values(), key=lambda g: g.index)
