"""A toy policy, added the way every policy is added: one module with its node score (this one)
and one registry entry (:data:`LEASTLOADED`), here registered only while :func:`registered`
holds, so no other test sees it.

``python -m tests.placement.leastloaded ARGS`` is ``kubegpu ARGS`` with the toy registered: a
command's help is built when its module is first imported, so only a fresh process shows what
the CLI offers.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import numpy as np

from kubegpu.placement.model import MILLI_PER_GPU, PodRequest
from kubegpu.placement.policies import POLICIES, PolicySpec, cards, fgd
from kubegpu.placement.policies.simple import scored_by
from kubegpu.placement.state import ClusterState, IntArray


def least_loaded(state: ClusterState, pod: PodRequest, rows: IntArray) -> IntArray:
    """The share of each node's GPU capacity still free, 0…100 (a node without cards: 0)."""
    capacity = state.gpu_count[rows].astype(np.int64) * MILLI_PER_GPU
    free = state.gpu_free_total[rows].astype(np.int64)
    return np.where(capacity > 0, free * 100 // np.maximum(capacity, 1), 0).astype(np.int64)


LEASTLOADED = PolicySpec(
    "leastloaded",
    "LeastLoaded",
    node_scorer=scored_by(least_loaded),
    cards=cards.BEST_FIT,
    target=fgd.target,
    extender_name="leastloaded",
    in_simulator_all=True,
)


@contextlib.contextmanager
def registered() -> Iterator[PolicySpec]:
    """The toy in the registry, for the duration of the block."""
    assert LEASTLOADED.name not in POLICIES
    POLICIES[LEASTLOADED.name] = LEASTLOADED
    try:
        yield LEASTLOADED
    finally:
        del POLICIES[LEASTLOADED.name]


if __name__ == "__main__":
    from kubegpu.cli.main import main

    with registered():
        sys.exit(main(sys.argv[1:]))
