"""The annotation protocol between node agent, scheduler extender and inspection tools.

Versioned JSON documents, keyed by GPU UUID (indices are kept for people and for
``NVIDIA_VISIBLE_DEVICES`` fallbacks, never trusted alone):

* ``kubegpu.io/gpu-inventory`` on the Node, written by the node agent: every card's UUID, index,
  model, memory and health. The agent rewrites the whole document on start and on every health
  change, so it never depends on what an earlier agent wrote.
* ``kubegpu.io/gpu-allocation`` on the Pod, written by the extender at bind time: node, cards
  with the compute and memory the pod holds on each, the per-container split, decision time and
  policy. It is the durable record the extender rebuilds its accounting from after a restart.
* ``kubegpu.io/mig-devices`` on the Node, written by the node agent beside the inventory: the
  cards it serves by their MIG devices (``flags.migStrategy`` ``single`` or ``mixed``), which
  the inventory leaves out, each with its MIG devices (UUID, profile, placement, memory,
  GPU-instance id, the resource it is advertised under, health). Absent when there are none.
  Read by inspection tools only: kube-scheduler places MIG devices, not the extender.

Parsing is strict: anything unexpected raises :class:`AnnotationError`, which names the
annotation and the offending field, and callers treat the object as having no annotation.
Pure: strings in, frozen values out.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

INVENTORY_ANNOTATION = "kubegpu.io/gpu-inventory"
ALLOCATION_ANNOTATION = "kubegpu.io/gpu-allocation"
MIG_DEVICES_ANNOTATION = "kubegpu.io/mig-devices"
PROTOCOL_VERSION = 1
# Annotations are limited to 256 KiB in total per object; ours stay far below that.
MAX_ANNOTATION_BYTES = 64 * 1024


class AnnotationError(ValueError):
    """A malformed annotation; ``annotation`` is its key, ``problem`` what is wrong."""

    def __init__(self, annotation: str, problem: str) -> None:
        super().__init__(f"annotation {annotation}: {problem}")
        self.annotation = annotation
        self.problem = problem


# --------------------------------------------------------------------------- node inventory
@dataclass(frozen=True)
class GpuRecord:
    """One card as published on its Node."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    healthy: bool = True


@dataclass(frozen=True)
class NodeGpuInventory:
    """The node agent's published view of its cards (sorted by index)."""

    gpus: tuple[GpuRecord, ...]

    def by_uuid(self) -> dict[str, GpuRecord]:
        return {g.uuid: g for g in self.gpus}


def encode_inventory(inventory: NodeGpuInventory) -> str:
    """Canonical JSON (sorted cards, sorted keys, no spaces): equal inventories give equal
    strings, so a publisher can tell that nothing changed without parsing."""
    gpus = sorted(inventory.gpus, key=lambda g: g.index)
    doc = {"v": PROTOCOL_VERSION, "gpus": [_card_fields(g) for g in gpus]}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _card_fields(card: GpuRecord | MigCardRecord) -> dict[str, Any]:
    """A card's fields as both node annotations write them."""
    return {
        "uuid": card.uuid,
        "index": card.index,
        "model": card.model,
        "memoryMiB": card.memory_mib,
        "healthy": card.healthy,
    }


def decode_inventory(text: object) -> NodeGpuInventory:
    key = INVENTORY_ANNOTATION
    doc = _load(key, text)
    gpus_raw = _field(key, doc, "gpus", list)
    gpus: list[GpuRecord] = []
    for i, raw in enumerate(gpus_raw):
        where = f"gpus[{i}]"
        item = _object(key, raw, where)
        gpus.append(
            GpuRecord(
                uuid=_uuid(key, item, where),
                index=_int(key, item, "index", where),
                model=_string(key, item, "model", where, allow_empty=True),
                memory_mib=_int(key, item, "memoryMiB", where),
                healthy=_field(key, item, "healthy", bool, where),
            )
        )
    _unique(key, [g.uuid for g in gpus], "uuid")
    _unique(key, [g.index for g in gpus], "index")
    return NodeGpuInventory(tuple(sorted(gpus, key=lambda g: g.index)))


# --------------------------------------------------------------------------- node MIG devices
@dataclass(frozen=True)
class MigDeviceRecord:
    """One MIG device as published on its Node (under its parent card)."""

    uuid: str  # "MIG-…"
    profile: str  # "3g.40gb"
    start: int  # placement: the first memory slice
    slices: int  # placement: how many memory slices
    memory_mib: int
    gpu_instance_id: int
    resource: str = ""  # the extended resource it is advertised under; "" when none
    healthy: bool = True  # neither it nor its card is marked unhealthy


@dataclass(frozen=True)
class MigCardRecord:
    """A card served by its MIG devices (sorted by placement)."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    healthy: bool
    devices: tuple[MigDeviceRecord, ...]


@dataclass(frozen=True)
class NodeMigDevices:
    """The node agent's published MIG devices, card by card (sorted by index)."""

    gpus: tuple[MigCardRecord, ...]

    @property
    def resources(self) -> frozenset[str]:
        """The resources the node's MIG devices are advertised under."""
        return frozenset(d.resource for g in self.gpus for d in g.devices if d.resource)


def _placement_order(d: MigDeviceRecord) -> tuple[int, int]:
    return d.start, d.gpu_instance_id


def encode_mig_devices(devices: NodeMigDevices) -> str:
    """Canonical JSON, as :func:`encode_inventory`: cards by index, their devices by
    placement, sorted keys, no spaces."""
    doc = {
        "v": PROTOCOL_VERSION,
        "gpus": [
            {
                **_card_fields(g),
                "migDevices": [
                    {
                        "uuid": d.uuid,
                        "profile": d.profile,
                        "start": d.start,
                        "slices": d.slices,
                        "memoryMiB": d.memory_mib,
                        "gpuInstanceId": d.gpu_instance_id,
                        "resource": d.resource,
                        "healthy": d.healthy,
                    }
                    for d in sorted(g.devices, key=_placement_order)
                ],
            }
            for g in sorted(devices.gpus, key=lambda g: g.index)
        ],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def decode_mig_devices(text: object) -> NodeMigDevices:
    key = MIG_DEVICES_ANNOTATION
    doc = _load(key, text)
    cards: list[MigCardRecord] = []
    for i, raw in enumerate(_field(key, doc, "gpus", list)):
        where = f"gpus[{i}]"
        item = _object(key, raw, where)
        devices: list[MigDeviceRecord] = []
        for j, raw_device in enumerate(_field(key, item, "migDevices", list, where)):
            here = f"{where}.migDevices[{j}]"
            devices.append(_mig_device(key, _object(key, raw_device, here), here))
        ids = [d.gpu_instance_id for d in devices]
        for gi in ids:
            if ids.count(gi) > 1:
                raise AnnotationError(key, f"{where}: duplicate gpuInstanceId {gi}")
        ordered = sorted(devices, key=_placement_order)
        for before, after in itertools.pairwise(ordered):
            if after.start < before.start + before.slices:
                raise AnnotationError(
                    key,
                    f"{where}: MIG devices {before.uuid} and {after.uuid} share memory slice "
                    f"{after.start}",
                )
        cards.append(
            MigCardRecord(
                uuid=_uuid(key, item, where),
                index=_int(key, item, "index", where),
                model=_string(key, item, "model", where, allow_empty=True),
                memory_mib=_int(key, item, "memoryMiB", where),
                healthy=_field(key, item, "healthy", bool, where),
                devices=tuple(ordered),
            )
        )
    _unique(key, [g.uuid for g in cards], "uuid")
    _unique(key, [g.index for g in cards], "index")
    _unique(key, [d.uuid for g in cards for d in g.devices], "MIG device uuid")
    return NodeMigDevices(tuple(sorted(cards, key=lambda g: g.index)))


def _mig_device(key: str, item: Mapping[str, Any], where: str) -> MigDeviceRecord:
    slices = _int(key, item, "slices", where)
    if slices < 1:
        raise AnnotationError(key, f"{where}.slices must be at least 1, got {slices}")
    return MigDeviceRecord(
        uuid=_uuid(key, item, where),
        profile=_string(key, item, "profile", where),
        start=_int(key, item, "start", where),
        slices=slices,
        memory_mib=_int(key, item, "memoryMiB", where),
        gpu_instance_id=_int(key, item, "gpuInstanceId", where),
        resource=_string(key, item, "resource", where, allow_empty=True),
        healthy=_field(key, item, "healthy", bool, where),
    )


# --------------------------------------------------------------------------- pod allocation
@dataclass(frozen=True)
class CardShare:
    """What a pod (or one container) holds on one card. Whole cards hold 1000 milli and the
    card's whole memory."""

    uuid: str
    index: int
    compute_milli: int
    gpu_memory_mib: int


@dataclass(frozen=True)
class ContainerAllocation:
    name: str
    init: bool
    cards: tuple[CardShare, ...]


@dataclass(frozen=True)
class AllocationDecision:
    """The extender's decision for one pod, as recorded on it before binding."""

    node: str
    cards: tuple[CardShare, ...]  # pod totals per card: what accounting charges
    containers: tuple[ContainerAllocation, ...]
    decided_at: str  # RFC 3339, UTC
    policy: str
    shared: bool  # True: a share of one card; False: whole cards

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(c.index for c in self.cards)

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return tuple(c.uuid for c in self.cards)


def _card_doc(c: CardShare) -> dict[str, Any]:
    return {
        "uuid": c.uuid,
        "index": c.index,
        "computeMilli": c.compute_milli,
        "memoryMiB": c.gpu_memory_mib,
    }


def encode_allocation(decision: AllocationDecision) -> str:
    doc = {
        "v": PROTOCOL_VERSION,
        "node": decision.node,
        "mode": "shared" if decision.shared else "whole",
        "gpus": [_card_doc(c) for c in decision.cards],
        "containers": [
            {"name": c.name, "init": c.init, "gpus": [_card_doc(g) for g in c.cards]}
            for c in decision.containers
        ],
        "decidedAt": decision.decided_at,
        "policy": decision.policy,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def decode_allocation(text: object) -> AllocationDecision:
    key = ALLOCATION_ANNOTATION
    doc = _load(key, text)
    node = _string(key, doc, "node", "")
    mode = _string(key, doc, "mode", "")
    if mode not in ("shared", "whole"):
        raise AnnotationError(key, f"mode must be 'shared' or 'whole', got {mode!r}")
    cards = _cards(key, _field(key, doc, "gpus", list), "gpus")
    if not cards:
        raise AnnotationError(key, "gpus is empty")
    _unique(key, [c.uuid for c in cards], "uuid")
    containers: list[ContainerAllocation] = []
    for i, raw in enumerate(_field(key, doc, "containers", list)):
        where = f"containers[{i}]"
        item = _object(key, raw, where)
        container_cards = _cards(key, _field(key, item, "gpus", list, where), f"{where}.gpus")
        known = {c.uuid for c in cards}
        for card in container_cards:
            if card.uuid not in known:
                raise AnnotationError(key, f"{where}: card {card.uuid} is not in gpus")
        containers.append(
            ContainerAllocation(
                _string(key, item, "name", where),
                _field(key, item, "init", bool, where),
                container_cards,
            )
        )
    if mode == "shared":
        _shared_cards(key, cards, containers)
    return AllocationDecision(
        node=node,
        cards=cards,
        containers=tuple(containers),
        decided_at=_string(key, doc, "decidedAt", ""),
        policy=_string(key, doc, "policy", ""),
        shared=mode == "shared",
    )


def _shared_cards(
    key: str, cards: Sequence[CardShare], containers: Sequence[ContainerAllocation]
) -> None:
    """The extender gives a shared pod one card. The node agent may record a pod whose
    containers the kubelet admitted onto shares of different cards (docs/sharing.md, section
    7): then each container still holds exactly one card and ``gpus`` lists just those."""
    if len(cards) == 1:
        return
    used = {c.cards[0].uuid for c in containers if len(c.cards) == 1}
    if any(len(c.cards) != 1 for c in containers) or {c.uuid for c in cards} != used:
        raise AnnotationError(
            key,
            f"a shared allocation names exactly one card unless its containers each hold exactly "
            f"one card and gpus lists only theirs; got {len(cards)} cards for "
            f"{len(containers)} containers",
        )


def _cards(key: str, raw: Sequence[Any], where: str) -> tuple[CardShare, ...]:
    out: list[CardShare] = []
    for i, item_raw in enumerate(raw):
        here = f"{where}[{i}]"
        item = _object(key, item_raw, here)
        compute = _int(key, item, "computeMilli", here)
        if not 0 <= compute <= 1000:
            raise AnnotationError(key, f"{here}.computeMilli must be in 0..1000, got {compute}")
        out.append(
            CardShare(
                _uuid(key, item, here),
                _int(key, item, "index", here),
                compute,
                _int(key, item, "memoryMiB", here),
            )
        )
    return tuple(out)


# --------------------------------------------------------------------------- strict helpers
def _load(key: str, text: object) -> Mapping[str, Any]:
    if not isinstance(text, str):
        raise AnnotationError(key, f"value must be a string, got {type(text).__name__}")
    if len(text.encode()) > MAX_ANNOTATION_BYTES:
        raise AnnotationError(key, f"longer than {MAX_ANNOTATION_BYTES} bytes")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise AnnotationError(key, f"not JSON ({exc})") from None
    doc = _object(key, doc, "document")
    version = doc.get("v")
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        raise AnnotationError(key, f"unsupported version {version!r} (this build reads v1)")
    return doc


def _object(key: str, raw: object, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise AnnotationError(key, f"{where} must be an object, got {type(raw).__name__}")
    return raw


def _field(key: str, doc: Mapping[str, Any], name: str, kind: type, where: str = "") -> Any:
    label = f"{where}.{name}" if where else name
    if name not in doc:
        raise AnnotationError(key, f"{label} is missing")
    value = doc[name]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise AnnotationError(key, f"{label} must be {kind.__name__}, got {value!r:.60}")
    return value


def _int(key: str, doc: Mapping[str, Any], name: str, where: str) -> int:
    value: int = _field(key, doc, name, int, where)
    if value < 0 or value > 2**40:
        raise AnnotationError(key, f"{where}.{name} out of range: {value}")
    return value


def _string(
    key: str, doc: Mapping[str, Any], name: str, where: str, *, allow_empty: bool = False
) -> str:
    value: str = _field(key, doc, name, str, where)
    if not value and not allow_empty:
        raise AnnotationError(key, f"{(where + '.') if where else ''}{name} is empty")
    if len(value) > 253:
        raise AnnotationError(key, f"{(where + '.') if where else ''}{name} is too long")
    return value


def _uuid(key: str, doc: Mapping[str, Any], where: str) -> str:
    value = _string(key, doc, "uuid", where)
    if any(ch.isspace() or ch == "," for ch in value):
        raise AnnotationError(key, f"{where}.uuid {value!r:.60} contains a space or comma")
    return value


def _unique(key: str, values: Sequence[object], what: str) -> None:
    seen: set[object] = set()
    for value in values:
        if value in seen:
            raise AnnotationError(key, f"duplicate {what} {value!r}")
        seen.add(value)
