"""07-Kubegpu's choice in the simulator (``KubegpuScorer.best``: each pod kind's keys spelt
out, unpriced states priced on the way, FGD's score only on the nodes tied on the bucket) is
the first node of a full lexicographic sort of every key of every node, also when ``best``
is the first to see a state (the tables cold), with card memory, model limits, mixed-model
nodes and CPU-only pods in the mix."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import TypicalWorkload
from tests.placement.test_kubegpu_caches import random_node, random_pod


@pytest.mark.parametrize("seed", range(8))
def test_the_first_node_of_the_full_sort_with_best_seeing_each_state_first(seed: int) -> None:
    rng = random.Random(4000 + seed)
    workload = TypicalWorkload.from_pods([random_pod(rng, i) for i in range(60)])
    nodes = [random_node(rng, i) for i in range(50)]
    engine = PlacementEngine(nodes, "kubegpu", workload)
    # A twin engine, fed the same pods, whose keys are computed over every row.
    twin = PlacementEngine(nodes, "kubegpu", workload)
    kinds = {"cpu": 0, "share": 0, "whole": 0, "memory": 0}
    for i in range(150):
        pod = random_pod(rng, i)
        rows = engine.feasible_rows(pod)
        if rows.size >= 2:
            chosen = engine.node_scorer.best(pod, rows)  # first: its tables are cold here
            keys = twin.node_scorer.keys(pod, rows)
            assert chosen == int(np.lexsort(tuple(reversed(keys)))[0]), pod
            if pod.is_gpu_share:
                # The card read back from the chosen state's order value (its remainder is
                # the best card's free milli, whatever the bucket's sign) is the card a
                # fresh pricing of the row picks.
                scorer = engine.node_scorer
                i = int(rows[chosen])
                fresh = int(scorer.share_choice(pod, np.array([i]))[1][0])
                assert scorer.card(i, pod) == fresh, pod
            kind = (
                "memory"
                if pod.gpu_memory_mib is not None
                else "cpu"
                if not pod.gpu_count
                else "share"
                if pod.is_gpu_share
                else "whole"
            )
            kinds[kind] += 1
        assert engine.place(pod) == twin.place(pod)
    assert all(count >= 3 for count in kinds.values()), kinds
