"""The upper bound and the offline packing of one replay, as columns beside the policies'.

A policy's allocation ratio at 100 % arrived is the mean, over the events (pod arrivals) whose
arrived GPU demand rounds to 100 % of capacity, of the GPU allocated after each
(:func:`~kubegpu.simulate.replay.discretise`). For the same events, with ``first`` and
``last`` the column's first and last event and ``B(e)`` the bound
(:mod:`~kubegpu.simulate.bound`) for the pods arrived by event ``e``:

* **upper bound**: after event ``e`` no placement of the pods arrived by then allocates more
  than ``min(arrived(e), B(last), B(first) + arrived(e) − arrived(first))`` (more pods never
  allow less, and the pods arrived after ``first`` can add no more than their demand);
  rounded as the policies' values are, so no policy's column can exceed it;
* **offline packing**: after event ``e``, the better of two feasible packings of the pods
  arrived by then: the packing (:mod:`~kubegpu.simulate.offline`) of the pods arrived by
  ``last``, less the pods arrived after ``e`` (a subset of a feasible packing is feasible),
  and the packing of those arrived by ``first``, extended pod by pod in arrival order.

Only that column is filled; the others stay empty.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kubegpu.placement.model import NodeState, PodRequest
from kubegpu.simulate.bound import relax
from kubegpu.simulate.offline import Packing, extend, offline_packing, verify
from kubegpu.simulate.replay import COLUMNS, ReplayResult, discretise

# ``kubegpu simulate --bound`` rows: job name -> the sc_policy label of its rows.
HINDSIGHT_LABELS = {"offline": "Offline packing", "bound": "Upper bound"}
COLUMN = 100  # the column the paper's table reports: 100 % arrived


@dataclass(frozen=True)
class Hindsight:
    """The bound and the offline packing for the pods arrived by one column's last event."""

    last_event: int  # index in arrival order (all pods when no event is in the column)
    arrived_milli: int  # GPU demand arrived by then
    bound_milli: int  # for the pods arrived by the last event
    offline_milli: int  # the packing of those pods
    bound_column: list[float | None]
    offline_column: list[float | None]
    packing: Packing | None  # of the pods up to ``last_event``, verified (None: not asked)
    lp_dropped_pods: int  # GPU pods the relaxation leaves out, rounded
    bound_s: float  # building and solving the relaxations
    offline_s: float  # rounding, repair and verification


@dataclass(frozen=True)
class _Prefix:
    bound_milli: int
    packing: Packing | None
    offline_milli: int
    dropped: int
    bound_s: float
    offline_s: float


def column_events(arrived_milli: npt.NDArray[np.int64], total_gpus: int, column: int) -> list[int]:
    """The events :func:`~kubegpu.simulate.replay.discretise` averages for ``column``: those
    whose arrived percentage rounds to it, else those within one of it."""
    arrive = np.rint(arrived_milli / total_gpus / 10).astype(np.int64)
    found = np.flatnonzero(arrive == column)
    if found.size == 0:
        found = np.flatnonzero((arrive >= column - 1) & (arrive <= column + 1))
    return [int(e) for e in found]


def _solve(nodes: Sequence[NodeState], pods: Sequence[PodRequest], pack: bool) -> _Prefix:
    started = time.perf_counter()
    relaxation = relax(nodes, pods)
    solution = relaxation.solve()
    solved = time.perf_counter()
    packing, allocated = None, 0
    if pack:
        packing = offline_packing(nodes, pods, relaxation, solution)
        allocated = verify(nodes, pods, packing)
    kept = sum(solution.values[col] for col in relaxation.x.values())
    dropped = sum(1 for p in pods if p.gpu_count) - round(kept)
    finished = time.perf_counter()
    spent = (solved - started, finished - solved)
    return _Prefix(solution.bound_milli, packing, allocated, dropped, *spent)


def hindsight(
    nodes: Sequence[NodeState],
    pods: Sequence[PodRequest],
    column: int = COLUMN,
    pack: bool = True,
) -> Hindsight:
    """The bound and (unless not ``pack``) the offline packing of ``pods`` (in arrival
    order) on the empty ``nodes``, for ``column`` (module docstring)."""
    if not pods:
        return Hindsight(-1, 0, 0, 0, _none(), _none(), Packing((), ()) if pack else None,
                         0, 0.0, 0.0)  # fmt: skip
    total_gpus = sum(len(n.gpus) for n in nodes)
    demand = np.array([p.total_gpu_milli for p in pods], dtype=np.int64)
    arrived = np.cumsum(demand)
    events = column_events(arrived, total_gpus, column) if total_gpus else []
    first, last = (events[0], events[-1]) if events else (len(pods) - 1, len(pods) - 1)
    whole = _solve(nodes, pods[: last + 1], pack)
    start = whole if first == last else _solve(nodes, pods[: first + 1], pack)
    started = time.perf_counter()
    offline_used = np.zeros_like(arrived)
    if whole.packing is not None and start.packing is not None:
        extended = extend(nodes, pods[: last + 1], start.packing)
        verify(nodes, pods[: last + 1], extended)
        offline_used[: last + 1] = np.maximum(
            _running(demand, whole.packing), _running(demand, extended)
        )
    extend_s = time.perf_counter() - started
    bound_used = np.minimum(arrived, whole.bound_milli)
    bound_used = np.minimum(bound_used, start.bound_milli + arrived - arrived[first])
    return Hindsight(
        last,
        int(arrived[last]),
        whole.bound_milli,
        whole.offline_milli,
        _only(bound_used, arrived, total_gpus, events, column),
        _only(offline_used, arrived, total_gpus, events, column) if pack else _none(),
        whole.packing,
        whole.dropped,
        whole.bound_s + (start.bound_s if start is not whole else 0.0),
        whole.offline_s + (start.offline_s if start is not whole else 0.0) + extend_s,
    )


def _running(demand: npt.NDArray[np.int64], packing: Packing) -> npt.NDArray[np.int64]:
    """GPU milli the packing allocates to the pods arrived by each event it covers."""
    placed = [int(d) if s else 0 for d, s in zip(demand, packing.slots, strict=False)]
    return np.cumsum(np.array(placed, dtype=np.int64))


def _none() -> list[float | None]:
    return [None] * len(COLUMNS)


def _only(
    used: npt.NDArray[np.int64],
    arrived: npt.NDArray[np.int64],
    total_gpus: int,
    events: list[int],
    column: int,
) -> list[float | None]:
    """``column`` of the curve ``used`` exactly as the policies' are computed; no other."""
    out = _none()
    if events:
        result = ReplayResult(arrived, used, total_gpus, 0)
        out[column] = discretise(result)[column]
    return out
