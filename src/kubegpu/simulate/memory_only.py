"""Memory-only variants of a trace: the same arrivals, every share asking GPU memory alone.

Pods written for Aliyun's gpushare or Volcano's GPU share (and kubegpu's memory-only shares)
ask for card memory and nothing else; kubegpu holds 1 milli of compute for each
(:data:`kubegpu.sharing.peers.DEFAULT_PEER_COMPUTE_MILLI`). Replaying a trace re-expressed that
way shows whether a policy ranks such shares by what they hold (their memory, see
:func:`kubegpu.placement.model.share_milli`) or blindly. Two variants:

* ``openb``: each share of *m* milli asks for *m*/1000 of the memory of the most common card
  it may run on (of its allowed models, else of the cluster), so it takes the trace's
  fraction of the card it most likely lands on, and the trace's balance of GPU to CPU stays
  (a share larger than a smaller card's memory no longer fits that card, as in life).
* ``gpushare``: each share asks for a whole number of GiB drawn uniformly from 1 to that
  card's GiB, as gpushare's sample pods ask (``aliyun.com/gpu-mem`` in GiB), by a generator
  seeded with the replay's seed and the pod's name, so every policy sees the same sizes.

Cards get their memory from :data:`MODEL_MEMORY_MIB` (the traces do not record it). Whole-card
and CPU-only pods are unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from kubegpu.placement.model import MILLI_PER_GPU, GpuState, NodeState, PodRequest
from kubegpu.placement.target import reference_card_memory

VARIANTS = ("openb", "gpushare")
# Card memory per openb model (MiB). The trace anonymises two models: taken as 32 GiB.
MODEL_MEMORY_MIB = {
    "P100": 16384,
    "T4": 15360,
    "V100M16": 16384,
    "V100M32": 32768,
    "A10": 24576,
    "G2": 32768,
    "G3": 32768,
}
MIB_PER_GIB = 1024
# What a memory-only share holds of the compute (as the peers' compat mode does).
MEMORY_ONLY_COMPUTE_MILLI = 1


class UnknownModel(ValueError):
    """A node's card model has no memory in :data:`MODEL_MEMORY_MIB`."""


def with_card_memory(nodes: Sequence[NodeState]) -> list[NodeState]:
    """``nodes`` with each card's memory known and all of it free."""
    out: list[NodeState] = []
    for node in nodes:
        gpus: list[GpuState] = []
        for gpu in node.gpus:
            model = gpu.model or node.gpu_model
            memory = MODEL_MEMORY_MIB.get(model)
            if memory is None:
                raise UnknownModel(
                    f"node {node.name}: card model {model!r} has no known memory "
                    f"(known: {', '.join(sorted(MODEL_MEMORY_MIB))})"
                )
            gpus.append(replace(gpu, free_memory_mib=memory, memory_mib=memory))
        out.append(replace(node, gpus=tuple(gpus)))
    return out


def common_card_memory(nodes: Sequence[NodeState], models: frozenset[str]) -> int:
    """The memory of the most common card of ``models`` (empty: any) in ``nodes``, by the
    rule the workload is classed by (:func:`~kubegpu.placement.target.reference_card_memory`)."""
    found = reference_card_memory(
        g.memory_mib
        for n in nodes
        for g in n.gpus
        if not models or (g.model or n.gpu_model) in models
    )
    if found is None:
        raise UnknownModel(f"no card of models {sorted(models)} with a known memory")
    return found


def memory_only(
    pods: Sequence[PodRequest], nodes: Sequence[NodeState], variant: str, seed: int
) -> tuple[PodRequest, ...]:
    """``pods`` with each share re-expressed as memory alone (``nodes`` must carry their card
    memory, :func:`with_card_memory`)."""
    if variant not in VARIANTS:
        raise ValueError(f"memory-only variant {variant!r}: expected one of {', '.join(VARIANTS)}")
    common: dict[frozenset[str], int] = {}
    out: list[PodRequest] = []
    for pod in pods:
        if not pod.is_gpu_share:
            out.append(pod)
            continue
        card = common.get(pod.gpu_models)
        if card is None:
            card = common[pod.gpu_models] = common_card_memory(nodes, pod.gpu_models)
        if variant == "openb":
            memory = max(1, pod.gpu_milli * card // MILLI_PER_GPU)
        else:
            memory = _gpushare_gib(pod.name, seed, card // MIB_PER_GIB) * MIB_PER_GIB
        out.append(replace(pod, gpu_milli=MEMORY_ONLY_COMPUTE_MILLI, gpu_memory_mib=memory))
    return tuple(out)


def _gpushare_gib(name: str, seed: int, most: int) -> int:
    """A whole number of GiB, uniform in 1..``most``, fixed by ``seed`` and the pod's name
    (clones of one pod are named apart, so they draw apart)."""
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "big"))
    return int(rng.integers(1, max(1, most) + 1))
