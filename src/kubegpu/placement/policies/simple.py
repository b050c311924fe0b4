"""The node scores that need no memory between calls: Random, DotProd, GpuClustering,
GpuPacking, BestFit (the paper simulator's, spec §6) and Spread (BestFit upside down).

Each is a function of (state, pod, feasible rows) to one integer score per row, higher better
(:data:`ScoreFunction`); :func:`scored_by` makes one a policy's node scorer. Random draws from
the engine's generator instead (:class:`RandomNodes`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kubegpu.placement.feasibility import eligible_cards
from kubegpu.placement.model import MILLI_PER_GPU, PodRequest
from kubegpu.placement.policy import NodeScorer, PolicyInputs, ScoredNodes, ScorerFactory
from kubegpu.placement.state import ClusterState, FloatArray, IntArray

ScoreFunction = Callable[[ClusterState, PodRequest, IntArray], IntArray]

# Normalisers of the paper's DotProd and BestFit: the largest node spec in the openb cluster
# (128 cores, 8 cards), fixed rather than per-cluster so scores do not shift as nodes join.
MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8 * MILLI_PER_GPU


def random_score(rng: np.random.Generator, rows: IntArray) -> IntArray:
    """One row drawn uniformly gets 100, the others 0."""
    out = np.zeros(rows.size, dtype=np.int64)
    out[int(rng.integers(rows.size))] = 100
    return out


def dot_prod(state: ClusterState, pod: PodRequest, rows: IntArray) -> IntArray:
    # Node vector (free CPU, free GPU) and pod vector, both divided by the max spec; the
    # smallest dot product wins (score = 100·(1 − dot/2)), i.e. the fullest node.
    dot = (state.cpu_free[rows] / MAX_SPEC_CPU_MILLI) * (pod.cpu_milli / MAX_SPEC_CPU_MILLI)
    dot = dot + (state.gpu_free_total[rows] / MAX_SPEC_GPU_MILLI) * (
        pod.total_gpu_milli / MAX_SPEC_GPU_MILLI
    )
    return (100.0 * (1.0 - dot / 2.0)).astype(np.int64)


def gpu_clustering(state: ClusterState, pod: PodRequest, rows: IntArray) -> IntArray:
    if pod.gpu_count == 0:
        return np.zeros(rows.size, dtype=np.int64)
    counts = state.affinity_counts(pod.affinity_tag)
    used = 25 * (MAX_SPEC_GPU_MILLI - state.gpu_free_total[rows]) // MAX_SPEC_GPU_MILLI
    has = counts[rows] > 0
    tags = state.distinct_tags[rows]
    base = np.where(has, np.where(tags == 1, 75, 50), np.where(tags == 0, 25, 0))
    return (base + used).astype(np.int64)


def gpu_packing(state: ClusterState, pod: PodRequest, rows: IntArray) -> IntArray:
    if pod.gpu_count == 0:
        return np.zeros(rows.size, dtype=np.int64)
    full = state.full_cards[rows]
    idle = full == state.gpu_count[rows]
    if pod.gpu_milli >= MILLI_PER_GPU:
        # Only fully free cards qualify: "open up" k cards on a used node.
        used = np.full(rows.size, max(50 - pod.gpu_count, 33), dtype=np.int64)
    else:
        eligible = eligible_cards(state, rows, pod)
        best = np.where(eligible, state.card_free[rows], MILLI_PER_GPU + 1).min(axis=1)
        shared = np.maximum(100 - (best * 100 // MILLI_PER_GPU) // 10, 50)
        used = np.where(best == MILLI_PER_GPU, max(50 - 1, 33), shared)
    return np.where(idle, np.maximum(33 - full, full), used).astype(np.int64)


def best_fit_raw(state: ClusterState, pod: PodRequest, rows: IntArray) -> FloatArray:
    # The simulator's float order: Σ_i (free_i − req_i) / maxSpec_i · 0.5, then (1 − s)·100.
    s = (state.cpu_free[rows] - pod.cpu_milli) / MAX_SPEC_CPU_MILLI * 0.5
    s = s + (state.gpu_free_total[rows] - pod.total_gpu_milli) / MAX_SPEC_GPU_MILLI * 0.5
    return (1.0 - s) * 100.0


def best_fit(state: ClusterState, pod: PodRequest, rows: IntArray) -> IntArray:
    return min_max_normalise(best_fit_raw(state, pod, rows))


def spread(state: ClusterState, pod: PodRequest, rows: IntArray) -> IntArray:
    """BestFit's normalised score turned upside down: the node left emptiest scores 100."""
    return 100 - best_fit(state, pod, rows)


def min_max_normalise(raw: FloatArray) -> IntArray:
    """The framework's NormalizeScore: truncate, then (s − min)·100 div (max − min), or all 0."""
    scores = raw.astype(np.int64)
    low, high = int(scores.min()), int(scores.max())
    if high == low:
        return np.zeros(scores.size, dtype=np.int64)
    return (scores - low) * 100 // (high - low)


class FunctionScorer(ScoredNodes):
    """A node scorer that is a :data:`ScoreFunction` of the engine's state."""

    def __init__(self, state: ClusterState, score: ScoreFunction) -> None:
        self.state = state
        self.score = score

    def scores(self, pod: PodRequest, rows: IntArray) -> IntArray:
        return self.score(self.state, pod, rows)


def scored_by(score: ScoreFunction) -> ScorerFactory:
    """The registry's node scorer for a policy whose score is ``score``."""

    def build(inputs: PolicyInputs) -> NodeScorer:
        return FunctionScorer(inputs.state, score)

    return build


class RandomNodes(ScoredNodes):
    """One feasible node drawn uniformly from the engine's generator gets 100, the others 0."""

    def __init__(self, inputs: PolicyInputs) -> None:
        self.rng = inputs.rng

    def scores(self, pod: PodRequest, rows: IntArray) -> IntArray:
        return random_score(self.rng, rows)
