"""The GPU-memory budget of DRA claims, pure: what a ResourceClaim is charged (decoded from its
JSON by the kube edge, priced against the published cards), the budget label, the refusal."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.kube.resource_claims import claim_demand
from kubegpu.kube.resource_slices import card_memory
from kubegpu.sharing.claim_budget import (
    BUDGET_LABEL,
    BudgetError,
    ClaimDemandError,
    DriverCards,
    Unpriced,
    budget_refusal,
    claim_bytes,
    default_class_drivers,
    format_bytes,
    parse_budget,
)

GI = 1 << 30
CLASSES = default_class_drivers()
CARDS = {"gpu.kubegpu.io": DriverCards(80 * GI, 8 * 80 * GI)}


def exactly(
    cls: str = "gpu-share.kubegpu.io",
    memory: Any = None,
    count: Any = None,
    mode: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"deviceClassName": cls}
    if memory is not None:
        out["capacity"] = {"requests": {"memory": memory, "compute": "250"}}
    if count is not None:
        out["count"] = count
    if mode:
        out["allocationMode"] = mode
    return out


def claim(*requests: dict[str, Any], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "c", "namespace": "team-a", "uid": "u-1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T08:00:00Z"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": list(requests)}},
    }


def req(name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "exactly": exactly(**kw)}


@pytest.mark.parametrize(
    ("obj", "charged"),
    [
        pytest.param(claim(req("gpu", memory="20Gi")), 20 * GI, id="one-share"),
        pytest.param(claim(req("gpu", memory="20Gi", count=3)), 60 * GI, id="count-times-memory"),
        pytest.param(
            claim(req("a", memory="10Gi"), req("b", memory="512Mi")),
            10 * GI + 512 * (1 << 20),
            id="requests-add-up",
        ),
        pytest.param(claim(req("gpu", cls="gpu.kubegpu.io")), 80 * GI, id="whole-gpu-a-card"),
        pytest.param(
            claim(req("gpu", cls="gpu.kubegpu.io", count=2)), 160 * GI, id="two-whole-gpus"
        ),
        pytest.param(
            claim(req("gpu", cls="gpu-share.kubegpu.io", mode="All")),
            640 * GI,
            id="all-the-largest-node",
        ),
        pytest.param(
            claim(req("gpu", cls="gpu.nvidia.com", memory="4Gi")), 4 * GI, id="nvidia-naming"
        ),
        pytest.param(claim(req("nic", cls="sriov.example.com")), 0, id="other-classes-free"),
        pytest.param(
            claim(
                {
                    "name": "gpu",
                    "firstAvailable": [
                        {"name": "small", **exactly(memory="8Gi")},
                        {"name": "big", **exactly(memory="40Gi")},
                        {"name": "nic", **exactly(cls="sriov.example.com")},
                    ],
                }
            ),
            40 * GI,
            id="first-available-worst-case",
        ),
    ],
)
def test_a_claim_is_charged_the_most_memory_it_can_be_allocated(
    obj: dict[str, Any], charged: int
) -> None:
    assert claim_bytes(claim_demand(obj, CLASSES), CARDS) == charged


def test_a_claim_for_other_classes_asks_for_no_gpus() -> None:
    assert not claim_demand(claim(req("nic", cls="sriov.example.com")), CLASSES).asks_for_gpus
    assert claim_demand(claim(req("gpu", memory="1Gi")), CLASSES).asks_for_gpus


def test_only_a_request_without_memory_or_with_all_needs_the_published_cards() -> None:
    assert not claim_demand(claim(req("gpu", memory="1Gi")), CLASSES).needs_cards
    assert claim_demand(claim(req("gpu", cls="gpu.kubegpu.io")), CLASSES).needs_cards
    assert claim_demand(claim(req("gpu", memory="1Gi", mode="All")), CLASSES).needs_cards


def test_a_whole_gpu_is_unpriced_while_no_card_is_published_and_the_message_says_why() -> None:
    demand = claim_demand(claim(req("gpu", cls="gpu.kubegpu.io")), CLASSES)
    with pytest.raises(Unpriced) as caught:
        claim_bytes(demand, {})
    assert str(caught.value) == (
        "resourceclaim team-a/c request gpu names no capacity.requests.memory, so it would take "
        "a whole card, and no ResourceSlice of driver gpu.kubegpu.io publishes a card's memory "
        "to charge for it; name the memory it needs"
    )


def test_a_claim_being_deleted_says_so() -> None:
    assert claim_demand(claim(req("gpu", memory="1Gi"), deleting=True), CLASSES).deleting
    assert not claim_demand(claim(req("gpu", memory="1Gi")), CLASSES).deleting


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        pytest.param(req("gpu", memory="lots"), "capacity.requests.memory", id="memory"),
        pytest.param(req("gpu", memory="1Gi", count=0), "count 0", id="count"),
        pytest.param(req("gpu", memory="1Gi", count="2"), "count '2'", id="count-type"),
    ],
)
def test_a_request_that_cannot_be_read_names_the_claim_and_field(
    bad: dict[str, Any], words: str
) -> None:
    with pytest.raises(ClaimDemandError) as caught:
        claim_demand(claim(bad), CLASSES)
    assert str(caught.value).startswith("resourceclaim team-a/c request gpu: ")
    assert words in str(caught.value)


def slice_of(driver: str, pool: str, generation: int, *memory: str) -> dict[str, Any]:
    return {
        "spec": {
            "driver": driver,
            "nodeName": pool,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "capacity": {"memory": {"value": m}}}
                for i, m in enumerate(memory)
            ],
        }
    }


def test_the_published_cards_are_the_largest_card_and_node_of_each_driver() -> None:
    cards = card_memory(
        [
            slice_of("gpu.kubegpu.io", "node-a", 1, "80Gi", "80Gi"),
            slice_of("gpu.kubegpu.io", "node-b", 1, "16Gi", "16Gi", "16Gi", "16Gi", "16Gi"),
            # A pool's older generation is being replaced: only the newest counts.
            slice_of("gpu.kubegpu.io", "node-c", 1, "141Gi"),
            slice_of("gpu.kubegpu.io", "node-c", 2, "40Gi"),
            slice_of("gpu.nvidia.com", "node-d", 1, "24Gi"),
            {"spec": {"driver": "gpu.kubegpu.io", "pool": {"name": "x"}, "devices": [{}]}},
        ]
    )
    assert cards == {
        "gpu.kubegpu.io": DriverCards(80 * GI, 160 * GI),
        "gpu.nvidia.com": DriverCards(24 * GI, 24 * GI),
    }


@pytest.mark.parametrize(
    ("raw", "value"),
    [("80Gi", 80 * GI), ("81920Mi", 80 * GI), ("1.5Ti", 1536 * GI), ("0", 0), ("1000", 1000)],
)
def test_the_budget_is_a_quantity_of_bytes(raw: str, value: int) -> None:
    assert parse_budget(raw) == value


@pytest.mark.parametrize("raw", ["80GB", "lots", "-1Gi", ""])
def test_a_budget_that_is_no_quantity_names_the_label_and_value(raw: str) -> None:
    with pytest.raises(BudgetError) as caught:
        parse_budget(raw)
    assert str(caught.value).startswith(f"label {BUDGET_LABEL}={raw!r} is not a quantity of bytes")


@pytest.mark.parametrize(
    ("value", "text"),
    [(96 * GI, "96Gi"), (1536 << 20, "1536Mi"), (2 << 40, "2Ti"), (0, "0"), (1000, "1000")],
)
def test_bytes_are_written_in_the_largest_whole_unit(value: int, text: str) -> None:
    assert format_bytes(value) == text


def test_an_odd_figure_is_written_in_gi_with_the_exact_bytes() -> None:
    assert format_bytes(GI + 1) == f"1.00Gi ({GI + 1} bytes)"


def test_a_claim_over_the_budget_is_refused_naming_budget_namespace_usage_and_request() -> None:
    assert budget_refusal("team-a", "80Gi", 80 * GI, 80 * GI, 16 * GI) == (
        "namespace team-a: resource claims would hold 96Gi of GPU memory, over the budget of "
        f"80Gi (label {BUDGET_LABEL}): this claim asks for 16Gi and the namespace's claims "
        "hold 80Gi"
    )


@pytest.mark.parametrize(
    ("held", "asked"),
    [(64 * GI, 16 * GI), (0, 80 * GI), (100 * GI, 0)],
    ids=["exactly-the-budget", "one-claim-the-whole-budget", "asks-nothing-while-over"],
)
def test_a_claim_that_fits_or_asks_nothing_is_not_refused(held: int, asked: int) -> None:
    assert budget_refusal("team-a", "80Gi", 80 * GI, held, asked) == ""
