"""MIG through NVML: read a card's MIG devices, and create or destroy GPU instances.

The calls are the ones NVIDIA's go-nvlib and DRA driver make: ``nvmlDeviceGetMaxMigDeviceCount``
and ``nvmlDeviceGetMigDeviceHandleByIndex`` to enumerate (a free index answers NOT_FOUND or
INVALID_ARGUMENT), the GPU- and compute-instance ids and ``nvmlDeviceGetAttributes`` per device,
``nvmlGpuInstanceGetInfo`` for its profile id and placement; to create,
``nvmlDeviceCreateGpuInstanceWithPlacement`` then a compute instance of the same slice count
(``nvmlGpuInstanceCreateComputeInstance``); to destroy, every compute instance and then the GPU
instance. The capability-device minors come from the driver's
``/proc/driver/nvidia-caps/mig-minors``. Reading never changes the card; only the DRA driver's
dynamic MIG calls :func:`create_instance` and :func:`destroy_instance`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubegpu.core.backend import InventoryError
from kubegpu.core.gpu import GpuDevice, GpuUuid, MigDevice, NodeInventory
from kubegpu.core.mig import MigError, MigProfile, profile, profiles_of
from kubegpu.inventory.nvml_session import _error_name

log = logging.getLogger(__name__)

MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")
NO_INSTANCE = 0xFFFFFFFF
_ABSENT = frozenset({"NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT"})
# Compute-instance profile (NVML_COMPUTE_INSTANCE_PROFILE_*) for a GPU instance of n slices.
_CI_PROFILE_BY_SLICES = {1: "1_SLICE", 2: "2_SLICE", 3: "3_SLICE", 4: "4_SLICE", 7: "7_SLICE"}


def read_cap_minors(path: Path = MIG_MINORS) -> dict[str, int]:
    """``gpu0/gi1/access`` -> its minor, from the driver's table; empty when unreadable."""
    try:
        text = path.read_text(encoding="ascii")
    except OSError:
        return {}
    minors: dict[str, int] = {}
    for line in text.splitlines():
        name, _, number = line.strip().rpartition(" ")
        if name and number.isdigit():
            minors[name] = int(number)
    return minors


def event_instance(data: Any) -> tuple[int | None, int | None]:
    """An NVML event's MIG GPU and compute instance; None where it concerns the whole card."""
    gi = getattr(data, "gpuInstanceId", NO_INSTANCE)
    ci = getattr(data, "computeInstanceId", NO_INSTANCE)
    if gi == NO_INSTANCE:
        return None, None
    return int(gi), None if ci == NO_INSTANCE else int(ci)


def event_detail(data: Any) -> str:
    """The event's MIG instance in words, for log lines ("" for the whole card)."""
    gi, ci = event_instance(data)
    if gi is None:
        return ""
    return f"MIG GPU instance {gi}" + (f", compute instance {ci}" if ci is not None else "")


def read_mig_devices(
    nvml: Any, handle: Any, parent: GpuDevice, cap_minors: Mapping[str, int]
) -> tuple[MigDevice, ...]:
    """The MIG devices of one card in MIG mode, in NVML's index order."""
    devices: list[MigDevice] = []
    count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    for index in range(count):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except nvml.NVMLError as exc:
            if _error_name(nvml, exc) in _ABSENT:
                continue
            raise
        devices.append(_read_one(nvml, handle, mig, parent, len(devices), cap_minors))
    return tuple(devices)


def _read_one(
    nvml: Any,
    parent_handle: Any,
    mig: Any,
    parent: GpuDevice,
    position: int,
    cap_minors: Mapping[str, int],
) -> MigDevice:
    uuid = nvml.nvmlDeviceGetUUID(mig)
    uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    gi = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
    ci = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
    attributes = nvml.nvmlDeviceGetAttributes(mig)
    info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(parent_handle, gi))
    profile_id = int(info.profileId)
    gi_slices = int(attributes.gpuInstanceSliceCount)
    memory_mib = int(attributes.memorySizeMB)
    prefix = f"gpu{parent.minor_number}/gi{gi}"
    return MigDevice(
        uuid=uuid,
        parent_uuid=parent.uuid,
        parent_index=parent.index,
        parent_minor=parent.minor_number,
        index=position,
        gpu_instance_id=gi,
        compute_instance_id=ci,
        profile=profile_name(
            parent,
            profile_id,
            gi_slices,
            int(attributes.computeInstanceSliceCount),
            memory_mib,
        ),
        profile_id=profile_id,
        start=int(info.placement.start),
        memory_slices=int(info.placement.size),
        compute_slices=gi_slices,
        memory_total_mib=memory_mib,
        multiprocessors=int(attributes.multiprocessorCount),
        copy_engines=int(attributes.sharedCopyEngineCount),
        decoders=int(attributes.sharedDecoderCount),
        encoders=int(attributes.sharedEncoderCount),
        jpeg_engines=int(attributes.sharedJpegCount),
        ofa_engines=int(attributes.sharedOfaCount),
        gi_cap_minor=cap_minors.get(f"{prefix}/access"),
        ci_cap_minor=cap_minors.get(f"{prefix}/ci{ci}/access"),
    )


def profile_name(
    parent: GpuDevice, profile_id: int, gi_slices: int, ci_slices: int, memory_mib: int
) -> str:
    """The profile's name: from the card's table when it is known there, otherwise computed
    the way NVIDIA's go-nvlib names it (memory as the nearest eighth of the card, in GB)."""
    if ci_slices == gi_slices:
        try:
            for known in profiles_of(parent.product_name):
                if known.profile_id == profile_id:
                    return known.name
        except MigError:
            pass
    total_mib = parent.memory_total_mib
    fraction = math.ceil(memory_mib / total_mib * 8) / 8
    gigabytes = round(fraction * math.ceil(total_mib / 1024))
    name = f"{gi_slices}g.{gigabytes}gb"
    return name if ci_slices == gi_slices else f"{ci_slices}c.{name}"


def create_instance(nvml: Any, handle: Any, profile: MigProfile, start: int) -> int:
    """Create a GPU instance of ``profile`` at memory slice ``start`` with one compute
    instance spanning it; returns the GPU-instance id."""
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile.nvml_profile)
    placement = nvml.c_nvmlGpuInstancePlacement_t()
    placement.start = start
    placement.size = profile.memory_slices
    gpu_instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, placement)
    try:
        ci_profile = getattr(
            nvml, "NVML_COMPUTE_INSTANCE_PROFILE_" + _CI_PROFILE_BY_SLICES[profile.compute_slices]
        )
        ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gpu_instance, ci_profile, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        )
        nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_info.id)
    except Exception:
        # Leave no half-made instance behind: it would hold the slices with nothing usable.
        nvml.nvmlGpuInstanceDestroy(gpu_instance)
        raise
    return int(nvml.nvmlGpuInstanceGetInfo(gpu_instance).id)


def destroy_instance(nvml: Any, handle: Any, gpu_instance_id: int) -> bool:
    """Destroy a GPU instance and its compute instances; False when it was already gone."""
    try:
        gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
    except nvml.NVMLError as exc:
        if _error_name(nvml, exc) in _ABSENT:
            return False
        raise
    for ci in range(8):
        try:
            compute = nvml.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, ci)
        except nvml.NVMLError as exc:
            if _error_name(nvml, exc) in _ABSENT:
                continue
            raise
        nvml.nvmlComputeInstanceDestroy(compute)
    nvml.nvmlGpuInstanceDestroy(gpu_instance)
    return True


def create_on_card(
    nvml: Any,
    snapshot: Callable[[], NodeInventory],
    parent: GpuUuid,
    profile_name: str,
    start: int,
) -> MigDevice:
    """The NVML backend's ``create_mig_device``: create, then read the card back."""
    card = snapshot().by_uuid(parent)
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(parent)
        gi = create_instance(nvml, handle, profile(card.product_name, profile_name), start)
    except (nvml.NVMLError, MigError) as exc:
        raise InventoryError(
            f"GPU {card.index}: cannot create {profile_name} at memory slice {start}: {exc}"
        ) from exc
    log.info(
        "GPU %d: created %s at memory slice %d (GPU instance %d)",
        card.index,
        profile_name,
        start,
        gi,
    )
    return next(m for m in snapshot().by_uuid(parent).mig_devices if m.gpu_instance_id == gi)


def destroy_on_card(nvml: Any, parent: GpuUuid, gpu_instance_id: int) -> None:
    """The NVML backend's ``destroy_mig_device``."""
    try:
        gone = destroy_instance(nvml, nvml.nvmlDeviceGetHandleByUUID(parent), gpu_instance_id)
    except nvml.NVMLError as exc:
        raise InventoryError(
            f"GPU {parent}: cannot destroy GPU instance {gpu_instance_id}: {exc}"
        ) from exc
    if gone:
        log.info("GPU %s: destroyed GPU instance %d", parent, gpu_instance_id)
