"""Model-constrained variants of a trace: which GPU pods get a ``gpu_spec``, and which.

The paper kept its model-constrained openb traces aside for evaluation, so we make our own
from any trace: a given fraction of the GPU pods (those not already constrained) is limited to
a set of card models drawn from the cluster's own model mix. Like the held-out traces, most
sets are one model, some two to five, and now and then a token is repeated
(``V100M16|V100M32|V100M32``), which FGD counts as a class of its own. Scarce models are
over-represented: a model is drawn with weight √(its cards), so T4 or P100 turn up far more
often than their share of cards, which is where constrained pods compete with unconstrained
ones. A pod is only given models that have a node able to hold it (enough cards, CPU and
memory), so no constraint is impossible by construction.

Pure: seeded numpy, no I/O (``kubegpu trace constrain`` reads and writes the CSVs).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from kubegpu.placement.model import NodeState
from kubegpu.simulate.traces import TracePod

# How many models a constrained pod allows: mostly one, as in the held-out traces.
SET_SIZE_WEIGHTS = {1: 0.60, 2: 0.20, 3: 0.10, 4: 0.06, 5: 0.04}
# Chance that a set of two or more models repeats one of its tokens.
REPEAT_TOKEN_CHANCE = 0.10


def model_weights(nodes: Sequence[NodeState]) -> dict[str, float]:
    """Drawing weight per card model: √(cards of that model) (scarce models over-represented)."""
    cards: Counter[str] = Counter()
    for node in nodes:
        for model in node.card_models:
            if model:
                cards[model] += 1
    return {model: math.sqrt(count) for model, count in sorted(cards.items())}


def _models_that_hold(pod: TracePod, nodes: Sequence[NodeState]) -> list[str]:
    """Models of the nodes that could hold ``pod`` when empty, sorted."""
    r = pod.request
    found: set[str] = set()
    for node in nodes:
        if node.cpu_capacity_milli < r.cpu_milli or node.memory_free_mib < r.memory_mib:
            continue
        per_model = Counter(node.card_models)
        found.update(m for m, count in per_model.items() if m and count >= r.gpu_count)
    return sorted(found)


def choose_constraints(
    pods: Sequence[TracePod], nodes: Sequence[NodeState], fraction: float, seed: int
) -> dict[str, str]:
    """Pod name → new ``gpu_spec`` for ``fraction`` (0 < f ≤ 1) of the unconstrained GPU pods.

    Deterministic in ``seed``: the same trace, nodes and seed give the same variant.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    weights = model_weights(nodes)
    if not weights:
        raise ValueError("the node list names no GPU model")
    rng = np.random.default_rng(seed)
    candidates = sorted(
        (p for p in pods if p.request.gpu_count and not p.request.gpu_models),
        key=lambda p: p.name,
    )
    count = round(fraction * len(candidates))
    picked = sorted(int(i) for i in rng.choice(len(candidates), size=count, replace=False))
    sizes = np.array(list(SET_SIZE_WEIGHTS), dtype=np.int64)
    size_p = np.array(list(SET_SIZE_WEIGHTS.values()))
    size_p = size_p / size_p.sum()
    holders: dict[tuple[int, int, int], list[str]] = {}
    out: dict[str, str] = {}
    for index in picked:
        pod = candidates[index]
        r = pod.request
        shape = (r.cpu_milli, r.memory_mib, r.gpu_count)
        allowed = holders.get(shape)
        if allowed is None:
            allowed = _models_that_hold(pod, nodes)
            holders[shape] = allowed
        if not allowed:
            continue  # no model can hold it at all: leave it unconstrained
        size = min(int(rng.choice(sizes, p=size_p)), len(allowed))
        p = np.array([weights[m] for m in allowed])
        drawn = [
            allowed[int(i)] for i in rng.choice(len(allowed), size, replace=False, p=p / p.sum())
        ]
        if size >= 2 and rng.random() < REPEAT_TOKEN_CHANCE:
            drawn.append(drawn[int(rng.integers(size))])
        out[pod.name] = "|".join(drawn)
    return out
