"""The one small protocol every GPU backend implements (NVML and fake): a port of the core.

Consumers (device plugin, labels, exporter) receive a ``GpuBackend`` from their role's
composition root (:mod:`kubegpu.roles`) and never import ``pynvml`` or the inventory edge
themselves; the protocol lives in the core so that no edge has to import another to name it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from kubegpu.core.gpu import GpuUuid, MigDevice, NodeInventory
from kubegpu.core.health import HealthEvent


class InventoryError(Exception):
    """A backend could not read the GPUs; ``hint`` says what the admin should check."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(f"{message} — {hint}" if hint else message)
        self.message = message
        self.hint = hint


class HealthWatcher(Protocol):
    """Blocking source of health events for one physical GPU (one thread waits on it)."""

    def wait(self, timeout_s: float) -> list[HealthEvent]:
        """Events seen within ``timeout_s`` (empty when nothing happened)."""
        ...

    def close(self) -> None: ...


class GpuBackend(Protocol):
    name: str

    def snapshot(self) -> NodeInventory:
        """Read every GPU once and freeze the result."""
        ...

    def watch_health(self, uuid: GpuUuid) -> HealthWatcher:
        """Open a watcher for one GPU's Xid and device-lost events."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class MigPartitioner(Protocol):
    """Creates and destroys MIG GPU instances on a card in MIG mode (dynamic MIG).

    The fake backend and NVML both implement it; the DRA driver's partitionable devices call
    it on prepare and unprepare. Errors are :class:`InventoryError` naming the card and why.
    """

    def snapshot(self) -> NodeInventory:
        """The cards as they are now, their MIG devices included."""
        ...

    def create_mig_device(self, parent: GpuUuid, profile: str, start: int) -> MigDevice:
        """Create a GPU instance of ``profile`` at memory slice ``start``, with one compute
        instance spanning it, and return the MIG device it makes."""
        ...

    def destroy_mig_device(self, parent: GpuUuid, gpu_instance_id: int) -> None:
        """Destroy the GPU instance (and its compute instances); gone already is not an
        error the caller needs to handle differently, so it raises nothing then."""
        ...
