"""Decoding a resource.k8s.io/v1 ResourceClaim into our driver's allocation."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.dra import AllocatedDevice, ClaimRef
from kubegpu.core.dra_ports import ClaimLookupError
from kubegpu.kube.resource_claims import allocation_from_claim, pool_devices_from_claims

DRIVER = "gpu.kubegpu.io"
CLAIM = ClaimRef("team-a", "train", "uid-1")


def claim_object(*results: dict[str, Any], uid: str = "uid-1") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "train", "namespace": "team-a", "uid": uid},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def result(device: str, **extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": device, **extra}


def test_whole_device_results_of_our_driver_only() -> None:
    obj = claim_object(
        result("gpu-0"), {**result("nic-0"), "driver": "net.example.com", "request": "nic"}
    )
    allocation = allocation_from_claim(obj, CLAIM, DRIVER)
    assert allocation.claim == CLAIM
    assert allocation.devices == (AllocatedDevice("gpu", "node-a", "gpu-0"),)


def test_a_share_carries_its_share_id_and_consumed_capacity_in_our_units() -> None:
    obj = claim_object(
        result("gpu-1", shareID="6f1c", consumedCapacity={"memory": "4Gi", "compute": "250"})
    )
    (device,) = allocation_from_claim(obj, CLAIM, DRIVER).devices
    assert device == AllocatedDevice(
        "gpu", "node-a", "gpu-1", share_id="6f1c", memory_bytes=4 * 2**30, compute_milli=250
    )


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (claim_object(result("gpu-0"), uid="uid-2"), "has UID 'uid-2'"),
        ({"metadata": {"uid": "uid-1"}, "status": {}}, "is not allocated"),
        (
            claim_object(result("gpu-0", consumedCapacity={"memory": "lots"})),
            "consumedCapacity.memory",
        ),
    ],
    ids=["recreated-claim", "unallocated", "bad-quantity"],
)
def test_claims_that_cannot_be_prepared_say_why(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimLookupError, match=message):
        allocation_from_claim(obj, CLAIM, DRIVER)


def test_pool_devices_of_every_allocated_claim_of_our_driver_and_pool() -> None:
    share = result("gpu-1", shareID="s-1", consumedCapacity={"memory": "4Gi", "compute": "250"})
    other_claim = claim_object(result("gpu-0"), uid="uid-2")
    other_claim["metadata"].update(name="infer", namespace="team-b")
    pending = claim_object(uid="uid-3")
    del pending["status"]
    bad = claim_object(result("gpu-1", shareID="s-2", consumedCapacity={"memory": "lots"}))
    objs = [
        claim_object(
            share,
            {**result("gpu-0"), "pool": "node-b"},  # another node's pool
            {**result("nic-0"), "driver": "net.example.com"},  # another driver
        ),
        other_claim,
        pending,  # not allocated: takes nothing
        bad,  # unreadable: skipped, the others still count
    ]
    assert pool_devices_from_claims(objs, DRIVER, "node-a") == [
        AllocatedDevice("gpu", "node-a", "gpu-1", "s-1", 4 * 2**30, 250),
        AllocatedDevice("gpu", "node-a", "gpu-0"),
    ]
