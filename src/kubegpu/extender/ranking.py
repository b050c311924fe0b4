"""How the engine's ranking of nodes becomes kube-scheduler's extender priorities.

kube-scheduler adds ``weight × 10 × priority`` (priority 0..10) of each extender to a node's
in-tree scores and binds to the highest total, ties at random. Two of its in-tree scores work
against packing: NodeResourcesFit (LeastAllocated) and NodeResourcesBalancedAllocation, each up
to 100 at weight 1, prefer the emptier node. With engine scores merely scaled to 0..10, a
one-point lead of the engine's choice (50 at the shipped weight 5) lost to them, and equal
priorities were broken at random instead of by the engine's tie-break: measured on the replay
of e2e/tests/test_12_scale.py, the real cluster then packed worse than ``kubegpu simulate``.

So the node the engine would choose (the simulator's choice: highest score, ties to the
smallest rank) gets :data:`MAX_EXTENDER_PRIORITY`, and every other node that fits gets its
engine score scaled to 0..:data:`FOLLOWER_MAX`. The lead is at least 5 points, 250 at weight
5: more than the two resource scores can give together (200), so the choice holds against
them, while a pod's own soft preferences (preferred node affinity, weight 2; a
PreferNoSchedule taint, weight 3) added to them can still win.

CPU-only pods reach the extender only through its every-pod entry (``/prioritize-dra``); the
policy places them too, as the simulator does (their CPU on a GPU node is what strands the
node's cards): :func:`cpu_pod_priorities`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.model import PodRequest

MAX_EXTENDER_PRIORITY = 10
FOLLOWER_MAX = 5


def extender_priorities(scores: npt.NDArray[np.int64], best: int | None) -> npt.NDArray[np.int64]:
    """Engine scores 0..100 as priorities: position ``best`` (the engine's choice) gets the
    maximum, the others their score scaled to 0..FOLLOWER_MAX (rounded half up). The one
    scaling of /prioritize and /prioritize-dra."""
    priorities = (scores * FOLLOWER_MAX + 50) // 100
    if best is not None and scores.size:
        priorities[best] = MAX_EXTENDER_PRIORITY
    return priorities


def ranked(
    engine: PlacementEngine, pod: PodRequest, rows: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], int | None]:
    """Scores of ``rows`` (feasible, in rank order) and the position of the engine's choice."""
    if rows.size == 0:
        return np.zeros(0, dtype=np.int64), None
    best, _ = engine.best_position(pod, rows)
    return engine.scores(pod, rows), best


def cpu_pod_priorities(
    engine: PlacementEngine,
    pod: PodRequest,
    engine_rows: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Priorities of a CPU-only pod for nodes whose engine rows are ``engine_rows``: the
    policy's ranking, as for a GPU pod (nodes without GPUs are rows with no cards, which
    strand nothing); 0 where the pod does not fit or the node is not yet known (-1)."""
    out = np.zeros(engine_rows.size, dtype=np.int64)
    feasible = np.zeros(len(engine.names) + 1, dtype=bool)
    feasible[engine.feasible_rows(pod)] = True
    wanted = np.flatnonzero(feasible[engine_rows])  # -1 reads the last entry: False
    if wanted.size == 0:
        return out
    by_row = np.argsort(engine_rows[wanted], kind="stable")
    scores, best = ranked(engine, pod, engine_rows[wanted][by_row])
    priorities = np.empty(wanted.size, dtype=np.int64)
    priorities[by_row] = extender_priorities(scores, best)
    out[wanted] = priorities
    return out


def names_with(node_names: Sequence[str], values: npt.NDArray[np.int64]) -> dict[str, int]:
    return dict(zip(node_names, values.tolist(), strict=True))
