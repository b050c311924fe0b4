"""The MIG side of preparing claims: which instance a MIG device name stands for, and under
dynamic MIG the instance's life (created on prepare, destroyed on unprepare, and at start the
instances no prepared claim holds destroyed, as NVIDIA's driver does: the checkpoint is the
truth about which instances are in use).

A device name carries its card, profile id and first memory slice
(:func:`kubegpu.core.dra.mig_placement`), so nothing else needs remembering: unprepare finds
the instance at that placement and destroys it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from kubegpu.core.backend import InventoryError, MigPartitioner
from kubegpu.core.dra import ClaimRef, MigPlacement, mig_device_name, mig_placement
from kubegpu.core.gpu import GpuDevice, MigDevice, NodeInventory
from kubegpu.core.mig import MigError, profiles_of

log = logging.getLogger(__name__)


class MigPrepareError(RuntimeError):
    """The claim's MIG device cannot be had; the message names the claim and the device."""


class MigInstances:
    def __init__(
        self,
        node_name: str,
        inventory: NodeInventory,
        partitioner: MigPartitioner | None = None,
        *,
        dynamic: bool = False,
    ) -> None:
        if dynamic and partitioner is None:
            raise ValueError("dynamic MIG needs a backend that can create MIG instances")
        self.node_name = node_name
        self.inventory = inventory
        self.partitioner = partitioner
        self.dynamic = dynamic

    def _card(self, index: int) -> GpuDevice | None:
        current = self.partitioner.snapshot() if self.partitioner is not None else self.inventory
        try:
            return current.by_index(index)
        except KeyError:
            return None

    def resolve(self, claim: ClaimRef, device: str, placement: MigPlacement) -> MigDevice:
        """The MIG device ``device`` names: the instance at its placement, created first under
        dynamic MIG when the card does not hold it yet."""
        card = self._card(placement.index)
        if card is None or not card.mig_enabled:
            raise MigPrepareError(
                f"claim {claim}: device {device!r} names GPU {placement.index}, which is not a "
                f"GPU in MIG mode on node {self.node_name}"
            )
        found = _at(card, placement)
        if found is not None:
            return found
        if not self.dynamic or self.partitioner is None:
            held = ", ".join(
                mig_device_name(card.index, m.profile, m.profile_id, m.start)
                for m in card.mig_devices
            )
            raise MigPrepareError(
                f"claim {claim}: GPU {card.index} holds no MIG device {device!r} (static MIG; "
                f"it holds: {held or 'none'})"
            )
        profile = _profile_name(card, placement)
        try:
            made = self.partitioner.create_mig_device(card.uuid, profile, placement.start)
        except InventoryError as exc:
            raise MigPrepareError(f"claim {claim}: creating {device!r}: {exc}") from None
        log.info(
            "node %s: created MIG device %s (%s, GPU instance %d) on GPU %d for claim %s",
            self.node_name,
            device,
            made.uuid,
            made.gpu_instance_id,
            card.index,
            claim,
        )
        return made

    def release(self, claim: ClaimRef, devices: Iterable[str]) -> None:
        """Under dynamic MIG, destroy the instances these device names stand for."""
        if not self.dynamic or self.partitioner is None:
            return
        for device in dict.fromkeys(devices):
            placement = mig_placement(device)
            card = self._card(placement.index) if placement is not None else None
            found = _at(card, placement) if card is not None and placement is not None else None
            if card is None or found is None:
                continue  # gone already: unprepare is idempotent
            try:
                self.partitioner.destroy_mig_device(card.uuid, found.gpu_instance_id)
            except InventoryError as exc:
                raise MigPrepareError(f"claim {claim}: destroying {device!r}: {exc}") from None
            log.info(
                "node %s: destroyed MIG device %s (%s) on GPU %d of claim %s",
                self.node_name,
                device,
                found.uuid,
                card.index,
                claim,
            )

    def reconcile(self, held: Iterable[str]) -> list[MigDevice]:
        """Under dynamic MIG, destroy every instance on a card in MIG mode that no prepared
        claim's device names (left by a crash between create and checkpoint, or made by
        hand); returns what was destroyed."""
        if not self.dynamic or self.partitioner is None:
            return []
        keep = {p for p in map(mig_placement, held) if p is not None}
        destroyed = []
        for card in self.partitioner.snapshot():
            for mig in card.mig_devices if card.mig_enabled else ():
                if MigPlacement(card.index, mig.profile_id, mig.start) in keep:
                    continue
                self.partitioner.destroy_mig_device(card.uuid, mig.gpu_instance_id)
                log.warning(
                    "node %s: destroyed MIG device %s (%s at memory slice %d) on GPU %d: no "
                    "prepared claim holds it (dynamic MIG owns the cards in MIG mode)",
                    self.node_name,
                    mig.uuid,
                    mig.profile,
                    mig.start,
                    card.index,
                )
                destroyed.append(mig)
        return destroyed


def _at(card: GpuDevice, placement: MigPlacement) -> MigDevice | None:
    for mig in card.mig_devices:
        if mig.profile_id == placement.profile_id and mig.start == placement.start:
            return mig
    return None


def _profile_name(card: GpuDevice, placement: MigPlacement) -> str:
    try:
        for profile in profiles_of(card.product_name):
            if profile.profile_id == placement.profile_id:
                return profile.name
    except MigError as exc:
        raise MigPrepareError(str(exc)) from None
    raise MigPrepareError(
        f"GPU {card.index} ({card.product_name}) has no MIG profile id {placement.profile_id}"
    )
