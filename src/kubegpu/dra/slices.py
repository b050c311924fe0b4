"""The ResourceSlices a node publishes, as a pure function of its GPU inventory and health.

One pool per node (named after the node), one device per GPU. Every device allows multiple
allocations (KEP-5075 consumable capacity): a request that names no capacity consumes the
``requestPolicy.default``, which is the whole card, so plain "give me a GPU" claims stay
exclusive; a request for ``memory``/``compute`` gets a share rounded up to the policy's step.
The scheduler's allocator does the accounting, so no card is ever over-committed by us.

Field names follow ``k8s.io/api/resource/v1`` (Kubernetes 1.35). The output is the JSON object
the API server takes, built here so it can be checked without a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from kubegpu.core.dra import (
    CAPACITY_COMPUTE,
    CAPACITY_MEMORY,
    KUBEGPU_NAMING,
    NVIDIA_NAMING,
    DraNaming,
    device_name,
)
from kubegpu.core.gpu import GpuDevice, GpuUuid, NodeInventory, pci_address
from kubegpu.dra import mig_slices

API_VERSION = "resource.k8s.io/v1"

# The v1 API's limit per slice: 128 devices, 64 once any device carries taints. We always allow
# taints (health can change), so chunk at 64.
MAX_DEVICES_PER_SLICE = 64

# Memory shares come in steps of 256 MiB (also the smallest share): finer steps only fragment a
# card, and every share's memory limit stays a whole number of MiB.
MEMORY_STEP_BYTES = 256 * 2**20
# Compute is in milli-cards as whole numbers ("1000" = the whole card, "250" = a quarter), the
# unit of kubegpu.io/gpu-compute; shares in steps of 10, one percent, the finest share MPS
# enforces (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is a whole percent). Steps of 50 rounded openb's
# shares (multiples of 10) up and cost 1.5 pp of a full cluster's GPUs on the real allocator
# (docs/benchmarks.md, "openb on the real control plane"). Not cards with milli suffixes ("250m"):
# kube-scheduler's allocator (k8s.io/dynamic-resource-allocation v0.35, roundUpRange) rounds a
# request to the policy's step with Quantity.Value(), which rounds a fraction up to 1, so every
# "250m" share consumed the whole card's "1" and a card took one share only (docs/e2e.md).
COMPUTE_MILLI_PER_CARD = 1000
COMPUTE_STEP_MILLI = 10

# resource.k8s.io/v1 DeviceAttributeMaxValueLength: a longer string is refused by the API server.
MAX_ATTRIBUTE_STRING = 64

UNHEALTHY_TAINT_SUFFIX = "unhealthy"

# Kubernetes' own attribute domain (KEP-5316 standard attributes), as NVIDIA's driver
# publishes pciBusID, pcieRoot and numaNode; and ours, where the NVIDIA naming puts the
# attributes NVIDIA's driver does not have (so its own domain holds exactly its set).
STANDARD_DOMAIN = "resource.kubernetes.io"
KUBEGPU_DOMAIN = KUBEGPU_NAMING.driver
# The label on every slice we write: a slice of our driver's name on our node without it was
# written by another driver of the same name (NVIDIA's, under the nvidia naming).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kubegpu"
_LABEL_VALUE_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def pool_name(node_name: str) -> str:
    return node_name


def slice_name(node_name: str, driver: str, index: int) -> str:
    return f"{node_name}-{driver}-{index}"


def _semver(raw: str | None) -> str | None:
    """A version attribute must be semver 2.0: "535.104.05" becomes "535.104.5" (no leading
    zeros), "560.28" becomes "560.28.0". None when it is not one to three numbers."""
    if not raw:
        return None
    parts = raw.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(parts)


def _quantity_mib(mib: int) -> str:
    return f"{mib}Mi"


def _memory_policy(total_mib: int) -> dict[str, Any] | None:
    step_mib = MEMORY_STEP_BYTES // 2**20
    usable_mib = total_mib - total_mib % step_mib
    if usable_mib < step_mib:
        return None
    # default = max = the largest step multiple that fits: a whole-card request consumes all
    # the card can give; the remainder (< one step) is smaller than the minimum share.
    return {
        "default": _quantity_mib(usable_mib),
        "validRange": {
            "min": _quantity_mib(step_mib),
            "max": _quantity_mib(usable_mib),
            "step": _quantity_mib(step_mib),
        },
    }


def holds_whole_card(gpu: GpuDevice, memory_bytes: int | None, compute_milli: int | None) -> bool:
    """Whether consumed capacity is all the device offers: what a request that names no
    capacity consumes (the request policies' defaults). Such a claim has the card to itself
    and is a whole GPU, not a share (no share limits, never an MPS client)."""
    usable_mib = gpu.memory_total_mib - gpu.memory_total_mib % (MEMORY_STEP_BYTES // 2**20)
    memory_whole = memory_bytes is None or memory_bytes >= usable_mib * 2**20
    compute_whole = compute_milli is None or compute_milli >= COMPUTE_MILLI_PER_CARD
    return memory_whole and compute_whole


def _compute_policy(naming: DraNaming) -> dict[str, Any]:
    """A request naming no compute consumes ``naming.unnamed_compute_milli`` (core/dra.py
    says why the two namings differ); one naming some is rounded up to a step."""
    step, whole = str(COMPUTE_STEP_MILLI), str(COMPUTE_MILLI_PER_CARD)
    default = naming.unnamed_compute_milli
    low = step if default >= COMPUTE_STEP_MILLI else "0"
    return {"default": str(default), "validRange": {"min": low, "max": whole, "step": step}}


def taint_value(reason: str) -> str:
    """A taint value must be a label value (≤63 chars of [A-Za-z0-9_.-], alphanumeric ends)."""
    value = _LABEL_VALUE_UNSAFE.sub("-", reason)[:63].strip("-_.")
    return value


def nvlink_attributes(inventory: NodeInventory) -> dict[GpuUuid, dict[str, dict[str, Any]]]:
    """The NVLink attributes of each GPU joined to at least one other by NVLink (GPUs without
    NVLink, or whose topology could not be read, get none, so a selector or constraint on them
    never matches such a GPU):

    * ``nvlinkPeers``: the indices of the GPUs it shares a lane with, ascending, comma-separated
      (``"1,3"``), for ``"3" in device.attributes[...].nvlinkPeers.split(",")``; left out when the
      list would pass the API's 64-character limit (more than ~25 peers);
    * ``nvlinkPeerCount``: how many such GPUs;
    * ``nvlinkDomain``: the smallest index of the GPUs reachable over NVLink from it (directly or
      through others): equal on every GPU of one NVLink island, so a claim for several GPUs with
      ``constraints: [{matchAttribute: gpu.kubegpu.io/nvlinkDomain}]`` gets them from one island.
    """
    index_of = {gpu.uuid: gpu.index for gpu in inventory.gpus}
    peers: dict[int, set[int]] = {}
    for (a, b), link in inventory.links.items():
        if link.nvlinks > 0 and a in index_of and b in index_of and a != b:
            peers.setdefault(index_of[a], set()).add(index_of[b])
            peers.setdefault(index_of[b], set()).add(index_of[a])
    domain: dict[int, int] = {}
    for start in sorted(peers):  # ascending, so each island is first reached from its smallest
        if start in domain:
            continue
        island, frontier = {start}, [start]
        while frontier:
            for peer in peers[frontier.pop()]:
                if peer not in island:
                    island.add(peer)
                    frontier.append(peer)
        domain.update((member, start) for member in island)
    found: dict[GpuUuid, dict[str, dict[str, Any]]] = {}
    for uuid, index in index_of.items():
        if index not in peers:
            continue
        listed = ",".join(str(peer) for peer in sorted(peers[index]))
        attributes: dict[str, dict[str, Any]] = {
            "nvlinkPeerCount": {"int": len(peers[index])},
            "nvlinkDomain": {"int": domain[index]},
        }
        if len(listed) <= MAX_ATTRIBUTE_STRING:
            attributes["nvlinkPeers"] = {"string": listed}
        found[uuid] = attributes
    return found


def _kubegpu_attributes(
    gpu: GpuDevice, driver_version: str | None, nvlink: Mapping[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    attributes: dict[str, dict[str, Any]] = {
        "uuid": {"string": gpu.uuid},
        "index": {"int": gpu.index},
        "productName": {"string": gpu.product_name},
        "pciBusID": {"string": gpu.pci_bus_id},
    }
    if gpu.compute_capability is not None:
        major, minor = gpu.compute_capability
        attributes["computeCapability"] = {"version": f"{major}.{minor}.0"}
    if gpu.numa_node is not None:
        attributes["numaNode"] = {"int": gpu.numa_node}
    version = _semver(driver_version)
    if version is not None:
        attributes["driverVersion"] = {"version": version}
    attributes.update(nvlink)
    return attributes


def _nvidia_attributes(
    gpu: GpuDevice,
    driver_version: str | None,
    cuda_driver_version: str | None,
    nvlink: Mapping[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """The attributes NVIDIA's DRA driver publishes for a full GPU (kubernetes-sigs/
    dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/deviceinfo.go), with its names, types and
    value formats; docs/migrate-nvidia.md lists them against ours. One it publishes and we
    cannot read is left out (a selector on it then matches no device) rather than made up.
    Ours that it lacks (index, NVLink) go under our own domain."""
    attributes: dict[str, dict[str, Any]] = {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu.uuid},
        "productName": {"string": gpu.product_name},
        f"{STANDARD_DOMAIN}/pciBusID": {"string": pci_address(gpu.pci_bus_id)},
        f"{KUBEGPU_DOMAIN}/index": {"int": gpu.index},
    }
    if gpu.brand is not None:
        attributes["brand"] = {"string": gpu.brand}
    if gpu.architecture is not None:
        attributes["architecture"] = {"string": gpu.architecture}
    if gpu.compute_capability is not None:
        major, minor = gpu.compute_capability
        attributes["cudaComputeCapability"] = {"version": f"{major}.{minor}.0"}
    versions = (("driverVersion", driver_version), ("cudaDriverVersion", cuda_driver_version))
    for name, raw in versions:
        version = _semver(raw)
        if version is not None:
            attributes[name] = {"version": version}
    if gpu.pcie_root is not None:
        attributes[f"{STANDARD_DOMAIN}/pcieRoot"] = {"string": gpu.pcie_root}
    if gpu.numa_node is not None:
        attributes[f"{STANDARD_DOMAIN}/numaNode"] = {"int": gpu.numa_node}
    attributes.update((f"{KUBEGPU_DOMAIN}/{name}", value) for name, value in nvlink.items())
    return attributes


def _attributes(
    gpu: GpuDevice,
    naming: DraNaming,
    driver_version: str | None,
    cuda_driver_version: str | None,
    nvlink: Mapping[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    if naming.key == NVIDIA_NAMING.key:
        return _nvidia_attributes(gpu, driver_version, cuda_driver_version, nvlink)
    return _kubegpu_attributes(gpu, driver_version, nvlink)


def _taint(naming: DraNaming, unhealthy_reason: str) -> dict[str, Any]:
    taint: dict[str, Any] = {
        "key": f"{naming.driver}/{UNHEALTHY_TAINT_SUFFIX}",
        "effect": "NoSchedule",
    }
    value = taint_value(unhealthy_reason)
    if value:
        taint["value"] = value
    return taint


def device_entry(
    gpu: GpuDevice,
    naming: DraNaming,
    driver_version: str | None,
    unhealthy_reason: str | None,
    nvlink: Mapping[str, dict[str, Any]] | None = None,
    cuda_driver_version: str | None = None,
) -> dict[str, Any]:
    attributes = _attributes(gpu, naming, driver_version, cuda_driver_version, nvlink or {})
    memory: dict[str, Any] = {"value": _quantity_mib(gpu.memory_total_mib)}
    policy = _memory_policy(gpu.memory_total_mib)
    if policy is not None:
        memory["requestPolicy"] = policy
    device: dict[str, Any] = {
        "name": device_name(gpu.index),
        "attributes": attributes,
        "capacity": {
            CAPACITY_MEMORY: memory,
            CAPACITY_COMPUTE: {
                "value": str(COMPUTE_MILLI_PER_CARD),
                "requestPolicy": _compute_policy(naming),
            },
        },
        "allowMultipleAllocations": True,
    }
    if unhealthy_reason is not None:
        device["taints"] = [_taint(naming, unhealthy_reason)]
    return device


def card_entries(
    gpu: GpuDevice,
    naming: DraNaming,
    inventory: NodeInventory,
    unhealthy_reason: str | None,
    nvlink: Mapping[str, dict[str, Any]] | None,
    dynamic_mig: bool,
    unhealthy: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The devices one card publishes: itself, or in MIG mode its MIG devices
    (:mod:`kubegpu.dra.mig_slices`), each tainted while the card is unhealthy, or (a static
    MIG device) while it is itself: an Xid NVML reports for one GPU instance marks that
    instance's MIG UUID alone in ``unhealthy``."""
    if not gpu.mig_enabled:
        entry = device_entry(
            gpu,
            naming,
            inventory.driver_version,
            unhealthy_reason,
            nvlink,
            inventory.cuda_driver_version,
        )
        return [entry]
    base = _attributes(
        gpu, naming, inventory.driver_version, inventory.cuda_driver_version, nvlink or {}
    )
    if dynamic_mig:
        entries = mig_slices.partition_entries(gpu, naming, base)
    else:
        entries = mig_slices.static_entries(gpu, naming, base)
    for entry in entries:
        own = entry["attributes"].get("uuid", {}).get("string")
        reason = unhealthy_reason or (unhealthy or {}).get(own or "")
        if reason is not None:
            entry["taints"] = [_taint(naming, reason)]
    return entries


def build_resource_slices(
    node_name: str,
    inventory: NodeInventory,
    *,
    naming: DraNaming = KUBEGPU_NAMING,
    generation: int,
    unhealthy: Mapping[str, str] | None = None,
    order: Sequence[int] | None = None,
    dynamic_mig: bool = False,
) -> list[dict[str, Any]]:
    """The node's pool at ``generation``: every slice of it, devices in GPU index order, or in
    ``order`` (GPU indices, a steered order: :mod:`kubegpu.dra.steering`) where given; GPUs
    that ``order`` leaves out follow in index order, indices it names that the node lacks are
    ignored. DRA's allocator takes the first device that fits in this order.

    ``unhealthy`` maps a GPU UUID to why it is unhealthy; those devices carry a NoSchedule taint so
    no new claim lands on them (claims already allocated keep running).

    ``dynamic_mig``: cards in MIG mode offer every placement over a counter set (KEP-4815)
    instead of the instances they hold; the counter sets come first, in slices of their own.
    """
    if generation < 1:
        raise ValueError(f"generation must be >= 1, got {generation}")
    unhealthy = unhealthy or {}
    position = {index: p for p, index in enumerate(order or ())}
    nvlink = nvlink_attributes(inventory)
    cards = sorted(inventory.gpus, key=lambda g: (position.get(g.index, len(position)), g.index))
    devices = [
        entry
        for gpu in cards
        for entry in card_entries(
            gpu,
            naming,
            inventory,
            unhealthy.get(gpu.uuid),
            nvlink.get(gpu.uuid),
            dynamic_mig,
            unhealthy,
        )
    ]
    counter_sets = [mig_slices.counter_set(g) for g in cards if dynamic_mig and g.mig_enabled]
    per = mig_slices.MAX_COUNTER_SETS_PER_SLICE
    specs: list[dict[str, Any]] = [
        {"sharedCounters": counter_sets[i : i + per]} for i in range(0, len(counter_sets), per)
    ]
    specs += [
        {"devices": devices[i : i + MAX_DEVICES_PER_SLICE]}
        for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)
    ] or ([] if specs else [{"devices": []}])
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(node_name, naming.driver, i),
                "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            },
            "spec": {
                "driver": naming.driver,
                "pool": {
                    "name": pool_name(node_name),
                    "generation": generation,
                    "resourceSliceCount": len(specs),
                },
                "nodeName": node_name,
                **content,
            },
        }
        for i, content in enumerate(specs)
    ]
