"""Decoding a resource.k8s.io/v1 ResourceClaim into our driver's allocation."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.dra import AllocatedDevice, ClaimRef
from kubegpu.core.dra_ports import ClaimLookupError
from kubegpu.kube.resource_claims import (
    allocation_from_claim,
    claim_from_object,
    pool_devices_from_claims,
)

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


def malformed(path: str, value: Any) -> dict[str, Any]:
    """A claim with ``value`` at the dotted ``path`` (a list index as a number)."""
    obj = claim_object(result("gpu-0", shareID="s", consumedCapacity={"memory": "1Gi"}))
    *parents, last = path.split(".")
    node: Any = obj
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(last) if last.isdigit() else last] = value
    return obj


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (malformed("metadata", "x"), "metadata is a str, not an object"),
        (malformed("status", "allocated"), "status is a str, not an object"),
        (malformed("status.allocation", ["x"]), "status.allocation is a list, not an object"),
        (malformed("status.allocation.devices", 1), "devices is a int, not an object"),
        (
            malformed("status.allocation.devices.results", "gpu-0"),
            "status.allocation.devices.results is a str, not a list",
        ),
        (
            malformed("status.allocation.devices.results.0", "gpu-0"),
            r"results\[0\] is a str, not an object",
        ),
        (malformed("status.allocation.devices.results.0.device", 0), r"\.device is a int"),
        (malformed("status.allocation.devices.results.0.pool", None), r"\.pool is a NoneType"),
        (malformed("status.allocation.devices.results.0.request", ["gpu"]), r"\.request is a"),
        (malformed("status.allocation.devices.results.0.shareID", 7), r"\.shareID is a int"),
        (
            malformed("status.allocation.devices.results.0.consumedCapacity", "1Gi"),
            r"\.consumedCapacity is a str, not an object",
        ),
    ],
    ids=[
        "metadata",
        "status",
        "allocation",
        "devices",
        "results",
        "result",
        "device",
        "pool",
        "request",
        "share-id",
        "consumed",
    ],
)
def test_a_malformed_claim_is_a_lookup_error_naming_the_field(
    obj: dict[str, Any], message: str
) -> None:
    # Each used to be an AttributeError or TypeError that failed the kubelet's whole call.
    with pytest.raises(ClaimLookupError, match=message):
        allocation_from_claim(obj, CLAIM, DRIVER)


def test_malformed_claims_are_skipped_by_steering_and_a_problem_for_ranking() -> None:
    good = claim_object(result("gpu-0"))
    bad = malformed("status.allocation.devices.results", "gpu-0")
    status = malformed("status", "allocated")
    assert pool_devices_from_claims([bad, "junk", status, good], DRIVER, "node-a") == [  # type: ignore[list-item]
        AllocatedDevice("gpu", "node-a", "gpu-0")
    ]
    ranked = claim_from_object(bad, DRIVER)
    assert "results is a str, not a list" in ranked.problem and ranked.allocated
    assert "status is a str" in claim_from_object(status, DRIVER).problem
    assert claim_from_object(malformed("metadata", 5), DRIVER).ref == ClaimRef("", "", "")


@pytest.mark.parametrize(
    ("ref", "problem"),
    [
        (ClaimRef("team-a", "train.v2-1", "0b1c-ff"), None),
        (ClaimRef("team-a", "a" * 253, "u"), None),
        (ClaimRef("t" * 63, "train", "u"), None),
        (ClaimRef("team-a", "a" * 254, "u"), "name"),
        (ClaimRef("t" * 64, "train", "u"), "namespace"),
        (ClaimRef("team.a", "train", "u"), "namespace"),
        (ClaimRef("team-a", "train.", "u"), "name"),
        (ClaimRef("team-a", "-train", "u"), "name"),
        (ClaimRef("team-a", "train\n", "u"), "name"),
        (ClaimRef("team-a", "../secrets/x", "u"), "name"),
        (ClaimRef("team-a", "train", ""), "uid"),
        (ClaimRef("team-a", "train", "a/b"), "uid"),
    ],
)
def test_claim_names_are_checked_as_kubernetes_checks_them(
    ref: ClaimRef, problem: str | None
) -> None:
    found = ref.problem()
    assert (found.split(" ", 1)[0] if found else None) == problem


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
