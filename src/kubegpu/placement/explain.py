"""Why a pod does not fit a node: the first failing check and a reason naming the numbers.

The checks are :mod:`~kubegpu.placement.feasibility`'s, one node at a time and in a fixed
order, so the extender can count rejections by check (``CHECK_*``) and show the reason text.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import numpy.typing as npt

from kubegpu.placement.model import MILLI_PER_GPU, PodRequest
from kubegpu.placement.state import ClusterState

# The explain checks in order (``explain_row`` returns the first that fails, or FITS).
CHECK_CPU, CHECK_MEMORY, FITS_WITHOUT_GPU, CHECK_NO_GPU, CHECK_MODEL = 0, 1, 2, 3, 4
CHECK_WHOLE_GPUS, CHECK_GPU_COMPUTE, CHECK_GPU_MEMORY, FITS = 5, 6, 7, 8


def explain_row(state: ClusterState, i: int, pod: PodRequest) -> tuple[int, str]:
    """The first check ``pod`` fails on row ``i`` (``CHECK_*``) and its reason, or
    (``FITS``/``FITS_WITHOUT_GPU``, "")."""
    node = state.names[i]
    cpu, memory = int(state.cpu_free[i]), int(state.memory_free[i])
    if cpu < pod.cpu_milli:
        return CHECK_CPU, f"{node}: {cpu} milli-CPU free, pod needs {pod.cpu_milli}"
    if memory < pod.memory_mib:
        return CHECK_MEMORY, f"{node}: {memory} MiB memory free, pod needs {pod.memory_mib}"
    if pod.gpu_count == 0:
        return FITS_WITHOUT_GPU, ""
    if state.gpu_count[i] == 0:
        return CHECK_NO_GPU, f"{node}: has no GPU"
    count = int(state.gpu_count[i])
    free = state.card_compute[i, :count]
    if pod.gpu_models:
        selection = state.model_selection(pod.gpu_models)
        if not selection.rows[i]:
            if selection.cards is not None and selection.cards[i, :count].any():
                return _explain_some_models(state, i, pod, selection.cards[i, :count])
            allowed = "|".join(sorted(pod.gpu_models))
            noun = "models" if state.mixed[i] else "model"
            return CHECK_MODEL, f"{node}: GPU {noun} {state.models[i]}, pod allows {allowed}"
    if pod.gpu_milli >= MILLI_PER_GPU:
        whole = int((free == MILLI_PER_GPU).sum())
        if whole < pod.gpu_count:
            return CHECK_WHOLE_GPUS, f"{node}: needs {pod.gpu_count} whole GPUs, {whole} free"
        return FITS, ""
    if int(free.max()) < pod.gpu_milli:
        return (
            CHECK_GPU_COMPUTE,
            f"{node}: largest free card share is {int(free.max())} milli, "
            f"pod needs {pod.gpu_milli}",
        )
    if pod.gpu_memory_mib is not None:
        memory_cards = state.card_memory[i, :count]
        fits = (free >= pod.gpu_milli) & (memory_cards >= pod.gpu_memory_mib)
        if not fits.any():
            best = int(memory_cards[free >= pod.gpu_milli].max())
            return (
                CHECK_GPU_MEMORY,
                f"{node}: largest free card has {best} MiB, pod needs {pod.gpu_memory_mib} MiB",
            )
    return FITS, ""


def _explain_some_models(
    state: ClusterState, i: int, pod: PodRequest, allowed: npt.NDArray[np.bool_]
) -> tuple[int, str]:
    """:func:`explain_row`'s GPU checks on a node mixing models, some of them allowed: the
    same checks over the allowed cards, and reasons that name the model."""
    node = state.names[i]
    count = int(state.gpu_count[i])
    free = state.card_compute[i, :count]
    wanted = "|".join(sorted(pod.gpu_models))
    if pod.gpu_milli >= MILLI_PER_GPU:
        full = free == MILLI_PER_GPU
        whole = int((full & allowed).sum())
        if whole >= pod.gpu_count:
            return FITS, ""
        others = Counter(
            m for m, f, ok in zip(state.card_models[i], full, allowed, strict=True) if f and not ok
        )
        tail = ", ".join(f"{n} {m}" for m, n in sorted(others.items()))
        return (
            CHECK_WHOLE_GPUS,
            f"{node}: needs {pod.gpu_count} whole GPUs of model {wanted}, {whole} free"
            + (f" (other free cards: {tail})" if tail else ""),
        )
    largest = int(free[allowed].max())
    if largest < pod.gpu_milli:
        return (
            CHECK_GPU_COMPUTE,
            f"{node}: largest free card share of model {wanted} is {largest} milli, "
            f"pod needs {pod.gpu_milli}",
        )
    if pod.gpu_memory_mib is not None:
        memory_cards = state.card_memory[i, :count]
        enough = (free >= pod.gpu_milli) & allowed
        if not (enough & (memory_cards >= pod.gpu_memory_mib)).any():
            best = int(memory_cards[enough].max())
            return (
                CHECK_GPU_MEMORY,
                f"{node}: largest free card of model {wanted} has {best} MiB, "
                f"pod needs {pod.gpu_memory_mib} MiB",
            )
    return FITS, ""
