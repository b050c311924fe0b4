"""GFD's MIG labels, as NVIDIA's gpu-feature-discovery writes them for ``--mig-strategy``
``single`` and ``mixed`` (``internal/lm/mig-strategy.go`` and ``resource.go`` of
NVIDIA/k8s-device-plugin at commit 1b826acc6af3079d8923bac395c3124b8861a9a6).

* ``nvidia.com/mig.strategy`` names the strategy (nothing under ``none``).
* The cards' own labels (``nvidia.com/gpu.product``, ``gpu.count``, ``gpu.memory``, ...) stay;
  on a node whose cards are all in MIG mode GFD writes them without sharing: ``gpu.replicas``
  ``0``, ``gpu.sharing-strategy`` ``none``, the product without ``-SHARED``.
* ``mixed``: per profile ``P`` (``+`` written ``.``), under the resource's name
  ``nvidia.com/mig-P``: ``.count`` (MIG devices of the profile on the node), ``.replicas``,
  ``.sharing-strategy``, ``.product`` (``<model>-MIG-P``), and the device's attributes
  ``.memory`` (MiB), ``.multiprocessors``, ``.slices.gi``, ``.slices.ci``, ``.engines.copy``,
  ``.engines.decoder``, ``.engines.encoder``, ``.engines.jpeg``, ``.engines.ofa``.
* ``single``: the same under ``nvidia.com/gpu.`` when every card is in MIG mode with MIG devices
  of one profile; otherwise GFD's invalid labels: ``gpu.product=<model>-MIG-INVALID``,
  ``gpu.count=0``, ``gpu.replicas=0``, ``gpu.sharing-strategy`` empty, ``gpu.memory=0``. With no
  card in MIG mode, nothing beyond ``mig.strategy``.

Where a profile's MIG devices differ (two card models), the first card's device speaks for
them, as GFD's first one does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from kubegpu.core.gpu import GpuDevice, MigDevice
from kubegpu.core.mig import resource_suffix

STRATEGY = "nvidia.com/mig.strategy"
WHOLE_RESOURCE = "nvidia.com/gpu"
# What GFD writes per resource: its base labels, then the MIG device's attributes.
BASE_SUFFIXES = ("count", "replicas", "sharing-strategy", "product")
ATTRIBUTE_SUFFIXES = (
    "memory",
    "multiprocessors",
    "slices.gi",
    "slices.ci",
    "engines.copy",
    "engines.decoder",
    "engines.encoder",
    "engines.jpeg",
    "engines.ofa",
)
# The nvidia.com/gpu.* keys only the MIG labels write (single): the labeller owns them too.
SINGLE_KEYS: frozenset[str] = frozenset(
    f"{WHOLE_RESOURCE}.{s}" for s in ATTRIBUTE_SUFFIXES if s != "memory"
)
_MIXED_KEY = re.compile(
    r"^nvidia\.com/mig-[A-Za-z0-9.]+\.("
    + "|".join(re.escape(s) for s in (*BASE_SUFFIXES, *ATTRIBUTE_SUFFIXES))
    + ")$"
)
INVALID_REASONS = (
    "at least one MIG device is enabled but empty",
    "devices with MIG enabled and disable detected",
    "more than one MIG device type present on node",
)


def is_mig_key(key: str) -> bool:
    """Whether ``key`` is a MIG label GFD (and so the labeller) writes."""
    return key == STRATEGY or key in SINGLE_KEYS or _MIXED_KEY.match(key) is not None


def _attributes(mig: MigDevice) -> dict[str, int]:
    """NVML's device attributes as GFD labels them (``nvml-mig-device.go GetAttributes``)."""
    return {
        "memory": mig.memory_total_mib,
        "multiprocessors": mig.multiprocessors,
        # NVIDIA's plugin serves only compute instances spanning their GPU instance.
        "slices.gi": mig.compute_slices,
        "slices.ci": mig.compute_slices,
        "engines.copy": mig.copy_engines,
        "engines.decoder": mig.decoders,
        "engines.encoder": mig.encoders,
        "engines.jpeg": mig.jpeg_engines,
        "engines.ofa": mig.ofa_engines,
    }


def single_invalid_reason(gpus: Sequence[GpuDevice]) -> str:
    """Why GFD labels a node invalid under ``single`` ("" when it is not), in its words."""
    in_mig = [g for g in gpus if g.mig_enabled]
    if not in_mig:
        return ""
    if any(not g.mig_devices for g in in_mig):
        return INVALID_REASONS[0]
    if len(in_mig) < len(gpus):
        return INVALID_REASONS[1]
    if len({m.profile for g in in_mig for m in g.mig_devices}) > 1:
        return INVALID_REASONS[2]
    return ""


def mig_labels(
    gpus: Sequence[GpuDevice],
    strategy: str,
    replicated: Mapping[str, tuple[int, bool]],
    product: Callable[[Sequence[str]], str],
) -> dict[str, str]:
    """The MIG labels of a node under ``strategy``, to lay over the cards' own labels.

    ``replicated``: time-sliced resources, name -> (replicas, renamed); ``product`` joins
    sanitised name parts as GFD's product labels do."""
    if strategy == "none":
        return {}
    labels = {STRATEGY: strategy}
    in_mig = [g for g in gpus if g.mig_enabled]
    if in_mig and len(in_mig) == len(gpus):
        # GFD labels MIG-enabled cards "without sharing" (its sharing-disabled resource).
        labels[f"{WHOLE_RESOURCE}.replicas"] = "0"
        labels[f"{WHOLE_RESOURCE}.sharing-strategy"] = "none"
        if len({g.product_name for g in gpus}) == 1:
            labels[f"{WHOLE_RESOURCE}.product"] = product([gpus[0].product_name])
    if strategy == "single":
        if not in_mig:
            return labels
        if single_invalid_reason(gpus):
            labels.update(
                {
                    f"{WHOLE_RESOURCE}.product": product(
                        [in_mig[0].product_name, "MIG", "INVALID"]
                    ),
                    f"{WHOLE_RESOURCE}.count": "0",
                    f"{WHOLE_RESOURCE}.replicas": "0",
                    f"{WHOLE_RESOURCE}.sharing-strategy": "",
                    f"{WHOLE_RESOURCE}.memory": "0",
                }
            )
            return labels
    by_profile: dict[str, list[tuple[GpuDevice, MigDevice]]] = {}
    for gpu in in_mig:
        for mig in gpu.mig_devices:
            by_profile.setdefault(mig.profile, []).append((gpu, mig))
    for name, devices in by_profile.items():
        resource = WHOLE_RESOURCE if strategy == "single" else f"nvidia.com/{resource_suffix(name)}"
        replicas, renamed = replicated.get(resource, (1, False))
        shared = replicas > 1
        parent, first = devices[0]
        parts = [parent.product_name, "MIG", name.replace("+", ".")]
        if shared and not renamed:
            parts.append("SHARED")
        values: dict[str, object] = {
            "count": len(devices),
            "replicas": replicas,
            "sharing-strategy": "time-slicing" if shared else "none",
            "product": product(parts),
            **_attributes(first),
        }
        labels.update({f"{resource}.{suffix}": str(v) for suffix, v in values.items()})
    return labels
