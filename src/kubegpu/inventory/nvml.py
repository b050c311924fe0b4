"""The NVML backend: the one module that reads GPUs through ``pynvml`` (nvidia-ml-py).

Following nvitop's lessons: NVML is initialised lazily on first use and shut down on ``close``;
each :meth:`NvmlBackend.snapshot` reads every GPU in one pass and freezes the result; calls a
GPU or driver does not support become ``None`` fields instead of errors; every other NVML error
is translated once, here, into an :class:`InventoryError` whose hint says what the admin should
check. The ``pynvml`` module is injectable so the tests can drive this code with a scripted
stand-in that raises NVML's real error classes.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from kubegpu.core.gpu import (
    GpuDevice,
    GpuLink,
    GpuUuid,
    MigDevice,
    NodeInventory,
    PcieLink,
    architecture_of,
    pci_address,
)
from kubegpu.inventory import nvml_session
from kubegpu.inventory.nvml_health import NvmlHealthWatcher
from kubegpu.inventory.nvml_mig import (
    MIG_MINORS,
    create_on_card,
    destroy_on_card,
    read_cap_minors,
    read_mig_devices,
)
from kubegpu.inventory.nvml_names import PCIE_ROOT, architecture_name, brand_name
from kubegpu.inventory.nvml_session import (
    _LOST_ERRORS,
    _UNSUPPORTED_ERRORS,
    _code,
    _error_name,
    translate_nvml_error,
)

log = logging.getLogger(__name__)


# NVML's nvmlGpuTopologyLevel_t -> our PcieLink (same scale, reversed: NVML counts distance).
_TOPOLOGY_LEVELS: dict[str, PcieLink] = {
    "NVML_TOPOLOGY_INTERNAL": PcieLink.BOARD,
    "NVML_TOPOLOGY_SINGLE": PcieLink.PIX,
    "NVML_TOPOLOGY_MULTIPLE": PcieLink.PXB,
    "NVML_TOPOLOGY_HOSTBRIDGE": PcieLink.PHB,
    "NVML_TOPOLOGY_NODE": PcieLink.NODE,
    "NVML_TOPOLOGY_SYSTEM": PcieLink.SYS,
}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def normalise_bus_id(bus_id: object) -> str:
    """NVML's bus id form ``00000000:07:00.0`` (8-digit domain, upper case), from any form."""
    text = _text(bus_id).strip().upper()
    domain, sep, rest = text.partition(":")
    if not sep or ":" not in rest:
        return text
    return f"{domain[-8:].zfill(8)}:{rest}"


def format_cuda_version(version: int) -> str:
    """NVML's integer CUDA driver version (12040) as ``"12.4"``."""
    return f"{version // 1000}.{(version % 1000) // 10}"


class NvmlBackend:
    """Reads the node's GPUs through NVML. Thread-safe; NVML itself is thread-safe."""

    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType | None = None,
        *,
        sysfs_root: Path = Path("/sys"),
        mig_minors: Path = MIG_MINORS,
    ) -> None:
        self._nvml: Any = nvml
        self._sysfs_root = sysfs_root
        self._mig_minors = mig_minors
        self._lock = threading.Lock()
        # Snapshots are serialised: each one reads and replaces the previous (see _last).
        self._snapshot_lock = threading.Lock()
        self._initialised = False
        self._last: NodeInventory | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def init(self) -> None:
        """Load and initialise NVML now (it is otherwise done on first use). Idempotent."""
        with self._lock:
            if self._initialised:
                return
            # One process-wide NVML session, shared with the metrics source.
            self._nvml = nvml_session.acquire(self._nvml)
            self._initialised = True

    def close(self) -> None:
        """Shut NVML down; close every health watcher first."""
        with self._lock:
            if not self._initialised:
                return
            self._initialised = False
            nvml_session.release(self._nvml)

    def _ready(self) -> Any:
        self.init()
        return self._nvml

    # -- inventory ----------------------------------------------------------------------------

    def snapshot(self) -> NodeInventory:
        """Read every GPU, its links and the driver versions once, and freeze the result.

        A GPU that stopped answering keeps the record of the previous snapshot (NVML keeps
        enumerating it and ids must stay stable); without one, the snapshot fails.
        """
        nvml = self._ready()
        with self._snapshot_lock:
            inventory = self._read_inventory(nvml)
            self._last = inventory
            return inventory

    def _read_inventory(self, nvml: Any) -> NodeInventory:
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise translate_nvml_error(nvml, exc, "counting GPUs") from exc
        gpus: list[GpuDevice] = []
        handles: dict[GpuUuid, Any] = {}
        stale: set[GpuUuid] = set()
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpu = self._read_device(nvml, index, handle)
            except nvml.NVMLError as exc:
                previous = self._previous(index)
                if previous is None or _error_name(nvml, exc) not in _LOST_ERRORS:
                    raise translate_nvml_error(nvml, exc, f"reading GPU {index}") from exc
                log.warning(
                    "GPU %d (%s) is not answering (%s); keeping its last known description",
                    index,
                    previous.uuid,
                    exc,
                )
                gpus.append(previous)
                stale.add(previous.uuid)
                continue
            gpus.append(gpu)
            handles[gpu.uuid] = handle
        try:
            inventory = NodeInventory(
                gpus=tuple(gpus),
                links=self._read_links(nvml, gpus, handles, stale),
                driver_version=self._driver_version(nvml),
                cuda_driver_version=self._cuda_version(nvml),
            )
        except nvml.NVMLError as exc:
            raise translate_nvml_error(nvml, exc, "reading GPU topology and versions") from exc
        return inventory

    # -- MigPartitioner (dynamic MIG) --------------------------------------------------------

    def create_mig_device(self, parent: GpuUuid, profile: str, start: int) -> MigDevice:
        return create_on_card(self._ready(), self.snapshot, parent, profile, start)

    def destroy_mig_device(self, parent: GpuUuid, gpu_instance_id: int) -> None:
        destroy_on_card(self._ready(), parent, gpu_instance_id)

    def _previous(self, index: int) -> GpuDevice | None:
        if self._last is None:
            return None
        try:
            return self._last.by_index(index)
        except KeyError:
            return None

    def _optional(self, nvml: Any, call: str, *args: Any) -> Any:
        """``nvml.<call>(*args)``, or ``None`` when the GPU, driver or bindings lack it."""
        function = getattr(nvml, call, None)
        if function is None:
            return None  # bindings older than the call
        try:
            return function(*args)
        except nvml.NVMLError as exc:
            if _error_name(nvml, exc) in _UNSUPPORTED_ERRORS:
                return None
            raise

    def _driver_version(self, nvml: Any) -> str | None:
        version = self._optional(nvml, "nvmlSystemGetDriverVersion")
        return None if version is None else _text(version)

    def _cuda_version(self, nvml: Any) -> str | None:
        for call in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
            version = self._optional(nvml, call)
            if isinstance(version, int) and version > 0:
                return format_cuda_version(version)
        return None

    def _read_device(self, nvml: Any, index: int, handle: Any) -> GpuDevice:
        uuid = GpuUuid(_text(nvml.nvmlDeviceGetUUID(handle)))
        pci = nvml.nvmlDeviceGetPciInfo(handle)
        bus_id = normalise_bus_id(pci.busId)
        numa = self._optional(nvml, "nvmlDeviceGetNumaNodeId", handle)
        numa = None if numa is None else int(numa)
        if numa is None:
            numa = self._numa_from_sysfs(bus_id)
        mig = self._optional(nvml, "nvmlDeviceGetMigMode", handle)
        capability = self._optional(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
        capability = (int(capability[0]), int(capability[1])) if capability is not None else None
        brand = self._optional(nvml, "nvmlDeviceGetBrand", handle)
        architecture = self._optional(nvml, "nvmlDeviceGetArchitecture", handle)
        gpu = GpuDevice(
            index=index,
            uuid=uuid,
            product_name=_text(nvml.nvmlDeviceGetName(handle)),
            memory_total_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024),
            pci_bus_id=bus_id,
            minor_number=int(nvml.nvmlDeviceGetMinorNumber(handle)),
            compute_capability=capability,
            # -1 is how both NVML and sysfs say "no NUMA affinity".
            numa_node=numa if numa is not None and numa >= 0 else None,
            mig_enabled=(
                None if mig is None else int(mig[0]) == _code(nvml, "NVML_DEVICE_MIG_ENABLE")
            ),
            brand=None if brand is None else brand_name(nvml, brand),
            architecture=(None if architecture is None else architecture_name(nvml, architecture))
            or architecture_of(capability),
            pcie_root=self._pcie_root_from_sysfs(bus_id),
        )
        if not gpu.mig_enabled:
            return gpu
        return replace(
            gpu, mig_devices=read_mig_devices(nvml, handle, gpu, read_cap_minors(self._mig_minors))
        )

    def _sysfs_device(self, bus_id: str) -> Path:
        return self._sysfs_root / "bus/pci/devices" / pci_address(bus_id)

    def _numa_from_sysfs(self, bus_id: str) -> int | None:
        try:
            return int((self._sysfs_device(bus_id) / "numa_node").read_text().strip())
        except (OSError, ValueError):
            return None

    def _pcie_root_from_sysfs(self, bus_id: str) -> str | None:
        """The root complex above the card: the ``pciDDDD:BB`` folder on the way from
        ``/sys/devices`` to the card (``/sys/bus/pci/devices/<id>`` links there)."""
        try:
            target = os.readlink(self._sysfs_device(bus_id))
        except OSError:
            return None
        for part in Path(target).parts:
            if PCIE_ROOT.fullmatch(part):
                return part
        return None

    def _read_links(
        self,
        nvml: Any,
        gpus: list[GpuDevice],
        handles: dict[GpuUuid, Any],
        stale: set[GpuUuid],
    ) -> dict[tuple[GpuUuid, GpuUuid], GpuLink]:
        by_bus = {gpu.pci_bus_id: gpu.uuid for gpu in gpus}
        lanes: dict[tuple[GpuUuid, GpuUuid], int] = {}
        switch_lanes: dict[GpuUuid, int] = {}
        for uuid, handle in handles.items():
            peers, to_switch = self._read_nvlinks(nvml, handle, by_bus)
            switch_lanes[uuid] = to_switch
            for peer, count in peers.items():
                if peer != uuid:
                    lanes[(uuid, peer)] = count
        links: dict[tuple[GpuUuid, GpuUuid], GpuLink] = {}
        previous = self._last
        for a, b in itertools.combinations(gpus, 2):
            if a.uuid in stale or b.uuid in stale:
                old = previous.link(a.uuid, b.uuid) if previous is not None else None
                if old is not None:
                    links[(a.uuid, b.uuid)] = old
                continue
            # Both ends count the same lanes; take the larger in case one end failed to read.
            direct = max(lanes.get((a.uuid, b.uuid), 0), lanes.get((b.uuid, a.uuid), 0))
            # Behind NVSwitches the remote end of every link is a switch, not the peer GPU; two
            # GPUs on the same fabric talk over as many lanes as the less connected one has.
            via_switch = min(switch_lanes.get(a.uuid, 0), switch_lanes.get(b.uuid, 0))
            pcie = self._optional(
                nvml, "nvmlDeviceGetTopologyCommonAncestor", handles[a.uuid], handles[b.uuid]
            )
            level = self._pcie_level(nvml, pcie)
            if level is None and not (direct or via_switch):
                continue  # unknown: NodeInventory.link() answers None
            links[(a.uuid, b.uuid)] = GpuLink(
                pcie=level if level is not None else PcieLink.SYS, nvlinks=direct + via_switch
            )
        return links

    def _pcie_level(self, nvml: Any, value: object) -> PcieLink | None:
        if value is None:
            return None
        for name, level in _TOPOLOGY_LEVELS.items():
            if value == _code(nvml, name):
                return level
        log.warning(
            "unknown NVML topology level %r; treating the pair's PCIe path as unknown", value
        )
        return None

    def _read_nvlinks(
        self, nvml: Any, handle: Any, by_bus: dict[str, GpuUuid]
    ) -> tuple[dict[GpuUuid, int], int]:
        """Active NVLink lanes of one GPU: per peer GPU, and how many end at an NVSwitch."""
        peers: dict[GpuUuid, int] = {}
        to_switch = 0
        max_links = _code(nvml, "NVML_NVLINK_MAX_LINKS") or 18
        switch_type = _code(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH")
        for link in range(max_links):
            # NOT_SUPPORTED (no NVLink) or INVALID_ARGUMENT (past the GPU's last link) end it.
            state = self._optional(nvml, "nvmlDeviceGetNvLinkState", handle, link)
            if state is None:
                break
            if state != _code(nvml, "NVML_FEATURE_ENABLED"):
                continue
            remote = self._optional(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            if remote is None:
                continue
            peer = by_bus.get(normalise_bus_id(remote.busId))
            if peer is not None:
                peers[peer] = peers.get(peer, 0) + 1
                continue
            kind = self._optional(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            if kind is not None and kind == switch_type:
                to_switch += 1
        return peers, to_switch

    # -- health -------------------------------------------------------------------------------

    def watch_health(self, uuid: GpuUuid) -> NvmlHealthWatcher:
        nvml = self._ready()
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        except nvml.NVMLError as exc:
            raise translate_nvml_error(nvml, exc, f"opening GPU {uuid} for health events") from exc
        return NvmlHealthWatcher(nvml, handle, uuid)
