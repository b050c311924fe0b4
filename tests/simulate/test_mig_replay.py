"""Replaying a cluster of MIG cards (kubegpu.simulate.mig): the trace variant's profile choice,
layouts the profile table allows whatever the policy, and where packing beats first fit."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest

from kubegpu.core.mig import layout_problem
from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.simulate import mig
from kubegpu.simulate.jobs import mig_curve
from kubegpu.simulate.mig import MIG_POLICIES, MigPod, mig_variant, replay_mig, slices_for
from tests.simulate.test_command import NODES, simulate, write_pods


def node(name: str, cards: int = 1, cpu: int = 64_000) -> NodeState:
    return NodeState(name, cpu, cpu, 512_000, "", tuple(GpuState(i, 1000) for i in range(cards)))


@pytest.mark.parametrize(
    ("milli", "slices"),
    [(1, 1), (142, 1), (143, 2), (285, 2), (428, 3), (429, 4), (571, 4), (572, 7), (999, 7)],
)
def test_a_share_asks_for_the_smallest_profile_with_at_least_its_compute(
    milli: int, slices: int
) -> None:
    assert slices_for(milli) == slices


def test_the_variant_keeps_cpu_pods_and_gives_whole_gpus_whole_cards() -> None:
    requests = [
        PodRequest(1000, 1024, 0, 0, name="cpu"),
        PodRequest(1000, 1024, 1, 250, name="share"),
        PodRequest(1000, 1024, 2, 1000, name="pair"),
    ]
    assert mig_variant(requests) == [
        MigPod("cpu", 1000, 1024),
        MigPod("share", 1000, 1024, 2, 1, 250),
        MigPod("pair", 1000, 1024, 7, 2, 2000),
    ]


def test_first_fit_strands_a_card_that_packing_fills() -> None:
    pods = [MigPod("a", 100, 100, 1, 1), MigPod("b", 100, 100, 4, 1)]
    first = replay_mig([node("n")], pods, "first-fit")
    packed = replay_mig([node("n")], pods, "pack")
    # First fit puts the 1g at memory slice 0, where the 4g must start: it waits.
    assert (first.placed, first.first_refusal) == (1, 1)
    assert (packed.placed, packed.refused, packed.slices_allocated) == (2, 0, 5)


@pytest.mark.parametrize("policy", MIG_POLICIES)
def test_every_layout_either_policy_makes_is_one_the_table_allows(policy: str) -> None:
    rng = random.Random(30)
    pods = [
        MigPod(f"p{i}", 500, 1000, rng.choice(mig.PROFILE_SLICES), rng.choice([1, 1, 1, 2]))
        for i in range(400)
    ]
    cluster = [node(f"n{i}", cards=4) for i in range(6)]
    result = replay_mig(cluster, pods, policy)
    assert result.placed + result.refused == len(pods)
    cards = [card for layout in result.layouts for card in layout]
    assert len(cards) == 24
    assert all(layout_problem(card) == "" for card in cards)
    used = sum(i.profile.compute_slices for card in cards for i in card)
    assert used == result.slices_allocated <= result.slices_total == 24 * 7
    assert result.first_refusal is not None  # 400 pods overfill 24 cards


def test_an_unknown_policy_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="expected one of first-fit, pack"):
        replay_mig([node("n")], [], "best")


def test_simulate_mig_adds_the_arrivals_on_mig_cards_beside_the_policies(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    pods = write_pods(tmp_path / "tiny.csv")
    out = tmp_path / "out"
    result = simulate(
        "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd", "--seeds", "1",
        "--mig", "--out", str(out), "--no-plot",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with (out / "allocation.csv").open() as handle:
        rows = {r["sc_policy"]: r for r in csv.DictReader(handle)}
    assert set(rows) == {"06-FGD", "MIG first-fit", "MIG pack"}
    for label in ("MIG first-fit", "MIG pack"):
        curve = [float(rows[label][str(x)]) for x in range(0, 101, 10) if rows[label][str(x)]]
        # The curve climbs with arrivals and never holds more than the cluster's cards.
        assert curve == sorted(curve) and 0 < curve[-1] <= 100
    assert "MIG first-fit" in result.stdout


def test_the_curve_counts_seven_slices_as_one_card() -> None:
    pods = [MigPod("a", 100, 100, 7, 1, 1000), MigPod("b", 100, 100, 1, 1, 100)]
    found = replay_mig([node("n", cards=2)], pods, "first-fit")
    curve = mig_curve(found, total_gpus=2)
    assert curve.arrived_milli.tolist() == [1000, 1100]
    assert curve.used_milli.tolist() == [1000, 1143]  # 8 slices = 8/7 of a card
