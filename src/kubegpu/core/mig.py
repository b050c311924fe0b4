"""Multi-Instance GPU: the profiles each MIG-capable card offers, and which sets of GPU
instances fit on one card together.

A MIG card (A100, H100, H200) has 7 compute slices and 8 memory slices. A GPU instance of a
profile takes a fixed number of each, starting at one of the profile's allowed memory slices
(its *placements*); instances on one card never share a memory slice, use at most the 7 compute
slices between them, and a profile has a maximum count per card (one "+me" instance, with the
media engines). Pure values, for the fake backend, the device plugin's MIG strategies, the DRA
driver's partitionable devices and the extender alike.

Sources (issue 30, /work/notes/issue30-research.md has the captures):

* NVIDIA's MIG user guide, "Supported MIG Profiles"
  (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): slices,
  fractions, instance counts and names per card; "A100-SXM4-80GB ... 1g.10gb, 1g.10gb+me,
  1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb".
* ``nvidia-smi mig -lgip`` / ``-lgipp`` captures: memory, multiprocessors, engines, placements
  (identical placements on all four cards: 1g at 0..6, the two-slice 1g at 0,2,4,6, 2g at 0,2,4,
  3g at 0 and 4 with four memory slices, 4g at 0, 7g at 0 with all eight).
* NVML: ``profile_id`` is what ``nvmlGpuInstanceProfileInfo_t.id`` and ``nvidia-smi`` report
  (and what NVIDIA's DRA driver puts in device names); ``nvml_profile`` is the
  ``NVML_GPU_INSTANCE_PROFILE_*`` index passed to ``nvmlDeviceGetGpuInstanceProfileInfo``.

Memory is MiB as NVML reports it for the instance. The H200's 7g memory is not in the capture
at hand and is derived (two 4-slice instances' worth); every other figure is from a capture.
"""

from __future__ import annotations

import uuid as uuidlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kubegpu.core.gpu import GpuDevice, MigDevice, mig_cap_minors

COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of one card model."""

    name: str  # "1g.10gb", "1g.10gb+me"
    profile_id: int  # nvidia-smi's / NVML's profile id (19, 20, 15, 14, 9, 5, 0)
    nvml_profile: int  # NVML_GPU_INSTANCE_PROFILE_* index (0, 7, 9, 1, 2, 3, 4)
    compute_slices: int
    memory_slices: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    jpeg_engines: int
    ofa_engines: int
    max_instances: int
    placements: tuple[int, ...]  # memory slices an instance may start at

    @property
    def resource_suffix(self) -> str:
        """The profile as NVIDIA's device plugin names its resource under the mixed strategy:
        ``mig-1g.10gb``, ``mig-1g.10gb.me`` (``+`` is not allowed in a resource name)."""
        return resource_suffix(self.name)


def resource_suffix(profile_name: str) -> str:
    """``1g.10gb+me`` -> ``mig-1g.10gb.me``: a profile as NVIDIA's device plugin and GFD name
    it in resource names and labels under the mixed strategy."""
    return "mig-" + profile_name.replace("+", ".")


def whole_instance(mig: MigDevice) -> bool:
    """Whether the MIG device's compute instance spans its whole GPU instance (``3g.40gb``),
    not a part of it (``1c.3g.40gb``): NVIDIA's plugin has resources for these only."""
    return not mig.profile.split(".", 1)[0].endswith("c")


@dataclass(frozen=True)
class Instance:
    """A GPU instance placed on a card: its profile and its first memory slice."""

    profile: MigProfile
    start: int

    @property
    def memory_range(self) -> range:
        return range(self.start, self.start + self.profile.memory_slices)


def _profiles(
    sizes: tuple[str, str, str, str, str, str, str],
    memory_mib: tuple[int, int, int, int, int, int, int],
    multiprocessors: tuple[int, int, int, int, int, int, int],
    copy: tuple[int, int, int, int, int, int, int],
    decoders: tuple[int, int, int, int, int, int, int],
    jpeg: tuple[int, int, int, int, int, int, int],
    ofa: tuple[int, int, int, int, int, int, int],
) -> tuple[MigProfile, ...]:
    """The seven profiles every card here offers, in nvidia-smi's order: 1g, 1g+me, the
    two-memory-slice 1g, 2g, 3g, 4g, 7g; ``sizes`` are the names' memory parts."""
    shape = (
        # prefix, profile id, NVML index, compute, memory slices, max, placements
        ("1g", 19, 0, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
        ("1g", 20, 7, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        ("1g", 15, 9, 1, 2, 4, (0, 2, 4, 6)),
        ("2g", 14, 1, 2, 2, 3, (0, 2, 4)),
        ("3g", 9, 2, 3, 4, 2, (0, 4)),
        ("4g", 5, 3, 4, 4, 1, (0,)),
        ("7g", 0, 4, 7, 8, 1, (0,)),
    )
    out = []
    for k, (prefix, pid, index, compute, memory, most, starts) in enumerate(shape):
        name = f"{prefix}.{sizes[k]}" + ("+me" if pid == 20 else "")
        out.append(
            MigProfile(
                name,
                pid,
                index,
                compute,
                memory,
                memory_mib[k],
                multiprocessors[k],
                copy[k],
                decoders[k],
                jpeg[k],
                ofa[k],
                most,
                starts,
            )
        )
    return tuple(out)


_AMPERE_SMS = (14, 14, 14, 28, 42, 56, 98)
_HOPPER_SMS = (16, 16, 26, 32, 60, 64, 132)
_HOPPER_ENGINES = (1, 1, 1, 2, 3, 4, 7)

# Card model (NVML's name) -> its profiles.
MIG_PROFILES: Mapping[str, tuple[MigProfile, ...]] = {
    "NVIDIA A100-SXM4-40GB": _profiles(
        ("5gb", "5gb", "10gb", "10gb", "20gb", "20gb", "40gb"),
        (4864, 4864, 9856, 9856, 19968, 19968, 40192),
        _AMPERE_SMS,
        (1, 1, 1, 2, 3, 4, 7),
        (0, 1, 1, 1, 2, 2, 5),
        (0, 1, 0, 0, 0, 0, 1),
        (0, 1, 0, 0, 0, 0, 1),
    ),
    "NVIDIA A100-SXM4-80GB": _profiles(
        ("10gb", "10gb", "20gb", "20gb", "40gb", "40gb", "80gb"),
        (9856, 9856, 19968, 19968, 40192, 40192, 80384),
        _AMPERE_SMS,
        (1, 1, 1, 2, 3, 4, 7),
        (1, 1, 1, 1, 2, 2, 5),
        (0, 1, 0, 0, 0, 0, 1),
        (0, 1, 0, 0, 0, 0, 1),
    ),
    "NVIDIA H100 80GB HBM3": _profiles(
        ("10gb", "10gb", "20gb", "20gb", "40gb", "40gb", "80gb"),
        (9984, 9984, 20096, 20096, 40448, 40448, 81152),
        _HOPPER_SMS,
        (1, 1, 1, 2, 3, 4, 8),
        _HOPPER_ENGINES,
        _HOPPER_ENGINES,
        (0, 1, 0, 0, 0, 0, 1),
    ),
    "NVIDIA H200 141GB HBM3e": _profiles(
        ("18gb", "18gb", "35gb", "35gb", "71gb", "71gb", "141gb"),
        (16384, 16384, 33024, 33024, 71168, 71168, 142336),
        _HOPPER_SMS,
        (1, 1, 1, 2, 3, 4, 8),
        _HOPPER_ENGINES,
        _HOPPER_ENGINES,
        (0, 1, 0, 0, 0, 0, 1),
    ),
}
# The PCIe boards of the same chips and memory offer the same profiles.
MIG_PROFILES = {
    **MIG_PROFILES,
    "NVIDIA A100-PCIE-40GB": MIG_PROFILES["NVIDIA A100-SXM4-40GB"],
    "NVIDIA A100 80GB PCIe": MIG_PROFILES["NVIDIA A100-SXM4-80GB"],
}


class MigError(ValueError):
    """A profile or a placement the card does not offer; the message names it."""


def profiles_of(model: str) -> tuple[MigProfile, ...]:
    """The card model's profiles; :class:`MigError` for a card without MIG here."""
    try:
        return MIG_PROFILES[model]
    except KeyError:
        raise MigError(
            f"{model!r} has no MIG profiles here (known: {', '.join(sorted(MIG_PROFILES))})"
        ) from None


def profile(model: str, name: str) -> MigProfile:
    """The card model's profile called ``name`` (``1g.10gb``, ``3g.40gb``, ``1g.10gb+me``)."""
    for p in profiles_of(model):
        if p.name == name:
            return p
    offered = ", ".join(p.name for p in profiles_of(model))
    raise MigError(f"{model!r} has no MIG profile {name!r} (it offers {offered})")


def layout_problem(instances: Iterable[Instance]) -> str:
    """Why these GPU instances cannot be on one card together ("" when they can)."""
    placed = list(instances)
    used: set[int] = set()
    for instance in placed:
        p = instance.profile
        if instance.start not in p.placements:
            starts = ", ".join(str(s) for s in p.placements)
            return f"{p.name} cannot start at memory slice {instance.start} (only at {starts})"
        overlap = used.intersection(instance.memory_range)
        if overlap:
            return f"{p.name} at {instance.start} overlaps memory slice {min(overlap)}"
        used.update(instance.memory_range)
    counts = Counter(i.profile for i in placed)
    for p, count in counts.items():
        if count > p.max_instances:
            return f"{count} instances of {p.name}, at most {p.max_instances} per card"
    compute = sum(i.profile.compute_slices for i in placed)
    if compute > COMPUTE_SLICES:
        return f"{compute} compute slices, a card has {COMPUTE_SLICES}"
    return ""


def free_placements(profiles: Iterable[MigProfile], placed: Iterable[Instance]) -> list[Instance]:
    """Every instance of ``profiles`` that could be added to the card beside ``placed``, in
    profile then slice order."""
    existing = list(placed)
    return [
        Instance(p, start)
        for p in profiles
        for start in p.placements
        if not layout_problem([*existing, Instance(p, start)])
    ]


def fake_mig_uuid(parent: str, gpu_instance_id: int, generation: int) -> str:
    """A stable ``MIG-…`` UUID for a fake instance: the same parent, GPU instance and
    generation give the same UUID, so a spec's instances keep theirs across restarts while an
    instance created again in the same place gets a new one, as on a real card."""
    name = f"{parent}/gi{gpu_instance_id}/gen{generation}"
    return "MIG-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, "kubegpu-fake-mig:" + name))


def mig_device(
    parent: GpuDevice,
    instance: Instance,
    *,
    index: int,
    gpu_instance_id: int,
    uuid: str,
    compute_instance_id: int = 0,
) -> MigDevice:
    """The MIG device NVML would report for ``instance`` on ``parent``: one compute instance
    spanning the whole GPU instance, as NVIDIA's tools create by default."""
    p = instance.profile
    gi_minor, ci_minor = mig_cap_minors(parent.minor_number, gpu_instance_id, compute_instance_id)
    return MigDevice(
        uuid=uuid,
        parent_uuid=parent.uuid,
        parent_index=parent.index,
        parent_minor=parent.minor_number,
        index=index,
        gpu_instance_id=gpu_instance_id,
        compute_instance_id=compute_instance_id,
        profile=p.name,
        profile_id=p.profile_id,
        start=instance.start,
        memory_slices=p.memory_slices,
        compute_slices=p.compute_slices,
        memory_total_mib=p.memory_mib,
        multiprocessors=p.multiprocessors,
        copy_engines=p.copy_engines,
        decoders=p.decoders,
        encoders=0,
        jpeg_engines=p.jpeg_engines,
        ofa_engines=p.ofa_engines,
        gi_cap_minor=gi_minor,
        ci_cap_minor=ci_minor,
    )
