"""A scripted stand-in for the ``pynvml`` module, for testing the NVML backend without a GPU.

It implements exactly the functions :mod:`kubegpu.inventory.nvml` calls, with NVML's real
constants, error classes and ctypes structs taken from the installed ``pynvml`` so codes and
return shapes match. It enforces the semantics the backend relies on: nothing works before
``nvmlInit``; a lost GPU answers every device call with ``GPU_IS_LOST``; NVLink queries past the
last link fail with ``INVALID_ARGUMENT`` and on a GPU without NVLink with ``NOT_SUPPORTED``;
``nvmlEventSetWait_v2`` blocks up to its timeout and raises ``TIMEOUT``; using a freed event set
is an error (it would be undefined behaviour in C).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pynvml as real

from kubegpu.core.mig import MIG_PROFILES, MigProfile

XID = real.nvmlEventTypeXidCriticalError
SBE = real.nvmlEventTypeSingleBitEccError
DBE = real.nvmlEventTypeDoubleBitEccError
NO_INSTANCE = 0xFFFFFFFF


def nvml_error(code: int) -> real.NVMLError:
    return real.NVMLError(code)


@dataclass
class ScriptedMig:
    """A GPU instance with one compute instance, as NVML reports it."""

    uuid: str
    gpu_instance_id: int
    profile: MigProfile
    start: int
    compute_instance_id: int = 0
    compute_slices: int | None = None  # None: the whole GPU instance


@dataclass
class ScriptedGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total_bytes: int = 85899345920  # 81920 MiB
    bus_id: str = "00000000:07:00.0"
    minor: int = 0
    compute_capability: tuple[int, int] | None = (8, 0)
    numa_node: int | None = 0  # None: nvmlDeviceGetNumaNodeId is not supported
    mig_mode: int | None = 0  # None: MIG not supported
    brand: int | None = real.NVML_BRAND_NVIDIA  # None: not supported
    architecture: int | None = real.NVML_DEVICE_ARCH_AMPERE  # None: not supported
    # One entry per NVLink: (remote bus id, remote device type, active). Empty: no NVLink.
    nvlinks: list[tuple[str, int, bool]] = field(default_factory=list)
    supported_events: int = XID | SBE | DBE
    register_error: int | None = None  # error code nvmlDeviceRegisterEvents raises
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)  # functions answering NOT_SUPPORTED
    mig: list[ScriptedMig] = field(default_factory=list)  # MIG devices, NVML's index order


@dataclass
class _Handle:
    index: int


@dataclass
class _MigHandle:
    index: int  # the parent's
    uuid: str


@dataclass
class _GpuInstance:
    index: int  # the parent's
    gpu_instance_id: int


@dataclass
class _EventSet:
    number: int
    devices: list[int] = field(default_factory=list)
    mask: int = 0
    freed: bool = False
    waiting: int = 0


class ScriptedNvml(ModuleType):
    """``pynvml`` for a scripted node; ``gpus`` are enumerated in order."""

    def __init__(
        self,
        gpus: list[ScriptedGpu],
        *,
        topology: dict[tuple[int, int], int] | None = None,
        default_topology: int = real.NVML_TOPOLOGY_SYSTEM,
        driver_version: str = "535.161.08",
        cuda_driver_version: int = 12020,
        init_error: int | None = None,
    ) -> None:
        super().__init__("pynvml")
        for name in dir(real):
            if name.startswith(("NVML_", "nvmlEventType", "NVMLError", "c_nvml")):
                setattr(self, name, getattr(real, name))
        self.gpus = gpus
        self.topology = topology or {}
        self.default_topology = default_topology
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.init_error = init_error
        self.initialised = 0
        self.shutdowns = 0
        self.calls: list[str] = []
        self._cond = threading.Condition()
        self._pending: dict[int, list[Any]] = {i: [] for i in range(len(gpus))}
        self._sets: list[_EventSet] = []
        self.missing: set[str] = set()  # functions these "bindings" do not have at all

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in super().__getattribute__("missing"):
            raise AttributeError(name)
        return super().__getattribute__(name)

    # -- scripting ----------------------------------------------------------------------------

    def emit(
        self,
        index: int,
        event_type: int,
        data: int = 0,
        gi: int = NO_INSTANCE,
        ci: int = NO_INSTANCE,
    ) -> None:
        """Raise an NVML event on GPU ``index`` (seen by event sets registered for that type)."""
        event = real.c_nvmlEventData_t()
        event.eventType = event_type
        event.eventData = data
        event.gpuInstanceId = gi
        event.computeInstanceId = ci
        with self._cond:
            self._pending[index].append(event)
            self._cond.notify_all()

    def set_lost(self, index: int, lost: bool) -> None:
        with self._cond:
            self.gpus[index].lost = lost
            self._cond.notify_all()

    @property
    def live_event_sets(self) -> int:
        return sum(1 for s in self._sets if not s.freed)

    # -- checks -------------------------------------------------------------------------------

    def _check_init(self, name: str) -> None:
        self.calls.append(name)
        if self.initialised <= 0:
            raise nvml_error(real.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, name: str, handle: _Handle) -> ScriptedGpu:
        self._check_init(name)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise nvml_error(real.NVML_ERROR_GPU_IS_LOST)
        if name in gpu.unsupported:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    # -- library ------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise nvml_error(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._check_init("nvmlShutdown")
        self.initialised -= 1
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._check_init("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check_init("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check_init("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise nvml_error(real.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise nvml_error(real.NVML_ERROR_GPU_IS_LOST)
        return _Handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        self._check_init("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for index, gpu in enumerate(self.gpus):
            if gpu.uuid == text:
                return _Handle(index)
        raise nvml_error(real.NVML_ERROR_NOT_FOUND)

    # -- device attributes --------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: _Handle | _MigHandle) -> str:
        if isinstance(handle, _MigHandle):
            return self._mig("nvmlDeviceGetUUID", handle).uuid
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        memory = real.c_nvmlMemory_t()
        memory.total = gpu.memory_total_bytes
        memory.free = gpu.memory_total_bytes
        return memory

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        return _pci_info(gpu.bus_id)

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetMinorNumber", handle).minor

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        gpu = self._gpu("nvmlDeviceGetCudaComputeCapability", handle)
        if gpu.compute_capability is None:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.compute_capability

    def nvmlDeviceGetNumaNodeId(self, handle: _Handle) -> int:
        gpu = self._gpu("nvmlDeviceGetNumaNodeId", handle)
        if gpu.numa_node is None:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.numa_node

    def nvmlDeviceGetBrand(self, handle: _Handle) -> int:
        gpu = self._gpu("nvmlDeviceGetBrand", handle)
        if gpu.brand is None:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.brand

    def nvmlDeviceGetArchitecture(self, handle: _Handle) -> int:
        gpu = self._gpu("nvmlDeviceGetArchitecture", handle)
        if gpu.architecture is None:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.architecture

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        if gpu.mig_mode is None:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    # -- MIG --------------------------------------------------------------------------------

    def _mig(self, name: str, handle: _MigHandle) -> ScriptedMig:
        gpu = self._gpu(name, _Handle(handle.index))
        for mig in gpu.mig:
            if mig.uuid == handle.uuid:
                return mig
        raise nvml_error(real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _MigHandle:
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not 0 <= index < 7:
            raise nvml_error(real.NVML_ERROR_INVALID_ARGUMENT)
        # A GPU instance without a compute instance is not a MIG device yet.
        devices = [m for m in gpu.mig if m.compute_instance_id >= 0]
        if index >= len(devices):
            raise nvml_error(real.NVML_ERROR_NOT_FOUND)
        return _MigHandle(handle.index, devices[index].uuid)

    def nvmlDeviceGetGpuInstanceId(self, handle: _MigHandle) -> int:
        return self._mig("nvmlDeviceGetGpuInstanceId", handle).gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: _MigHandle) -> int:
        return self._mig("nvmlDeviceGetComputeInstanceId", handle).compute_instance_id

    def nvmlDeviceGetAttributes(self, handle: _MigHandle) -> Any:
        mig = self._mig("nvmlDeviceGetAttributes", handle)
        p = mig.profile
        attributes = real.c_nvmlDeviceAttributes()
        attributes.multiprocessorCount = p.multiprocessors
        attributes.sharedCopyEngineCount = p.copy_engines
        attributes.sharedDecoderCount = p.decoders
        attributes.sharedEncoderCount = 0
        attributes.sharedJpegCount = p.jpeg_engines
        attributes.sharedOfaCount = p.ofa_engines
        attributes.gpuInstanceSliceCount = p.compute_slices
        attributes.computeInstanceSliceCount = mig.compute_slices or p.compute_slices
        attributes.memorySizeMB = p.memory_mib
        return attributes

    def nvmlDeviceGetGpuInstanceById(self, handle: _Handle, gpu_instance_id: int) -> _GpuInstance:
        gpu = self._gpu("nvmlDeviceGetGpuInstanceById", handle)
        if not any(m.gpu_instance_id == gpu_instance_id for m in gpu.mig):
            raise nvml_error(real.NVML_ERROR_NOT_FOUND)
        return _GpuInstance(handle.index, gpu_instance_id)

    def _gi(self, name: str, gi: _GpuInstance) -> ScriptedMig:
        gpu = self._gpu(name, _Handle(gi.index))
        for mig in gpu.mig:
            if mig.gpu_instance_id == gi.gpu_instance_id:
                return mig
        raise nvml_error(real.NVML_ERROR_INVALID_ARGUMENT)  # a destroyed instance's handle

    def nvmlGpuInstanceGetInfo(self, gi: _GpuInstance) -> Any:
        mig = self._gi("nvmlGpuInstanceGetInfo", gi)
        info = real.c_nvmlGpuInstanceInfo_t()
        info.id = mig.gpu_instance_id
        info.profileId = mig.profile.profile_id
        info.placement.start = mig.start
        info.placement.size = mig.profile.memory_slices
        return info

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: _Handle, nvml_profile: int) -> Any:
        gpu = self._gpu("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        for p in MIG_PROFILES.get(gpu.name, ()):
            if p.nvml_profile == nvml_profile:
                info = real.c_nvmlGpuInstanceProfileInfo_t()
                info.id = p.profile_id
                info.sliceCount = p.compute_slices
                return info
        raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: _Handle, profile_id: int, placement: Any
    ) -> _GpuInstance:
        gpu = self._gpu("nvmlDeviceCreateGpuInstanceWithPlacement", handle)
        if gpu.mig_mode != real.NVML_DEVICE_MIG_ENABLE:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        p = next(p for p in MIG_PROFILES[gpu.name] if p.profile_id == profile_id)
        wanted = set(range(placement.start, placement.start + placement.size))
        for mig in gpu.mig:
            if wanted & set(range(mig.start, mig.start + mig.profile.memory_slices)):
                raise nvml_error(real.NVML_ERROR_INSUFFICIENT_RESOURCES)
        taken = {m.gpu_instance_id for m in gpu.mig}
        gi = next(i for i in range(1, 15) if i not in taken)
        # No compute instance yet: the device appears once one is created (see below).
        gpu.mig.append(ScriptedMig(f"MIG-scripted-{handle.index}-{gi}", gi, p, placement.start, -1))
        return _GpuInstance(handle.index, gi)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: _GpuInstance, profile: int, engine_profile: int
    ) -> Any:
        self._gi("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi)
        info = real.c_nvmlComputeInstanceProfileInfo_t()
        info.id = profile
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gi: _GpuInstance, profile_id: int) -> Any:
        mig = self._gi("nvmlGpuInstanceCreateComputeInstance", gi)
        mig.compute_instance_id = 0
        return ("ci", gi.index, gi.gpu_instance_id, 0)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: _GpuInstance, ci: int) -> Any:
        mig = self._gi("nvmlGpuInstanceGetComputeInstanceById", gi)
        if mig.compute_instance_id != ci:
            raise nvml_error(real.NVML_ERROR_NOT_FOUND)
        return ("ci", gi.index, gi.gpu_instance_id, ci)

    def nvmlComputeInstanceDestroy(self, compute: Any) -> None:
        _, index, gpu_instance_id, _ci = compute
        mig = self._gi("nvmlComputeInstanceDestroy", _GpuInstance(index, gpu_instance_id))
        mig.compute_instance_id = -1

    def nvmlGpuInstanceDestroy(self, gi: _GpuInstance) -> None:
        mig = self._gi("nvmlGpuInstanceDestroy", gi)
        if mig.compute_instance_id >= 0:
            raise nvml_error(real.NVML_ERROR_IN_USE)  # compute instances must go first
        self.gpus[gi.index].mig.remove(mig)

    def _link(self, name: str, handle: _Handle, link: int) -> tuple[str, int, bool]:
        gpu = self._gpu(name, handle)
        if not gpu.nvlinks:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(gpu.nvlinks):
            raise nvml_error(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        active = self._link("nvmlDeviceGetNvLinkState", handle, link)[2]
        return int(real.NVML_FEATURE_ENABLED if active else real.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int) -> Any:
        return _pci_info(self._link("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)[0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: _Handle, link: int) -> int:
        return self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)[1]

    def nvmlDeviceGetTopologyCommonAncestor(self, first: _Handle, second: _Handle) -> int:
        self._gpu("nvmlDeviceGetTopologyCommonAncestor", first)
        self._gpu("nvmlDeviceGetTopologyCommonAncestor", second)
        key = (min(first.index, second.index), max(first.index, second.index))
        return self.topology.get(key, self.default_topology)

    # -- events -------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        self._check_init("nvmlEventSetCreate")
        event_set = _EventSet(number=len(self._sets))
        self._sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetSupportedEventTypes", handle).supported_events

    def nvmlDeviceRegisterEvents(self, handle: _Handle, mask: int, event_set: _EventSet) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        assert not event_set.freed, "registering on a freed event set"
        if gpu.register_error is not None:
            raise nvml_error(gpu.register_error)
        if mask & ~gpu.supported_events:
            raise nvml_error(real.NVML_ERROR_NOT_SUPPORTED)
        event_set.devices.append(handle.index)
        event_set.mask |= mask

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> Any:
        self._check_init("nvmlEventSetWait_v2")
        if event_set.freed:
            raise AssertionError("waiting on a freed event set")

        def ready() -> bool:
            return any(
                self.gpus[i].lost or any(e.eventType & event_set.mask for e in self._pending[i])
                for i in event_set.devices
            )

        with self._cond:
            event_set.waiting += 1
            try:
                self._cond.wait_for(ready, timeout=timeout_ms / 1000)
                for index in event_set.devices:
                    if self.gpus[index].lost:
                        raise nvml_error(real.NVML_ERROR_GPU_IS_LOST)
                    # Events of types the set did not register for never reach it.
                    wanted = [e for e in self._pending[index] if e.eventType & event_set.mask]
                    self._pending[index] = [e for e in self._pending[index] if e not in wanted]
                    if wanted:
                        self._pending[index] = wanted[1:] + self._pending[index]
                        return wanted[0]
                raise nvml_error(real.NVML_ERROR_TIMEOUT)
            finally:
                event_set.waiting -= 1

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._check_init("nvmlEventSetFree")
        assert not event_set.freed, "event set freed twice"
        assert event_set.waiting == 0, "event set freed while a thread waits on it"
        event_set.freed = True


def _pci_info(bus_id: str) -> Any:
    info = real.nvmlPciInfo_t()
    info.busId = bus_id.encode()
    info.busIdLegacy = bus_id[-12:].encode()
    return info
