"""The device plugin's plans, built from the config and an inventory snapshot: which resource
each card (or MIG device) is advertised under, its time-slicing replicas, and the share slots.

Cards go to the first ``resources.gpus`` entry whose pattern matches their product name; a card
in MIG mode under ``flags.migStrategy`` ``single`` or ``mixed`` is advertised by its MIG devices
instead (:mod:`~kubegpu.kubelet.mig` says under which name). Time-slicing replicates whatever a
resource holds, cards or MIG devices; share slots are only ever on cards outside MIG mode.
Resources with nothing to hand out are not advertised.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence

from kubegpu.config.model import AgentConfig, SharedResource
from kubegpu.core.gpu import GpuDevice, GpuUuid, MigDevice, NodeInventory
from kubegpu.kubelet.mig import (
    cards_outside_mig,
    in_mig_mode,
    mixed_resource_name,
    single_layout_problem,
)
from kubegpu.kubelet.resources import (
    AdvertisedDevice,
    MigLayoutError,
    PlanError,
    ResourcePlan,
    replica_id,
    slot_id,
)


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


def _sliced(shared: SharedResource, members: Sequence[AdvertisedDevice]) -> list[AdvertisedDevice]:
    """The members of a time-sliced resource its ``devices`` selects, in the order it names
    them; MIG devices are sliced all or none."""
    where = f"sharing.timeSlicing.resources[{shared.name}].devices"
    if shared.devices == "all":
        return list(members)
    if any(m.mig is not None for m in members):
        raise PlanError(f"{where}: the MIG devices of a resource are time-sliced all or none")
    by_card = {m.gpu.uuid: m for m in members}
    chosen = select_devices(
        shared.devices, [m.gpu for m in members], where, f"of resource {shared.name}"
    )
    return [by_card[g.uuid] for g in chosen]


def _members(config: AgentConfig, inventory: NodeInventory) -> dict[str, list[AdvertisedDevice]]:
    """Resource name -> what it advertises before time-slicing: cards, and MIG devices."""
    strategy = config.flags.mig_strategy
    cards = sorted(inventory.gpus, key=lambda g: g.index)
    if strategy == "single":
        problem = single_layout_problem(cards)
        if problem:
            raise MigLayoutError(problem)
    configured = {r.name for r in config.resources.gpus}
    members: dict[str, list[AdvertisedDevice]] = {name: [] for name in configured}
    for gpu in cards:
        resource = next(
            (
                r.name
                for r in config.resources.gpus
                if fnmatch.fnmatchcase(gpu.product_name, r.pattern)
            ),
            None,
        )
        if not in_mig_mode(strategy, gpu):
            if resource is not None:
                members[resource].append(AdvertisedDevice(gpu.uuid, gpu))
            continue
        for mig in gpu.mig_devices:
            # single: in the card's own resource; mixed: the profile's.
            name = resource if strategy == "single" else mixed_resource_name(mig)
            if strategy == "mixed" and name is None:
                # NVIDIA's plugin stops on it too: it has no resource for such a profile.
                raise MigLayoutError(
                    f"MIG profile '{mig.profile}' does not match any resource patterns"
                )
            if name is None:
                continue
            if strategy == "mixed" and name in configured:
                raise PlanError(
                    f"resources.gpus: {name!r} is the resource of MIG profile {mig.profile} "
                    "under flags.migStrategy: mixed"
                )
            members.setdefault(name, []).append(AdvertisedDevice(mig.uuid, gpu, mig=mig))
    return members


def build_plans(config: AgentConfig, inventory: NodeInventory) -> list[ResourcePlan]:
    """One plan per advertised resource name; raises :class:`PlanError` for a config this node
    cannot serve (:class:`MigLayoutError` for a MIG layout its strategy refuses)."""
    slicing = config.sharing.time_slicing
    sharing = {s.name: s for s in slicing.resources}
    plans: list[ResourcePlan] = []
    for name, members in _members(config, inventory).items():
        shared = sharing.get(name)
        sliced = [] if shared is None else _sliced(shared, members)
        whole = [m for m in members if m not in sliced]
        if whole:
            plans.append(ResourcePlan(name, tuple(whole)))
        if shared is not None and sliced:
            shared_name = shared.rename or (f"{name}.shared" if slicing.rename_by_default else name)
            devices = tuple(
                AdvertisedDevice(replica_id(m.unit, k), m.gpu, k, m.mig)
                for m in sliced
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
        cards = _share_cards(config, inventory)
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


def _share_cards(config: AgentConfig, inventory: NodeInventory) -> list[GpuDevice]:
    """The cards ``sharing.gpuShare.devices`` selects, none of them in MIG mode."""
    strategy = config.flags.mig_strategy
    devices = config.sharing.gpu_share.devices
    if isinstance(devices, list):
        for ref in devices:
            named = [g for g in inventory.gpus if ref in (g.index, g.uuid, str(g.index))]
            if any(in_mig_mode(strategy, g) for g in named):
                raise PlanError(
                    f"sharing.gpuShare.devices: GPU {ref!r} is in MIG mode; under "
                    f"flags.migStrategy: {strategy} its MIG devices are advertised instead"
                )
    return select_devices(
        devices, cards_outside_mig(strategy, inventory.gpus), "sharing.gpuShare.devices", ""
    )


def all_migs(plans: Iterable[ResourcePlan]) -> list[MigDevice]:
    """The MIG devices the plans hand out, card by card."""
    seen: dict[str, MigDevice] = {}
    for p in plans:
        for d in p.devices:
            if d.mig is not None:
                seen.setdefault(d.mig.uuid, d.mig)
    return sorted(seen.values(), key=lambda m: (m.parent_index, m.index))


def all_gpus(plans: Iterable[ResourcePlan]) -> list[GpuDevice]:
    """The cards the plans hand out whole or replicated (not those behind MIG devices)."""
    seen: dict[GpuUuid, GpuDevice] = {}
    for p in plans:
        for d in p.devices:
            if d.mig is None:
                seen.setdefault(d.gpu.uuid, d.gpu)
    return sorted(seen.values(), key=lambda g: g.index)
