"""The vectorised rejection reasons say exactly what the engine's own ``explain`` says, on
random cluster states and pods."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kubegpu.extender.reasons import explain_rows
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.model import GpuState, NodeState, PodRequest


def random_cluster(rng: random.Random) -> list[NodeState]:
    nodes = []
    for i in range(60):
        cards = rng.choice([0, 1, 2, 4, 8])
        gpus = tuple(
            GpuState(j, rng.choice([0, 100, 400, 700, 1000]), rng.choice([0, 2048, 8192, 40960]))
            for j in range(cards)
        )
        nodes.append(
            NodeState(
                f"n{i:02d}",
                64000,
                rng.choice([0, 1000, 8000, 64000]),
                rng.choice([0, 4096, 262144]),
                rng.choice(["A100", "T4"]),
                gpus,
            )
        )
    return nodes


def random_pod(rng: random.Random) -> PodRequest:
    cpu, memory = rng.choice([500, 4000, 16000]), rng.choice([512, 8192])
    models = rng.choice([frozenset(), frozenset({"T4"})])
    shape = rng.random()
    if shape < 0.2:
        return PodRequest(cpu, memory)
    if shape < 0.6:
        return PodRequest(
            cpu, memory, 1, rng.choice([100, 500, 900]), rng.choice([None, 1024, 16384]), models
        )
    return PodRequest(cpu, memory, rng.choice([1, 2, 4]), 1000, None, models)


@pytest.mark.parametrize("seed", range(20))
def test_vectorised_reasons_equal_the_engines_explain(seed: int) -> None:
    rng = random.Random(seed)
    engine = PlacementEngine(random_cluster(rng), "bestfit")
    for _ in range(25):
        pod = random_pod(rng)
        feasible = set(engine.feasible_rows(pod).tolist())
        rows = np.array([i for i in range(len(engine.names)) if i not in feasible], dtype=np.int64)
        expected = [engine.explain(engine.names[i], pod).reason for i in rows.tolist()]
        assert explain_rows(engine, pod, rows) == expected
