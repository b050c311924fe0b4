"""Which node labels describe a node's GPUs: a pure function from the inventory to a label dict.

Names follow NVIDIA GPU Feature Discovery (GFD) where the concept is the same, so node selectors
written for GFD keep working; facts GFD has no label for live under our own ``kubegpu.io/``
prefix. Nothing here does I/O: the sinks in :mod:`kubegpu.labels.sinks` write the result.

Mixed GPU models on one node (the rule, documented because GFD gets it wrong, gpu-feature-discovery
#66, where the surviving ``gpu.product`` depends on map order):

* per-GPU facts (``nvidia.com/gpu.product``, ``gpu.memory``, ``gpu.family``,
  ``gpu.compute.major``/``minor``) are written **only when every GPU on the node agrees**; a
  fact the GPUs disagree on is left out rather than picked from one of them;
* ``nvidia.com/gpu.count`` is always the number of GPUs on the node (all models);
* ``kubegpu.io/gpu.product.<model>=<count>`` is written once per model (model sanitised into a
  label-key name), so a selector can ask for "a node with T4s" on a mixed node;
* ``kubegpu.io/gpu.nvlink=true`` is present only when at least one GPU pair is joined by NVLink;
* ``kubegpu.io/gpu.mixed`` says whether the node has more than one model, and
  ``kubegpu.io/gpu.memory-min`` (MiB, smallest GPU) lets node affinity use ``Gt`` on memory on
  any node.

Every value is a valid Kubernetes label value (at most 63 characters of ``[A-Za-z0-9._-]``,
starting and ending alphanumeric); :func:`sanitise_label_value` enforces it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from kubegpu.config.model import DEFAULT_RESOURCE, AgentConfig
from kubegpu.core.gpu import GpuDevice, GpuUuid, NodeInventory
from kubegpu.core.names import LABEL_VALUE_MAX, sanitise_label_value
from kubegpu.labels.mig import is_mig_key, mig_labels

_T = TypeVar("_T")

GFD_PREFIX = "nvidia.com/"
OUR_PREFIX = "kubegpu.io/"

# The GFD label names we write. Only these keys under nvidia.com/ are ours to change or remove;
# every other nvidia.com/ label (GFD's own, the GPU operator's) is left alone.
PRODUCT = "nvidia.com/gpu.product"
MEMORY = "nvidia.com/gpu.memory"
COUNT = "nvidia.com/gpu.count"
REPLICAS = "nvidia.com/gpu.replicas"
SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"
FAMILY = "nvidia.com/gpu.family"
COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
MIG_CAPABLE = "nvidia.com/mig.capable"
DRIVER_MAJOR = "nvidia.com/cuda.driver-version.major"
DRIVER_MINOR = "nvidia.com/cuda.driver-version.minor"
DRIVER_REVISION = "nvidia.com/cuda.driver-version.revision"
DRIVER_FULL = "nvidia.com/cuda.driver-version.full"
# GFD still writes the deprecated short names; selectors in the wild use both.
DRIVER_MAJOR_OLD = "nvidia.com/cuda.driver.major"
DRIVER_MINOR_OLD = "nvidia.com/cuda.driver.minor"
DRIVER_REV_OLD = "nvidia.com/cuda.driver.rev"
RUNTIME_MAJOR = "nvidia.com/cuda.runtime-version.major"
RUNTIME_MINOR = "nvidia.com/cuda.runtime-version.minor"
RUNTIME_FULL = "nvidia.com/cuda.runtime-version.full"
RUNTIME_MAJOR_OLD = "nvidia.com/cuda.runtime.major"
RUNTIME_MINOR_OLD = "nvidia.com/cuda.runtime.minor"
# What GFD reads from the machine rather than from NVML (see :class:`HostFacts`), and whether
# the node's sharing is MPS that can run (GFD's sharing labeller).
MACHINE = "nvidia.com/gpu.machine"
GPU_MODE = "nvidia.com/gpu.mode"
MPS_CAPABLE = "nvidia.com/mps.capable"
# GFD's name, with one difference (see :mod:`kubegpu.labels.labeller`): GFD stamps every run,
# we stamp the last time another label changed, so a node whose facts stand still is not
# rewritten every interval.
TIMESTAMP = "nvidia.com/gfd.timestamp"

GFD_KEYS_WE_WRITE: frozenset[str] = frozenset(
    {
        PRODUCT,
        MEMORY,
        COUNT,
        REPLICAS,
        SHARING_STRATEGY,
        FAMILY,
        COMPUTE_MAJOR,
        COMPUTE_MINOR,
        MIG_CAPABLE,
        DRIVER_MAJOR,
        DRIVER_MINOR,
        DRIVER_REVISION,
        DRIVER_FULL,
        DRIVER_MAJOR_OLD,
        DRIVER_MINOR_OLD,
        DRIVER_REV_OLD,
        RUNTIME_MAJOR,
        RUNTIME_MINOR,
        RUNTIME_FULL,
        RUNTIME_MAJOR_OLD,
        RUNTIME_MINOR_OLD,
        MACHINE,
        GPU_MODE,
        MPS_CAPABLE,
        TIMESTAMP,
    }
)

# Our own labels (GFD has no equivalent). Only these keys (and the per-model prefix below) are
# ours under kubegpu.io/: admins set others there themselves (docs/install.md has them label
# nodes kubegpu.io/device-plugin=nvidia|none|kubegpu), and those must survive every refresh.
NVLINK = "kubegpu.io/gpu.nvlink"
HEALTHY_COUNT = "kubegpu.io/gpu.healthy-count"
MIXED = "kubegpu.io/gpu.mixed"
MEMORY_MIN = "kubegpu.io/gpu.memory-min"
PRODUCT_COUNT_PREFIX = "kubegpu.io/gpu.product."
# kubegpu's own card-level sharing (sharing.gpuShare), which GFD cannot describe: on or off,
# and when on how it is enforced and how many pods may share a card.
GPU_SHARE = "kubegpu.io/gpu-share"
GPU_SHARE_ENFORCEMENT = "kubegpu.io/gpu-share.enforcement"
GPU_SHARE_SLOTS = "kubegpu.io/gpu-share.slots"
# Written by earlier releases and no longer: still ours, so an upgrade removes them.
RETIRED_KEYS: frozenset[str] = frozenset({"kubegpu.io/labels.timestamp"})

OUR_KEYS: frozenset[str] = frozenset(
    {
        *RETIRED_KEYS,
        NVLINK,
        HEALTHY_COUNT,
        MIXED,
        MEMORY_MIN,
        GPU_SHARE,
        GPU_SHARE_ENFORCEMENT,
        GPU_SHARE_SLOTS,
    }
)

_MAX_NAME = LABEL_VALUE_MAX  # both a label value and the name part of a label key


def owns_label(key: str) -> bool:
    """Whether a label key is one this labeller can produce (and may therefore remove).

    Exactly the keys :func:`compute_labels` can write: a label under ``kubegpu.io/`` that is
    none of them belongs to whoever set it (an admin, another kubegpu component) and is never
    changed or removed by the labeller; nor is one under ``nvidia.com/mig.`` that is not GFD's
    (the GPU operator's ``nvidia.com/mig.config``)."""
    return (
        key in GFD_KEYS_WE_WRITE
        or key in OUR_KEYS
        or key.startswith(PRODUCT_COUNT_PREFIX)
        or is_mig_key(key)
    )


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_KEY_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def is_valid_label_value(value: str) -> bool:
    return len(value) <= _MAX_NAME and _LABEL_VALUE.match(value) is not None


def is_valid_label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return (
        len(prefix) <= 253
        and len(name) <= _MAX_NAME
        and _KEY_NAME.match(name) is not None
        and (not prefix or re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", prefix) is not None)
    )


@dataclass(frozen=True)
class GpuShareSummary:
    """kubegpu's card-level sharing (``sharing.gpuShare``) as the labels report it."""

    enforcement: str = "none"  # "none" (CUDA time-slices the pods) or "mps"
    slots_per_card: int = 1


@dataclass(frozen=True)
class SharingSummary:
    """The node's sharing configuration: GFD's strategy and replicas per GPU, and kubegpu's
    own card-level sharing when it is on (``gpu_share``)."""

    strategy: str = "none"  # GFD's values: "none", "time-slicing", "mps"
    replicas: int = 1
    gpu_share: GpuShareSummary | None = None
    # The replicas are not advertised as nvidia.com/gpu (``rename``, ``renameByDefault``, or
    # another resource is the one time-sliced): GFD then leaves ``gpu.product`` alone;
    # otherwise more than one replica makes it ``<product>-SHARED``.
    renamed: bool = False
    # The device plugin's flags.migStrategy: GFD's MIG labels (kubegpu.labels.mig) under
    # "single" and "mixed".
    mig_strategy: str = "none"
    # Every time-sliced resource: name -> (replicas, renamed), for the MIG resources' labels.
    replicated: Mapping[str, tuple[int, bool]] = field(default_factory=dict)


# sysfs's ``class`` of a GPU that drives displays (VGA controller) and of one that does not (3D
# controller), programming interface included: GFD's ``gpu.mode`` ``graphics`` and ``compute``.
PCI_CLASS_VGA = 0x030000
PCI_CLASS_3D = 0x030200


@dataclass(frozen=True)
class HostFacts:
    """What GFD reads from the machine rather than from NVML: the machine type (the DMI product
    name, raw) and each GPU's PCI class by its NVML bus id (``GpuDevice.pci_bus_id``). The
    defaults are what GFD writes when it cannot read them: machine ``unknown``, and with a
    class missing, mode ``unknown``."""

    machine_type: str = "unknown"
    pci_classes: Mapping[str, int] = field(default_factory=dict)


def gpu_family(compute_capability: tuple[int, int] | None) -> str:
    """GFD's architecture name for a compute capability (same table as GFD)."""
    if compute_capability is None:
        return "undefined"
    major, minor = compute_capability
    if major == 7:
        return "turing" if minor >= 5 else "volta"
    if major == 8:
        return "ada-lovelace" if minor == 9 else "ampere"
    return {
        1: "tesla",
        2: "fermi",
        3: "kepler",
        5: "maxwell",
        6: "pascal",
        9: "hopper",
        10: "blackwell",
        12: "blackwell",
        13: "rubin",
    }.get(major, "undefined")


def gpu_mode(classes: list[int | None]) -> str:
    """GFD's ``nvidia.com/gpu.mode``: ``compute`` when every GPU is a 3D controller,
    ``graphics`` when every one is a VGA controller, ``unknown`` otherwise (mixed classes, a
    class that could not be read, or another class)."""
    distinct = set(classes)
    if distinct == {PCI_CLASS_3D}:
        return "compute"
    if distinct == {PCI_CLASS_VGA}:
        return "graphics"
    return "unknown"


_GFD_DROPPED = re.compile(r"[^A-Za-z0-9_. -]")


def gfd_sanitise(raw: str) -> str:
    """A product or machine name as GFD spells it: characters outside ``[A-Za-z0-9-_. ]``
    dropped, each run of spaces one ``-`` (``NVIDIA H100 80GB HBM3`` ->
    ``NVIDIA-H100-80GB-HBM3``); then made a valid label value, which GFD does not check (a
    name it leaves too long or ending in ``.`` fails its Node update)."""
    return sanitise_label_value("-".join(_GFD_DROPPED.sub("", raw).split()))


_SHARED_SUFFIX = "-SHARED"


def _gfd_product(name: str, sharing: SharingSummary) -> str:
    product = gfd_sanitise(name)
    if product and sharing.replicas > 1 and not sharing.renamed:
        # GFD's mark of a replicated nvidia.com/gpu (time-slicing or MPS), so that a selector
        # for the plain product does not land on a node whose GPUs are shared. Cut first: the
        # suffix must survive.
        product = sanitise_label_value(product[: _MAX_NAME - len(_SHARED_SUFFIX)] + _SHARED_SUFFIX)
    return product


def _uniform(values: list[_T]) -> _T | None:
    """The single value every GPU shares, or ``None`` when they disagree (or none known)."""
    distinct = set(values)
    return values[0] if len(distinct) == 1 else None


def _version_labels(inventory: NodeInventory) -> dict[str, str]:
    labels: dict[str, str] = {}
    revision: str | None = None
    if inventory.driver_version:
        parts = inventory.driver_version.strip().split(".")
        labels[DRIVER_FULL] = sanitise_label_value(inventory.driver_version)
        names = ((DRIVER_MAJOR, DRIVER_MAJOR_OLD), (DRIVER_MINOR, DRIVER_MINOR_OLD))
        for (new, old), part in zip(names, parts, strict=False):
            labels[new] = labels[old] = sanitise_label_value(part)
        # GFD writes the revision of a two-part version ("535.54") too, empty.
        revision = sanitise_label_value(parts[2]) if len(parts) >= 3 else ""
    if inventory.cuda_driver_version:
        parts = inventory.cuda_driver_version.strip().split(".")
        labels[RUNTIME_FULL] = sanitise_label_value(inventory.cuda_driver_version)
        names = ((RUNTIME_MAJOR, RUNTIME_MAJOR_OLD), (RUNTIME_MINOR, RUNTIME_MINOR_OLD))
        for (new, old), part in zip(names, parts, strict=False):
            labels[new] = labels[old] = sanitise_label_value(part)
    labels = {k: v for k, v in labels.items() if v}
    if revision is not None:
        labels[DRIVER_REVISION] = labels[DRIVER_REV_OLD] = revision
    return labels


def _product_count_key(product: str) -> str:
    # The key's name part obeys the same 63-character rule as a value.
    name = sanitise_label_value(PRODUCT_COUNT_PREFIX.removeprefix(OUR_PREFIX) + product)
    return OUR_PREFIX + name


def _has_nvlink(inventory: NodeInventory) -> bool:
    return any(link.nvlinks > 0 for link in inventory.links.values())


def _is_mig_capable(gpu: GpuDevice) -> bool:
    # NVML answers the MIG-mode query only on MIG-capable GPUs; the backends map
    # NotSupported to None, so "has a MIG mode" is "MIG capable".
    return gpu.mig_enabled is not None


def compute_labels(
    inventory: NodeInventory,
    *,
    health: Mapping[GpuUuid, bool] | None = None,
    sharing: SharingSummary | None = None,
    host: HostFacts | None = None,
    now: float | None = None,
) -> dict[str, str]:
    """The full label set for a node. ``health`` maps UUID to healthy (a GPU absent from the
    map counts as healthy); ``host`` is what was read from the machine (GFD's ``unknown``
    values without it); ``now`` (Unix seconds) adds the timestamp label when given (the
    labeller passes the time the other labels last changed)."""
    health = health or {}
    sharing = sharing or SharingSummary()
    host = host or HostFacts()
    gpus = list(inventory.gpus)
    labels: dict[str, str] = {COUNT: str(len(gpus))}
    labels[HEALTHY_COUNT] = str(sum(1 for g in gpus if health.get(g.uuid, True)))
    labels.update(_version_labels(inventory))
    if not gpus:
        return _with_timestamp(labels, now)

    products = [sanitise_label_value(g.product_name) for g in gpus]
    if _uniform(products):
        labels[PRODUCT] = _gfd_product(gpus[0].product_name, sharing)
    memory = _uniform([g.memory_total_mib for g in gpus])
    if memory is not None:
        labels[MEMORY] = str(memory)
    labels[MEMORY_MIN] = str(min(g.memory_total_mib for g in gpus))
    capability = _uniform([g.compute_capability for g in gpus])
    if capability is not None:
        labels[COMPUTE_MAJOR] = str(capability[0])
        labels[COMPUTE_MINOR] = str(capability[1])
    if all(g.compute_capability is not None for g in gpus):
        # GFD's "undefined" included (a capability its table does not name): GFD writes the
        # family whenever NVML reports a capability.
        family = _uniform([gpu_family(g.compute_capability) for g in gpus])
        if family is not None:
            labels[FAMILY] = family
    labels[MIG_CAPABLE] = _bool(any(_is_mig_capable(g) for g in gpus))
    # GFD: MPS is possible where the sharing strategy is MPS and no GPU is in MIG mode (MPS
    # does not run on MIG devices; GFD then fails to label at all, we say false).
    labels[MPS_CAPABLE] = _bool(sharing.strategy == "mps" and not any(g.mig_enabled for g in gpus))
    labels[MACHINE] = gfd_sanitise(host.machine_type)
    labels[GPU_MODE] = gpu_mode([host.pci_classes.get(g.pci_bus_id) for g in gpus])
    labels[SHARING_STRATEGY] = sanitise_label_value(sharing.strategy) or "none"
    labels[REPLICAS] = str(sharing.replicas)
    labels[GPU_SHARE] = _bool(sharing.gpu_share is not None)
    if sharing.gpu_share is not None:
        labels[GPU_SHARE_ENFORCEMENT] = sanitise_label_value(sharing.gpu_share.enforcement)
        labels[GPU_SHARE_SLOTS] = str(sharing.gpu_share.slots_per_card)
    if _has_nvlink(inventory):
        # Only when true, like a capability: "Exists" and "=true" selectors both work, and the
        # label is removed when NVLink is gone (or topology could not be read).
        labels[NVLINK] = "true"
    counts = Counter(products)
    labels[MIXED] = _bool(len(counts) > 1)
    for name, count in sorted(counts.items()):
        if name:
            labels[_product_count_key(name)] = str(count)
    labels.update(mig_labels(gpus, sharing.mig_strategy, sharing.replicated, _gfd_join))
    return _with_timestamp(labels, now)


def _gfd_join(parts: Sequence[str]) -> str:
    """GFD's product label from name parts: each sanitised, joined with ``-``."""
    return sanitise_label_value("-".join(p for p in (gfd_sanitise(x) for x in parts) if p))


def _with_timestamp(labels: dict[str, str], now: float | None) -> dict[str, str]:
    if now is not None:
        labels[TIMESTAMP] = str(int(now))
    return dict(sorted(labels.items()))


def _bool(value: bool) -> str:
    return "true" if value else "false"


def sharing_from_config(config: AgentConfig) -> SharingSummary:
    """The sharing labels from the agent config, saying whether the node's cards are shared.

    GFD's ``nvidia.com/gpu.sharing-strategy`` takes GFD's values: ``mps`` when kubegpu's
    card-level sharing (``sharing.gpuShare``) is on with ``enforcement: mps`` (pods on a card
    run as clients of one MPS daemon, as under GFD's mps); ``time-slicing`` when it is on
    without enforcement (CUDA time-slices the pods' contexts with no isolation, which is what
    GFD's time-slicing means) or when NVIDIA-style ``timeSlicing`` gives more than one replica;
    else ``none``. ``nvidia.com/gpu.replicas`` stays the time-slicing replicas of the
    ``nvidia.com/gpu`` entry (else of the first shared resource), 1 without: gpuShare does not
    replicate the whole-GPU resource, its slots are ``kubegpu.io/gpu-share.slots``."""
    time_slicing = config.sharing.time_slicing
    replicated = {
        r.name: (r.replicas, r.rename is not None or time_slicing.rename_by_default)
        for r in time_slicing.resources
    }
    mig = config.flags.mig_strategy
    replicas = 1
    strategy = "none"
    renamed = False
    if time_slicing.resources:
        chosen = next(
            (r for r in time_slicing.resources if r.name == DEFAULT_RESOURCE),
            time_slicing.resources[0],
        )
        replicas = chosen.replicas
        renamed = (
            chosen.name != DEFAULT_RESOURCE
            or chosen.rename is not None
            or time_slicing.rename_by_default
        )
        # GFD's rule: one replica per GPU shares nothing.
        strategy = "time-slicing" if replicas > 1 else "none"
    share = config.sharing.gpu_share
    if not share.enabled:
        return SharingSummary(
            strategy=strategy,
            replicas=replicas,
            renamed=renamed,
            mig_strategy=mig,
            replicated=replicated,
        )
    return SharingSummary(
        strategy="mps" if share.enforcement == "mps" else "time-slicing",
        replicas=replicas,
        gpu_share=GpuShareSummary(
            enforcement=share.enforcement, slots_per_card=share.slots_per_card
        ),
        renamed=renamed,
        mig_strategy=mig,
        replicated=replicated,
    )
