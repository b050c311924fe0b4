"""MIG profiles and what fits on one card (kubegpu.core.mig), checked against the MIG user
guide's layouts rather than against the tables themselves."""

from __future__ import annotations

import pytest

from kubegpu.core.mig import (
    COMPUTE_SLICES,
    MEMORY_SLICES,
    MIG_PROFILES,
    Instance,
    MigError,
    free_placements,
    layout_problem,
    profile,
    profiles_of,
)

A100_80 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


def at(model: str, name: str, start: int) -> Instance:
    return Instance(profile(model, name), start)


@pytest.mark.parametrize("model", sorted(MIG_PROFILES))
def test_every_card_offers_the_guides_seven_profiles_and_can_be_filled(model: str) -> None:
    names = [p.name for p in profiles_of(model)]
    assert len(names) == 7 and names[1] == names[0] + "+me"
    assert [p.compute_slices for p in profiles_of(model)] == [1, 1, 1, 2, 3, 4, 7]
    # The guide's example layouts fill a card: seven 1g, or one 7g, or 4g + 3g.
    one_g = profiles_of(model)[0]
    assert layout_problem(Instance(one_g, s) for s in range(7)) == ""
    seven = profiles_of(model)[6]
    assert seven.memory_slices == MEMORY_SLICES and seven.compute_slices == COMPUTE_SLICES
    four, three = profiles_of(model)[5], profiles_of(model)[4]
    assert layout_problem([Instance(four, 0), Instance(three, 4)]) == ""
    # Memory grows with slices, and the whole card is the largest instance.
    memory = [p.memory_mib for p in profiles_of(model)]
    assert memory[0] <= memory[2] <= memory[4] <= memory[6]


def test_names_follow_the_guide_for_the_80gb_cards() -> None:
    assert [p.name for p in profiles_of(A100_80)] == [
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ]
    assert [p.resource_suffix for p in profiles_of(H100)][:2] == ["mig-1g.10gb", "mig-1g.10gb.me"]
    assert profile(H100, "3g.40gb").profile_id == 9


def test_layouts_the_card_refuses_say_why() -> None:
    assert "overlaps memory slice 4" in layout_problem(
        [at(H100, "3g.40gb", 4), at(H100, "2g.20gb", 4)]
    )
    assert "cannot start at memory slice 2" in layout_problem([at(H100, "3g.40gb", 2)])
    assert "at most 1 per card" in layout_problem(
        [at(H100, "1g.10gb+me", 0), at(H100, "1g.10gb+me", 1)]
    )
    # Two 3g take all eight memory slices and 6 compute slices: nothing else fits.
    two = [at(H100, "3g.40gb", 0), at(H100, "3g.40gb", 4)]
    assert layout_problem(two) == ""
    assert free_placements(profiles_of(H100), two) == []
    # Seven compute slices and eight memory slices in three instances: full.
    full = [at(H100, "4g.40gb", 0), at(H100, "2g.20gb", 4), at(H100, "1g.20gb", 6)]
    assert layout_problem(full) == ""
    assert free_placements(profiles_of(H100), full) == []


def test_free_placements_after_one_3g() -> None:
    free = free_placements(profiles_of(A100_80), [at(A100_80, "3g.40gb", 0)])
    assert {(i.profile.name, i.start) for i in free} == {
        ("1g.10gb", 4),
        ("1g.10gb", 5),
        ("1g.10gb", 6),
        ("1g.10gb+me", 4),
        ("1g.10gb+me", 5),
        ("1g.10gb+me", 6),
        ("1g.20gb", 4),
        ("1g.20gb", 6),
        ("2g.20gb", 4),
        ("3g.40gb", 4),
    }


def test_unknown_cards_and_profiles_are_named() -> None:
    with pytest.raises(MigError, match="'Tesla T4' has no MIG profiles"):
        profiles_of("Tesla T4")
    with pytest.raises(MigError, match=r"no MIG profile '2g\.40gb'.*offers 1g\.10gb"):
        profile(H100, "2g.40gb")
