"""The annotation codec: round trips, canonical form, and strict errors naming what is wrong."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    INVENTORY_ANNOTATION,
    MIG_DEVICES_ANNOTATION,
    AllocationDecision,
    AnnotationError,
    CardShare,
    ContainerAllocation,
    GpuRecord,
    MigCardRecord,
    MigDeviceRecord,
    NodeGpuInventory,
    NodeMigDevices,
    decode_allocation,
    decode_inventory,
    decode_mig_devices,
    encode_allocation,
    encode_inventory,
    encode_mig_devices,
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


MIG = NodeMigDevices(
    (
        MigCardRecord(
            "GPU-b",
            1,
            "NVIDIA H100 80GB HBM3",
            81559,
            True,
            (
                MigDeviceRecord("MIG-2", "2g.20gb", 4, 2, 20096, 2, "nvidia.com/mig-2g.20gb"),
                MigDeviceRecord("MIG-1", "3g.40gb", 0, 4, 40448, 1, "nvidia.com/mig-3g.40gb"),
                MigDeviceRecord("MIG-3", "1g.10gb", 6, 1, 9984, 3, "", healthy=False),
            ),
        ),
        MigCardRecord("GPU-a", 0, "NVIDIA H100 80GB HBM3", 81559, False, ()),
    )
)


def test_mig_devices_round_trip_sorted_and_canonical() -> None:
    text = encode_mig_devices(MIG)
    decoded = decode_mig_devices(text)
    assert [g.index for g in decoded.gpus] == [0, 1]
    assert [d.uuid for d in decoded.gpus[1].devices] == ["MIG-1", "MIG-2", "MIG-3"]
    assert set(decoded.gpus[1].devices) == set(MIG.gpus[0].devices)
    assert encode_mig_devices(decoded) == text
    assert decoded.resources == {"nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"}
    doc = json.loads(text)
    assert doc["v"] == 1
    assert doc["gpus"][1]["migDevices"][0] == {
        "uuid": "MIG-1",
        "profile": "3g.40gb",
        "start": 0,
        "slices": 4,
        "memoryMiB": 40448,
        "gpuInstanceId": 1,
        "resource": "nvidia.com/mig-3g.40gb",
        "healthy": True,
    }


def _device(doc: dict[str, Any], i: int = 0) -> dict[str, Any]:
    """The ``i``-th MIG device (by placement) of MIG's card 1 in its JSON."""
    device: dict[str, Any] = doc["gpus"][1]["migDevices"][i]
    return device


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d.update(v=2), "unsupported version 2"),
        (lambda d: d.pop("gpus"), "gpus is missing"),
        (lambda d: d["gpus"][1].pop("migDevices"), "gpus[1].migDevices is missing"),
        (lambda d: d["gpus"][1].update(migDevices={}), "gpus[1].migDevices must be list"),
        (lambda d: d["gpus"][1]["migDevices"].append(3), "gpus[1].migDevices[3] must be an object"),
        (lambda d: _device(d).update(uuid="MIG 1"), "gpus[1].migDevices[0].uuid 'MIG 1' contains"),
        (lambda d: _device(d).update(profile=""), "gpus[1].migDevices[0].profile is empty"),
        (lambda d: _device(d).update(start=-1), "gpus[1].migDevices[0].start out of range"),
        (lambda d: _device(d).update(slices=0), "gpus[1].migDevices[0].slices must be at least"),
        (lambda d: _device(d).update(memoryMiB="x"), "migDevices[0].memoryMiB must be int"),
        (lambda d: _device(d).update(healthy=1), "gpus[1].migDevices[0].healthy must be bool"),
        (lambda d: _device(d).update(resource=None), "migDevices[0].resource must be str"),
        (lambda d: _device(d).update(gpuInstanceId=2), "gpus[1]: duplicate gpuInstanceId 2"),
        (lambda d: _device(d).update(slices=5), "MIG devices MIG-1 and MIG-2 share memory slice 4"),
        (lambda d: _device(d, 1).update(uuid="MIG-1"), "duplicate MIG device uuid 'MIG-1'"),
        (lambda d: d["gpus"][0].update(index=1), "duplicate index 1"),
        (lambda d: d["gpus"][0].update(uuid="GPU-b"), "duplicate uuid 'GPU-b'"),
    ],
    ids=[
        "version",
        "no-gpus",
        "no-devices",
        "devices-type",
        "device-type",
        "uuid-space",
        "no-profile",
        "negative-start",
        "no-slices",
        "memory-type",
        "health-type",
        "resource-type",
        "same-gpu-instance",
        "overlap",
        "same-mig-uuid",
        "same-index",
        "same-card",
    ],
)
def test_malformed_mig_devices_name_the_annotation_field_and_value(mutate, problem) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(encode_mig_devices(MIG))
    mutate(doc)
    with pytest.raises(AnnotationError) as excinfo:
        decode_mig_devices(json.dumps(doc))
    assert excinfo.value.annotation == MIG_DEVICES_ANNOTATION
    assert str(excinfo.value).startswith(f"annotation {MIG_DEVICES_ANNOTATION}: ")
    assert problem in str(excinfo.value)


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
                        "migDevices",
                        "profile",
                        "start",
                        "slices",
                        "gpuInstanceId",
                        "resource",
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
    for decode in (decode_allocation, decode_inventory, decode_mig_devices):
        with contextlib.suppress(AnnotationError):
            decode(json.dumps(doc))
