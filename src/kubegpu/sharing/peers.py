"""Compatibility with the GPU-share systems kubegpu replaces: Volcano's legacy GPU share and
Alibaba's gpushare (``shared/specs/peers/gpu-sharing-systems.md`` §3a, §4).

Their users' pods ask for GPU memory with one resource of the peer's own (``volcano.sh/gpu-memory``
in MiB, ``aliyun.com/gpu-mem`` in GiB by default) and nothing else. A compat mode makes such a pod
a kubegpu share without editing it:

* the peer's memory resource counts as ``kubegpu.io/gpu-memory`` in the peer's unit, with a fixed
  compute part (:attr:`PeerCompat.compute_milli`; the peers have no compute notion at all);
* a mutating admission webhook adds our share slot to each container asking for it
  (:func:`admission_patch`), so that the kubelet calls our ``Allocate`` (docs/sharing.md says why
  a webhook and not per-MiB fake devices);
* the node agent advertises the peer's node figures (:func:`node_capacity`) so that
  ``kubectl describe node`` shows capacity and allocated as the peer's admins know them;
* ``Allocate`` tells the container the peer's environment (:func:`container_env`) beside ours.

Every other resource of the peers (Volcano's ``gpu-number`` and vGPU, Aliyun's ``gpu-count`` and
cGPU compute) is served by nothing in kubegpu, so a pod asking for one would run without a card
or wait forever without a word: the webhook refuses it at creation instead, naming the resource
and what to ask for (:func:`admission_refusal`), and the node shows the card counts as 0 so that
no such pod can be placed on a GPU node even past the webhook.

Everything here is pure: names and numbers in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

VOLCANO = "volcano"
ALIYUN = "aliyun"
PEER_NAMES: tuple[str, ...] = (VOLCANO, ALIYUN)

VOLCANO_MEMORY = "volcano.sh/gpu-memory"  # MiB (× the plugin's --gpu-memory-factor, 1 by default)
VOLCANO_NUMBER = "volcano.sh/gpu-number"  # whole cards; refused, and shown as 0 on the node
ALIYUN_MEMORY = "aliyun.com/gpu-mem"  # GiB by default (--memory-unit=GiB|MiB)
ALIYUN_COUNT = "aliyun.com/gpu-count"  # whole cards; refused, and shown as 0 on the node

# The peers' resources kubegpu never serves, with what each meant under the peer. Volcano's vGPU
# (volcano-vgpu-device-plugin, HAMi-core) and ACK's cGPU compute share limit a container inside
# the card, which kubegpu does not do; the card counts ask for whole cards under a name no
# device plugin of ours stands behind. A pod asking for any of them is refused at creation.
VOLCANO_VGPU_NUMBER = "volcano.sh/vgpu-number"
VOLCANO_VGPU_MEMORY = "volcano.sh/vgpu-memory"
VOLCANO_VGPU_MEMORY_PERCENTAGE = "volcano.sh/vgpu-memory-percentage"
VOLCANO_VGPU_CORES = "volcano.sh/vgpu-cores"
ALIYUN_CORE_PERCENTAGE = "aliyun.com/gpu-core.percentage"
UNSERVED: dict[str, dict[str, str]] = {
    VOLCANO: {
        VOLCANO_NUMBER: "Volcano's whole-card count",
        VOLCANO_VGPU_NUMBER: "Volcano vGPU",
        VOLCANO_VGPU_MEMORY: "Volcano vGPU",
        VOLCANO_VGPU_MEMORY_PERCENTAGE: "Volcano vGPU",
        VOLCANO_VGPU_CORES: "Volcano vGPU",
    },
    ALIYUN: {
        ALIYUN_COUNT: "gpushare's whole-card count",
        ALIYUN_CORE_PERCENTAGE: "ACK cGPU's compute share",
    },
}

MIB_PER_UNIT = {"MiB": 1, "GiB": 1024}

# What a container asking for a peer resource gets by default: the peers reserve no compute
# (their pods time-share the card with nothing held back), and one milli-GPU lets as many peer
# pods share a card as its memory allows, as under the peer, while still counting in our
# compute accounting so a kubegpu-style pod's compute is never over-committed.
DEFAULT_PEER_COMPUTE_MILLI = 1


@dataclass(frozen=True)
class PeerCompat:
    """One peer's resources as kubegpu reads them."""

    name: str
    memory_resource: str
    count_resource: str
    memory_unit_mib: int  # MiB in one unit of ``memory_resource``
    compute_milli: int = DEFAULT_PEER_COMPUTE_MILLI

    @property
    def unit(self) -> str:
        return next((u for u, m in MIB_PER_UNIT.items() if m == self.memory_unit_mib), "MiB")

    @property
    def unserved(self) -> tuple[str, ...]:
        """The peer's resources kubegpu refuses (:data:`UNSERVED`)."""
        return tuple(UNSERVED[self.name])

    @property
    def resources(self) -> tuple[str, ...]:
        """Every resource of the peer kubegpu knows: the one it serves, then those it refuses."""
        return (self.memory_resource, *self.unserved)


def peer_compat(
    modes: Iterable[str],
    *,
    aliyun_memory_unit: str = "GiB",
    volcano_memory_factor: int = 1,
    compute_milli: int = DEFAULT_PEER_COMPUTE_MILLI,
) -> tuple[PeerCompat, ...]:
    """The compat modes named in ``modes`` (``volcano``, ``aliyun``); raises ValueError naming
    the value that is not one."""
    if not 1 <= compute_milli <= 999:
        raise ValueError(f"peer compute must be 1..999 milli-GPU, got {compute_milli}")
    if aliyun_memory_unit not in MIB_PER_UNIT:
        raise ValueError(
            f"aliyun memory unit must be one of {', '.join(MIB_PER_UNIT)}, got "
            f"{aliyun_memory_unit!r}"
        )
    if volcano_memory_factor < 1:
        raise ValueError(f"volcano memory factor must be at least 1, got {volcano_memory_factor}")
    peers: list[PeerCompat] = []
    for mode in dict.fromkeys(m.strip() for m in modes if m.strip()):
        if mode == VOLCANO:
            peers.append(
                PeerCompat(
                    VOLCANO, VOLCANO_MEMORY, VOLCANO_NUMBER, volcano_memory_factor, compute_milli
                )
            )
        elif mode == ALIYUN:
            peers.append(
                PeerCompat(
                    ALIYUN,
                    ALIYUN_MEMORY,
                    ALIYUN_COUNT,
                    MIB_PER_UNIT[aliyun_memory_unit],
                    compute_milli,
                )
            )
        else:
            raise ValueError(f"unknown peer compat mode {mode!r}; known: {', '.join(PEER_NAMES)}")
    return tuple(peers)


def peer_named(peers: Sequence[PeerCompat], name: str) -> PeerCompat | None:
    return next((p for p in peers if p.name == name), None)


# --------------------------------------------------------------------------- node figures
def node_capacity(peers: Sequence[PeerCompat], card_memory_mib: Sequence[int]) -> dict[str, str]:
    """The peers' resources as a node advertises them (capacity = allocatable): memory of every
    card in the peer's unit (each card rounded down, as the peers count fake devices per card),
    and the card count as 0.

    The count is a resource a pod can ask for, and nothing in kubegpu hands out cards under it:
    advertised as the number of cards it let a ``volcano.sh/gpu-number: 1`` pod that skipped the
    webhook be scheduled and run with no card at all (and, from an image that sets
    ``NVIDIA_VISIBLE_DEVICES=all``, likely every card). At 0 such a pod stays Pending with the
    scheduler's "Insufficient" event, and the figure the peer's own plugin left on the Node
    before the migration is overwritten rather than kept. The cards are ``nvidia.com/gpu``."""
    figures: dict[str, str] = {}
    for peer in peers:
        figures[peer.memory_resource] = str(
            sum(mib // peer.memory_unit_mib for mib in card_memory_mib)
        )
        figures[peer.count_resource] = "0"
    return figures


# --------------------------------------------------------------------------- container env
def container_env(
    peer: PeerCompat,
    *,
    card_index: int,
    card_memory_mib: int,
    container_units: int,
    pod_units: int,
) -> dict[str, str]:
    """What the peer promises a container, names and units as the peer documents them."""
    if peer.name == VOLCANO:
        # The walk-through (seed 001) reads VOLCANO_GPU_TOTAL; volcano-sh/devices' code sets
        # VOLCANO_GPU_MEMORY_TOTAL: both, in MiB, as both are read in the wild.
        total = str(card_memory_mib)
        return {
            "VOLCANO_GPU_TOTAL": total,
            "VOLCANO_GPU_MEMORY_TOTAL": total,
            "VOLCANO_GPU_ALLOCATED": str(container_units * peer.memory_unit_mib),
        }
    return {
        "ALIYUN_COM_GPU_MEM_IDX": str(card_index),
        "ALIYUN_COM_GPU_MEM_POD": str(pod_units),
        "ALIYUN_COM_GPU_MEM_CONTAINER": str(container_units),
        "ALIYUN_COM_GPU_MEM_DEV": str(card_memory_mib // peer.memory_unit_mib),
    }


# --------------------------------------------------------------------------- admission
def _escape(name: str) -> str:
    """A map key as a JSON Pointer token (RFC 6901)."""
    return name.replace("~", "~0").replace("/", "~1")


def _asks(resources: Mapping[str, Any], resource: str) -> bool:
    for part in ("limits", "requests"):
        amounts = resources.get(part)
        if isinstance(amounts, Mapping) and resource in amounts:
            raw = amounts[resource]
            if str(raw).strip() not in ("0", ""):
                return True
    return False


def _containers(pod: Mapping[str, Any]) -> list[tuple[str, str, int, Mapping[str, Any]]]:
    """(group, what the messages call it, index, resources) of every container of ``pod`` that
    has its resources as an object."""
    spec = pod.get("spec")
    found: list[tuple[str, str, int, Mapping[str, Any]]] = []
    if not isinstance(spec, Mapping):
        return found
    for group, called in (("initContainers", "init container"), ("containers", "container")):
        containers = spec.get(group)
        if not isinstance(containers, list):
            continue
        for index, container in enumerate(containers):
            if not isinstance(container, Mapping):
                continue
            resources = container.get("resources")
            if isinstance(resources, Mapping):
                name = container.get("name")
                label = name if isinstance(name, str) and name else f"#{index}"
                found.append((group, f"{called} {label}", index, resources))
    return found


def admission_refusal(
    pod: Mapping[str, Any], peers: Sequence[PeerCompat], *, whole_gpu: str, key: str
) -> str:
    """Why a pod must be refused at creation before any patch, or ``""``: a container asks for
    a peer resource kubegpu never serves (:data:`UNSERVED`), or for a peer's memory in requests
    only. ``key`` names the pod in the message, ``whole_gpu`` is the whole-card resource to
    suggest.

    Requests only: the API server's validation, which runs after the webhook, would refuse the
    pod anyway, but with "Limit must be set for non overcommitable resources", naming neither
    the resource nor the fix."""
    for _group, where, _index, resources in _containers(pod):
        for peer in peers:
            for resource, meant in UNSERVED[peer.name].items():
                if _asks(resources, resource):
                    return (
                        f"pod {key} {where}: {resource} ({meant}) is not served by kubegpu; ask "
                        f"for {whole_gpu} for whole cards, or for {peer.memory_resource} alone "
                        "for a share of one card"
                    )
    for _group, where, _index, resources in _containers(pod):
        limits = resources.get("limits")
        for peer in peers:
            in_limits = isinstance(limits, Mapping) and peer.memory_resource in limits
            if _asks(resources, peer.memory_resource) and not in_limits:
                return (
                    f"pod {key} {where}: {peer.memory_resource} is in requests but not in "
                    "limits; set it in limits (an extended resource is asked for in limits, "
                    "and requests default to them)"
                )
    return ""


def admission_patch(
    pod: Mapping[str, Any],
    peers: Sequence[PeerCompat],
    share_slot: str,
    *,
    scheduler_name: str = "",
) -> list[dict[str, Any]]:
    """JSON Patch operations that make a peer-style pod a kubegpu share: one ``share_slot`` in
    the limits (and requests, when the pod has them) of every container asking for a peer's
    memory and no slot yet, and, with ``scheduler_name``, the pod sent to that scheduler.
    Empty for a pod that asks for no peer resource."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping) or not peers:
        return []
    ops: list[dict[str, Any]] = []
    wanted = [p.memory_resource for p in peers]
    slot = _escape(share_slot)
    for group, _where, index, resources in _containers(pod):
        if not any(_asks(resources, name) for name in wanted):
            continue
        base = f"/spec/{group}/{index}/resources"
        for part in ("limits", "requests"):
            amounts = resources.get(part)
            if isinstance(amounts, Mapping):
                if share_slot not in amounts:
                    ops.append({"op": "add", "path": f"{base}/{part}/{slot}", "value": "1"})
            elif part == "limits":
                ops.append({"op": "add", "path": f"{base}/limits", "value": {share_slot: "1"}})
    if ops and scheduler_name and spec.get("schedulerName") != scheduler_name:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
    return ops
