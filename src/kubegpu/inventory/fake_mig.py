"""MIG mode and GPU instances of a fake node's cards, changeable while the node runs.

A real card keeps its MIG mode and GPU instances when the processes using NVML restart (only a
reboot or an admin's ``nvidia-smi mig`` changes them), so the fake does the same when given a
state file: every change is written there atomically and read back at start, taking precedence
over the spec's ``mig_instances``. Without a state file changes live as long as the process.

Rules follow NVML's: instances exist only on a card in MIG mode; MIG mode cannot be turned off
while instances exist; a placement that overlaps another instance, or a profile over its
per-card maximum, is refused ("insufficient resources", NVML's answer). GPU-instance ids are the
lowest free id from 1; real NVML numbers them its own way, so nothing may infer a placement from
an id. Each instance carries one compute instance (id 0) spanning it, as NVIDIA's tools create.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubegpu.atomic_file import write_atomically
from kubegpu.core.backend import InventoryError
from kubegpu.core.gpu import GpuDevice, GpuUuid, MigDevice, NodeInventory
from kubegpu.core.mig import (
    Instance,
    MigError,
    fake_mig_uuid,
    free_placements,
    layout_problem,
    mig_device,
    profile,
    profiles_of,
)

log = logging.getLogger(__name__)

_STATE_VERSION = 1


@dataclass
class _Placed:
    instance: Instance
    gpu_instance_id: int
    uuid: str


@dataclass
class _Card:
    gpu: GpuDevice  # as the spec describes it (its mig fields are recomputed)
    enabled: bool | None
    placed: list[_Placed] = field(default_factory=list)
    generation: int = 0  # how many instances were ever created here, for fresh UUIDs


class FakeMig:
    """The MIG side of a fake node: mode per card, instances, and the inventory they make."""

    def __init__(self, inventory: NodeInventory, state_file: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._state_file = state_file
        self._inventory = inventory
        self._cards = {gpu.uuid: self._card_from_spec(gpu) for gpu in inventory}
        if state_file is not None and state_file.exists():
            self._load(state_file)
        self._current = self._build()

    # -- reading --------------------------------------------------------------------------

    def inventory(self) -> NodeInventory:
        with self._lock:
            return self._current

    # -- changing -------------------------------------------------------------------------

    def set_mode(self, gpu: GpuDevice, enabled: bool) -> GpuDevice:
        """Turn MIG mode on or off for one card."""
        with self._lock:
            card = self._cards[gpu.uuid]
            if card.enabled is None or not _has_profiles(card.gpu):
                raise InventoryError(f"GPU {gpu.index} ({gpu.product_name}) is not MIG-capable")
            if not enabled and card.placed:
                raise InventoryError(
                    f"GPU {gpu.index}: cannot disable MIG mode while it holds "
                    f"{len(card.placed)} GPU instance(s); destroy them first"
                )
            card.enabled = enabled
            self._changed(f"GPU {gpu.index}: MIG mode {'on' if enabled else 'off'}")
            return self._current.by_uuid(gpu.uuid)

    def create(self, gpu: GpuDevice, profile_name: str, start: int | None = None) -> MigDevice:
        """Create a GPU instance of ``profile_name`` (at memory slice ``start``, or the first
        placement free) with one compute instance spanning it."""
        with self._lock:
            card = self._cards[gpu.uuid]
            if not card.enabled:
                raise InventoryError(f"GPU {gpu.index}: MIG mode is off; enable it first")
            try:
                wanted = profile(card.gpu.product_name, profile_name)
            except MigError as exc:
                raise InventoryError(f"GPU {gpu.index}: {exc}") from None
            existing = [p.instance for p in card.placed]
            if start is None:
                free = free_placements([wanted], existing)
                if not free:
                    raise InventoryError(
                        f"GPU {gpu.index}: insufficient resources for {profile_name} "
                        f"(no free placement beside {_describe(existing)})"
                    )
                instance = free[0]
            else:
                instance = Instance(wanted, start)
                problem = layout_problem([*existing, instance])
                if problem:
                    raise InventoryError(
                        f"GPU {gpu.index}: insufficient resources for {profile_name} at "
                        f"memory slice {start}: {problem}"
                    )
            taken = {p.gpu_instance_id for p in card.placed}
            gi = next(i for i in range(1, len(taken) + 2) if i not in taken)
            card.generation += 1
            placed = _Placed(instance, gi, fake_mig_uuid(gpu.uuid, gi, card.generation))
            card.placed.append(placed)
            self._changed(
                f"GPU {gpu.index}: created {profile_name} at memory slice {instance.start} "
                f"(GPU instance {gi}, {placed.uuid})"
            )
            return next(
                m for m in self._current.by_uuid(gpu.uuid).mig_devices if m.uuid == placed.uuid
            )

    def destroy(self, gpu: GpuDevice, gpu_instance_id: int) -> MigDevice:
        """Destroy the GPU instance ``gpu_instance_id`` (and its compute instance)."""
        with self._lock:
            card = self._cards[gpu.uuid]
            before = self._current.by_uuid(gpu.uuid).mig_devices
            gone = next((m for m in before if m.gpu_instance_id == gpu_instance_id), None)
            if gone is None:
                held = ", ".join(str(p.gpu_instance_id) for p in card.placed) or "none"
                raise InventoryError(
                    f"GPU {gpu.index}: no GPU instance {gpu_instance_id} (it holds: {held})"
                )
            card.placed = [p for p in card.placed if p.gpu_instance_id != gpu_instance_id]
            self._changed(
                f"GPU {gpu.index}: destroyed {gone.profile} GPU instance {gpu_instance_id} "
                f"({gone.uuid})"
            )
            return gone

    # -- internals ------------------------------------------------------------------------

    def _card_from_spec(self, gpu: GpuDevice) -> _Card:
        card = _Card(gpu=gpu, enabled=gpu.mig_enabled)
        for mig in gpu.mig_devices:
            card.placed.append(
                _Placed(
                    Instance(profile(gpu.product_name, mig.profile), mig.start),
                    mig.gpu_instance_id,
                    mig.uuid,
                )
            )
        return card

    def _build(self) -> NodeInventory:
        gpus = []
        for gpu in self._inventory:
            card = self._cards[gpu.uuid]
            ordered = sorted(card.placed, key=lambda p: p.instance.start)
            devices = tuple(
                mig_device(
                    card.gpu,
                    p.instance,
                    index=position,
                    gpu_instance_id=p.gpu_instance_id,
                    uuid=p.uuid,
                )
                for position, p in enumerate(ordered)
            )
            gpus.append(replace(card.gpu, mig_enabled=card.enabled, mig_devices=devices))
        return replace(self._inventory, gpus=tuple(gpus))

    def _changed(self, what: str) -> None:
        self._current = self._build()
        log.info("fake: %s", what)
        if self._state_file is not None:
            write_atomically(
                self._state_file, json.dumps(self._dump(), indent=1, sort_keys=True), 0o644
            )

    def _dump(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "cards": {
                uuid: {
                    "mig_enabled": card.enabled,
                    "generation": card.generation,
                    "instances": [
                        {
                            "profile": p.instance.profile.name,
                            "start": p.instance.start,
                            "gpu_instance_id": p.gpu_instance_id,
                            "uuid": p.uuid,
                        }
                        for p in card.placed
                    ],
                }
                for uuid, card in self._cards.items()
            },
        }

    def _load(self, path: Path) -> None:
        where = f"fake MIG state {path}"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InventoryError(
                f"cannot read the {where}: {exc}", "delete it to start from the spec"
            ) from exc
        if not isinstance(data, dict) or data.get("version") != _STATE_VERSION:
            raise InventoryError(
                f"{where}: not a version-{_STATE_VERSION} state", "delete it to start from the spec"
            )
        cards = data.get("cards")
        if not isinstance(cards, dict):
            raise InventoryError(f"{where}: 'cards' must be a mapping")
        for uuid, raw in cards.items():
            if GpuUuid(uuid) not in self._cards:
                raise InventoryError(
                    f"{where}: cards.{uuid}: no such GPU in the spec",
                    "the state belongs to another spec; delete it",
                )
            self._cards[GpuUuid(uuid)] = self._card_from_state(f"{where}: cards.{uuid}", uuid, raw)

    def _card_from_state(self, where: str, uuid: str, raw: object) -> _Card:
        spec_card = self._cards[GpuUuid(uuid)]
        try:
            assert isinstance(raw, dict)
            enabled = raw["mig_enabled"]
            assert enabled is None or isinstance(enabled, bool)
            placed = [
                _Placed(
                    Instance(
                        profile(spec_card.gpu.product_name, str(i["profile"])), int(i["start"])
                    ),
                    int(i["gpu_instance_id"]),
                    str(i["uuid"]),
                )
                for i in raw["instances"]
            ]
            generation = int(raw["generation"])
        except (AssertionError, KeyError, TypeError, ValueError, MigError) as exc:
            raise InventoryError(f"{where}: malformed entry ({exc!r})") from None
        problem = layout_problem(p.instance for p in placed)
        if problem:
            raise InventoryError(f"{where}: instances do not fit the card: {problem}")
        return _Card(gpu=spec_card.gpu, enabled=enabled, placed=placed, generation=generation)


def _has_profiles(gpu: GpuDevice) -> bool:
    try:
        profiles_of(gpu.product_name)
    except MigError:
        return False
    return True


def _describe(instances: list[Instance]) -> str:
    return ", ".join(f"{i.profile.name}@{i.start}" for i in instances) or "nothing"
