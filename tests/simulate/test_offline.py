"""The offline reference packing (``kubegpu.simulate.offline``): feasible by the simulator's
own checks, never above the exact optimum, and the checks refuse what the simulator refuses."""

from __future__ import annotations

import random

import pytest

from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.simulate.bound import relax
from kubegpu.simulate.offline import InfeasiblePacking, Packing, extend, offline_packing, verify
from tests.simulate.brute_force import instance, optimum


def cluster() -> list[NodeState]:
    return [
        NodeState("a", 16000, 16000, 65536, "A", tuple(GpuState(i) for i in range(2))),
        NodeState("b", 16000, 16000, 65536, "B", tuple(GpuState(i) for i in range(2))),
    ]


def test_feasible_and_at_most_the_optimum_on_tiny_instances() -> None:
    rng = random.Random(11)
    reached = 0
    for _ in range(40):
        nodes, pods = instance(rng)
        relaxation = relax(nodes, pods)
        packing = offline_packing(nodes, pods, relaxation, relaxation.solve())
        held = verify(nodes, pods, packing)
        assert held == packing.allocated_milli(pods)
        best = optimum(nodes, pods)
        assert held <= best
        reached += held == best
        bfd = offline_packing(nodes, pods)  # repair alone: best fit decreasing
        assert verify(nodes, pods, bfd) <= best
    assert reached >= 34  # 38 of 40 when written (best fit decreasing alone: 36)


def test_rounds_the_relaxation_into_the_packing_it_describes() -> None:
    # Two 600 shares need a 400 each beside them; the relaxation pairs them, greedy best fit
    # decreasing does too; the packing holds all four (2000 milli) on two cards.
    nodes = cluster()[:1]
    pods = [
        PodRequest(1000, 1024, 1, 400),
        PodRequest(1000, 1024, 1, 600),
        PodRequest(1000, 1024, 1, 400),
        PodRequest(1000, 1024, 1, 600),
    ]
    relaxation = relax(nodes, pods)
    packing = offline_packing(nodes, pods, relaxation, relaxation.solve())
    assert verify(nodes, pods, packing) == 2000 and packing.placed() == 4


def test_verify_refuses_what_the_simulator_refuses() -> None:
    nodes = cluster()
    names = ("a", "b")
    heavy = PodRequest(12000, 1024, 1, 500)
    with pytest.raises(InfeasiblePacking, match="milli-CPU free"):
        verify(nodes, [heavy, heavy], Packing(names, ((0, (0,)), (0, (1,)))))
    two = PodRequest(1000, 1024, 2, 1000)
    half = PodRequest(1000, 1024, 1, 500)
    one = PodRequest(1000, 1024, 1, 1000)
    with pytest.raises(InfeasiblePacking, match="refuses"):  # card 1 is free, card 0 is not
        verify(nodes, [one, half], Packing(names, ((0, (0,)), (0, (0,)))))
    with pytest.raises(InfeasiblePacking, match="whole GPUs"):
        verify(nodes, [half, two], Packing(names, ((0, (1,)), (0, (0, 1)))))
    limited = PodRequest(1000, 1024, 1, 500, gpu_models=frozenset({"B"}))
    with pytest.raises(InfeasiblePacking, match="GPU model A"):
        verify(nodes, [limited], Packing(names, ((0, (0,)),)))
    with pytest.raises(InfeasiblePacking, match="cards"):
        verify(nodes, [two], Packing(names, ((1, (0, 0)),)))
    assert verify(nodes, [limited, two], Packing(names, ((1, (0,)), (0, (0, 1))))) == 2500


def test_extend_keeps_every_placement_and_adds_later_pods_where_they_fit() -> None:
    nodes = cluster()
    first = [PodRequest(1000, 1024, 1, 700)]
    packing = offline_packing(nodes, first)
    later = [*first, PodRequest(1000, 1024, 1, 300), PodRequest(1000, 1024, 1, 900)]
    grown = extend(nodes, later, packing)
    assert grown.slots[0] == packing.slots[0]
    assert grown.slots[1] == packing.slots[0]  # best fit: beside the 700
    assert verify(nodes, later, grown) == 1900
