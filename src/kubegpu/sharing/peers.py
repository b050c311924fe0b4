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
VOLCANO_NUMBER = "volcano.sh/gpu-number"  # whole cards; shown as 0 on the node
ALIYUN_MEMORY = "aliyun.com/gpu-mem"  # GiB by default (--memory-unit=GiB|MiB)
ALIYUN_COUNT = "aliyun.com/gpu-count"  # whole cards; shown as 0 on the node

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
    for group in ("initContainers", "containers"):
        containers = spec.get(group)
        if not isinstance(containers, list):
            continue
        for index, container in enumerate(containers):
            if not isinstance(container, Mapping):
                continue
            resources = container.get("resources")
            if not isinstance(resources, Mapping):
                continue
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
