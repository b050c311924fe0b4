"""The annotation codec: round trips, canonical form, and strict errors naming what is wrong."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    INVENTORY_ANNOTATION,
    AllocationDecision,
    AnnotationError,
    CardShare,
    ContainerAllocation,
    GpuRecord,
    NodeGpuInventory,
    decode_allocation,
    decode_inventory,
    encode_allocation,
    encode_inventory,
)

DECISION = AllocationDecision(
    node="node-a",
    cards=(CardShare("GPU-1", 1, 300, 10240),),
    containers=(ContainerAllocation("main", False, (CardShare("GPU-1", 1, 300, 10240),)),),
    decided_at="2026-11-22T04:00:00.000000Z",
    policy="kubegpu",
    shared=True,
)


def test_inventory_round_trips_and_is_canonical() -> None:
    inv = NodeGpuInventory(
        (GpuRecord("GPU-b", 1, "H100", 81559, False), GpuRecord("GPU-a", 0, "H100", 81559))
    )
    text = encode_inventory(inv)
    assert decode_inventory(text).gpus == tuple(sorted(inv.gpus, key=lambda g: g.index))
    assert encode_inventory(decode_inventory(text)) == text
    assert json.loads(text)["v"] == 1


def test_allocation_round_trips() -> None:
    assert decode_allocation(encode_allocation(DECISION)) == DECISION


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d.update(v=2), "unsupported version 2"),
        (lambda d: d.pop("node"), "node is missing"),
        (lambda d: d.update(mode="half"), "mode must be"),
        (lambda d: d["gpus"][0].update(computeMilli=1001), "computeMilli must be in 0..1000"),
        (lambda d: d["gpus"][0].update(memoryMiB="lots"), "gpus[0].memoryMiB must be int"),
        (lambda d: d["gpus"][0].update(uuid="GPU 1"), "contains a space"),
        (lambda d: d["gpus"].append(dict(d["gpus"][0], uuid="GPU-2")), "exactly one card"),
        (lambda d: d["containers"][0]["gpus"][0].update(uuid="GPU-9"), "not in gpus"),
        (lambda d: d.update(gpus=[]), "gpus is empty"),
        (lambda d: d["gpus"][0].update(index=True), "index must be int"),
    ],
    ids=[
        "version",
        "no-node",
        "mode",
        "compute",
        "memory-type",
        "uuid-space",
        "two-cards",
        "container-card",
        "no-cards",
        "bool-index",
    ],
)
def test_malformed_allocation_names_the_annotation_and_the_field(mutate, problem) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(encode_allocation(DECISION))
    mutate(doc)
    with pytest.raises(AnnotationError) as excinfo:
        decode_allocation(json.dumps(doc))
    assert excinfo.value.annotation == ALLOCATION_ANNOTATION
    assert problem in str(excinfo.value)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON"),
        ("[]", "document must be an object"),
        (7, "must be a string"),
        (
            '{"v":1,"gpus":[{"uuid":"a","index":0,"model":"m","memoryMiB":1,"healthy":true},'
            '{"uuid":"a","index":1,"model":"m","memoryMiB":1,"healthy":true}]}',
            "duplicate uuid",
        ),
    ],
)
def test_malformed_inventory_is_a_typed_error(text: object, problem: str) -> None:
    with pytest.raises(AnnotationError) as excinfo:
        decode_inventory(text)
    assert excinfo.value.annotation == INVENTORY_ANNOTATION
    assert problem in str(excinfo.value)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "v",
                        "node",
                        "mode",
                        "gpus",
                        "containers",
                        "uuid",
                        "index",
                        "computeMilli",
                        "memoryMiB",
                        "name",
                        "init",
                        "decidedAt",
                        "policy",
                        "model",
                        "healthy",
                    ]
                ),
                inner,
                max_size=8,
            )
        ),
        max_leaves=12,
    )
)
def test_any_json_decodes_or_raises_annotation_error(doc: object) -> None:
    for decode in (decode_allocation, decode_inventory):
        with contextlib.suppress(AnnotationError):
            decode(json.dumps(doc))
