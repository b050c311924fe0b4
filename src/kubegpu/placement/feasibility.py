"""Feasibility: which nodes, and which of their cards, a pod fits on now.

Pure reads of a :class:`~kubegpu.placement.state.ClusterState`, vectorised over rows; the
reason a node does not fit is :mod:`~kubegpu.placement.explain`'s, which checks the same
conditions one node at a time.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kubegpu.placement.model import MILLI_PER_GPU, PodRequest
from kubegpu.placement.state import NO_ROWS, ClusterState, IntArray


def eligible_cards(state: ClusterState, rows: IntArray, pod: PodRequest) -> npt.NDArray[np.bool_]:
    """Per (row, card): can this card take one of the pod's cards, in the policies' terms:
    its level (:attr:`ClusterState.card_free`) at least the pod's ``gpu_milli`` (a share's
    level, from the engine) and, where asked, the memory. Such a card also fits the pod as
    it is (a level is at most the compute); see :func:`fitting_cards` for the converse."""
    return _cards(state, state.card_free, rows, pod)


def fitting_cards(state: ClusterState, rows: IntArray, pod: PodRequest) -> npt.NDArray[np.bool_]:
    """Per (row, card): does the card have the compute and memory the pod asks for, as they
    are: what filter and bind go by."""
    return _cards(state, state.card_compute, rows, pod)


def _cards(
    state: ClusterState, compute: IntArray, rows: IntArray, pod: PodRequest
) -> npt.NDArray[np.bool_]:
    free = compute[rows]
    if pod.gpu_milli >= MILLI_PER_GPU:
        ok: npt.NDArray[np.bool_] = free == MILLI_PER_GPU  # whole cards: fully free only
    else:
        ok = free >= pod.gpu_milli
        if pod.gpu_memory_mib is not None:
            ok &= state.card_memory[rows] >= pod.gpu_memory_mib
    if pod.gpu_models:
        cards = state.model_selection(pod.gpu_models).cards
        if cards is not None:
            ok &= cards[rows]
    return ok


def feasible_rows(state: ClusterState, pod: PodRequest) -> IntArray:
    """Rows (in tie-break order) of the nodes the pod fits on."""
    mask = (state.cpu_free >= pod.cpu_milli) & (state.memory_free >= pod.memory_mib)
    if not pod.gpu_count:
        return np.flatnonzero(mask)
    partial = NO_ROWS
    if pod.gpu_models:
        selection = state.model_selection(pod.gpu_models)
        if selection.partial.size:
            partial = selection.partial[mask[selection.partial]]
        mask &= selection.rows
    if pod.gpu_milli >= MILLI_PER_GPU:
        mask &= state.full_cards >= pod.gpu_count
        rows = np.flatnonzero(mask)
    else:
        mask &= state.largest_card >= pod.gpu_milli
        rows = np.flatnonzero(mask)
        if pod.gpu_memory_mib is not None:
            rows = rows[fitting_cards(state, rows, pod).any(axis=1)]
    if partial.size:
        # Nodes mixing models where only some cards are allowed: count those cards.
        fits = fitting_cards(state, partial, pod).sum(axis=1) >= pod.gpu_count
        if fits.any():
            rows = np.union1d(rows, partial[fits])
    return rows
