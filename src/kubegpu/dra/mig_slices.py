"""MIG devices in the ResourceSlice: static instances, and the placements of dynamic MIG.

A card in MIG mode is never published whole. **Static** (the default): each GPU instance the
card holds is a device of its own, named as NVIDIA's DRA driver names it
(:func:`kubegpu.core.dra.mig_device_name`), with its profile, its parent's UUID and the
attributes it inherits from the card, and its share of the card as capacity. **Dynamic**
(``dra.mig: dynamic``, Kubernetes partitionable devices, KEP-4815): every placement the card's
profile table allows is a device, none exists yet, and each consumes from the card's counter
set what the MIG rules say it takes: its memory slices (one counter each, so instances never
overlap), its compute slices (7 per card) and, for a ``+me`` profile, the card's one set of
media extensions. The scheduler's allocator then only ever picks placements that fit together
on a card, exactly :func:`kubegpu.core.mig.layout_problem`'s rule, and the driver creates the
instance when the claim is prepared.

Counter sets and devices go into separate slices of the node's pool (Kubernetes 1.35 allows
only one of the two per slice), at most 8 sets per slice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubegpu.core.dra import NVIDIA_NAMING, DraNaming, mig_device_name
from kubegpu.core.gpu import GpuDevice, MigDevice
from kubegpu.core.mig import COMPUTE_SLICES, MEMORY_SLICES, MigError, MigProfile, profiles_of

MAX_COUNTER_SETS_PER_SLICE = 8
COMPUTE_COUNTER = "compute-slices"
MEDIA_COUNTER = "media-extensions"


def counter_set_name(gpu: GpuDevice) -> str:
    return f"gpu-{gpu.index}-counter-set"


def memory_counter(slice_index: int) -> str:
    return f"memory-slice-{slice_index}"


def counter_set(gpu: GpuDevice) -> dict[str, Any]:
    """What one card offers the partitions that share it."""
    counters = {memory_counter(i): {"value": "1"} for i in range(MEMORY_SLICES)}
    counters[COMPUTE_COUNTER] = {"value": str(COMPUTE_SLICES)}
    counters[MEDIA_COUNTER] = {"value": "1"}
    return {"name": counter_set_name(gpu), "counters": counters}


def _attributes(
    base: Mapping[str, dict[str, Any]],
    gpu: GpuDevice,
    naming: DraNaming,
    profile: str,
    uuid: str | None,
) -> dict[str, dict[str, Any]]:
    """The card's attributes, less what is the card's own (its UUID, its NVLink peers), plus
    what makes this a MIG device: type, profile, parent UUID, and its own UUID when it
    exists (a dynamic placement has none until prepared)."""
    attributes = {
        key: value
        for key, value in base.items()
        if key != "uuid" and "nvlink" not in key and key != "type"
    }
    attributes["type"] = {"string": "mig"}
    attributes["profile"] = {"string": profile}
    attributes["parentUUID"] = {"string": gpu.uuid}
    if uuid is not None:
        attributes["uuid"] = {"string": uuid}
    if naming.key != NVIDIA_NAMING.key and "index" not in attributes:
        attributes["index"] = {"int": gpu.index}
    return attributes


def _capacity(profile: MigProfile | MigDevice, memory_slices: range | None) -> dict[str, Any]:
    capacity: dict[str, Any] = {
        "memory": {"value": f"{_memory_mib(profile)}Mi"},
        "multiprocessors": {"value": str(profile.multiprocessors)},
        "copyEngines": {"value": str(profile.copy_engines)},
        "decoders": {"value": str(profile.decoders)},
        "jpegEngines": {"value": str(profile.jpeg_engines)},
        "ofaEngines": {"value": str(profile.ofa_engines)},
    }
    for i in memory_slices or ():
        capacity[f"memorySlice{i}"] = {"value": "1"}
    return capacity


def _memory_mib(item: MigProfile | MigDevice) -> int:
    return item.memory_mib if isinstance(item, MigProfile) else item.memory_total_mib


def static_entries(
    gpu: GpuDevice, naming: DraNaming, base: Mapping[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """One device per GPU instance the card holds (taints are the caller's)."""
    return [
        {
            "name": mig_device_name(gpu.index, mig.profile, mig.profile_id, mig.start),
            "attributes": _attributes(base, gpu, naming, mig.profile, mig.uuid),
            "capacity": _capacity(mig, range(mig.start, mig.start + mig.memory_slices)),
        }
        for mig in gpu.mig_devices
    ]


def partition_entries(
    gpu: GpuDevice, naming: DraNaming, base: Mapping[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """One device per placement of every profile of the card, each consuming from the card's
    counter set; empty for a card without a profile table here."""
    try:
        profiles = profiles_of(gpu.product_name)
    except MigError:
        return []
    entries = []
    for profile in profiles:
        for start in profile.placements:
            counters = {
                memory_counter(i): {"value": "1"}
                for i in range(start, start + profile.memory_slices)
            }
            counters[COMPUTE_COUNTER] = {"value": str(profile.compute_slices)}
            if profile.name.endswith("+me"):
                counters[MEDIA_COUNTER] = {"value": "1"}
            entries.append(
                {
                    "name": mig_device_name(gpu.index, profile.name, profile.profile_id, start),
                    "attributes": _attributes(base, gpu, naming, profile.name, None),
                    "capacity": _capacity(profile, None),
                    "consumesCounters": [
                        {"counterSet": counter_set_name(gpu), "counters": counters}
                    ],
                }
            )
    return entries
