"""ResourceClaims (``resource.k8s.io/v1``) read for the DRA driver, through lightkube.

lightkube's bundled models may lag the API server, so the type is a lightkube generic resource
and the JSON is decoded here by :func:`allocation_from_claim` (pure, table-tested): the
``status.allocation.devices.results`` of our driver, with a share's ``shareID`` and consumed
capacity (KEP-5075) converted to bytes and milli-cards.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

import lightkube
from lightkube.generic_resource import create_namespaced_resource

from kubegpu.core.dra import (
    CAPACITY_COMPUTE,
    CAPACITY_MEMORY,
    AllocatedDevice,
    ClaimAllocation,
    ClaimRef,
)
from kubegpu.core.dra_cluster import KUBEGPU_DEVICE_CLASSES, DeviceRequest, DraClaim
from kubegpu.core.dra_ports import ClaimLookupError
from kubegpu.sharing.resources import RequestError, parse_quantity

log = logging.getLogger(__name__)

ResourceClaim = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaim", "resourceclaims"
)


def _ceil(value: Decimal) -> int:
    return math.ceil(value)


def _consumed(claim: ClaimRef, raw: Any, name: str, scale: int) -> int | None:
    if not isinstance(raw, Mapping) or name not in raw:
        return None
    try:
        return _ceil(parse_quantity(raw[name]) * scale)
    except RequestError as exc:
        raise ClaimLookupError(f"resourceclaim {claim}: consumedCapacity.{name}: {exc}") from None


def allocation_from_claim(obj: Mapping[str, Any], claim: ClaimRef, driver: str) -> ClaimAllocation:
    """Our driver's allocated devices in ``obj``; raises :class:`ClaimLookupError` when the
    object is another claim of the same name (UID differs) or is not allocated."""
    uid = (obj.get("metadata") or {}).get("uid")
    if uid != claim.uid:
        raise ClaimLookupError(f"resourceclaim {claim}: the API server has UID {uid!r}")
    allocation = (obj.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimLookupError(f"resourceclaim {claim} is not allocated")
    return ClaimAllocation(claim, tuple(_our_results(allocation, claim, driver)))


def _our_results(
    allocation: Mapping[str, Any], claim: ClaimRef, driver: str
) -> list[AllocatedDevice]:
    results = ((allocation.get("devices") or {}).get("results")) or []
    devices: list[AllocatedDevice] = []
    for result in results:
        if result.get("driver") != driver:
            continue
        consumed = result.get("consumedCapacity")
        devices.append(
            AllocatedDevice(
                request=str(result.get("request", "")),
                pool=str(result.get("pool", "")),
                device=str(result.get("device", "")),
                share_id=str(result["shareID"]) if result.get("shareID") else None,
                memory_bytes=_consumed(claim, consumed, CAPACITY_MEMORY, 1),
                # The slice publishes compute in milli-cards already (dra/slices.py).
                compute_milli=_consumed(claim, consumed, CAPACITY_COMPUTE, 1),
            )
        )
    return devices


def pool_devices_from_claims(
    objs: Iterable[Mapping[str, Any]], driver: str, pool: str
) -> list[AllocatedDevice]:
    """The devices of ``pool`` allocated by ``driver`` in any of ``objs`` (ResourceClaim JSON);
    an unallocated claim has none. A claim whose consumed capacity cannot be read is skipped
    with a warning: it cannot be prepared either, and one bad object must not stop the rest."""
    found: list[AllocatedDevice] = []
    for obj in objs:
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            continue
        meta = obj.get("metadata") or {}
        claim = ClaimRef(
            str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", ""))
        )
        try:
            devices = _our_results(allocation, claim, driver)
        except ClaimLookupError as exc:
            log.warning("steering: ignoring a claim whose allocation cannot be read: %s", exc)
            continue
        found.extend(d for d in devices if d.pool == pool)
    return found


def _request_quantity(raw: Mapping[str, Any], name: str) -> int | None:
    if name not in raw:
        return None
    return _ceil(parse_quantity(raw[name]))


def _device_request(request: Mapping[str, Any], classes: frozenset[str]) -> DeviceRequest | None:
    """One ``spec.devices.requests`` entry as a :class:`DeviceRequest`, None when it asks for
    none of ``classes``; raises :class:`RequestError` for a request of ours that cannot be
    ranked."""
    name = str(request.get("name", ""))
    exactly = request.get("exactly")
    if not isinstance(exactly, Mapping):
        alternatives = request.get("firstAvailable") or []
        if any(
            isinstance(a, Mapping) and a.get("deviceClassName") in classes for a in alternatives
        ):
            raise RequestError(f"request {name}: firstAvailable is not ranked")
        return None
    if exactly.get("deviceClassName") not in classes:
        return None
    mode = exactly.get("allocationMode") or "ExactCount"
    if mode != "ExactCount":
        raise RequestError(f"request {name}: allocationMode {mode} is not ranked")
    count = exactly.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise RequestError(f"request {name}: count {count!r} is not a positive integer")
    capacity = exactly.get("capacity") or {}
    wanted = (capacity.get("requests") if isinstance(capacity, Mapping) else capacity) or {}
    if not isinstance(wanted, Mapping):
        raise RequestError(f"request {name}: capacity.requests is not an object")
    return DeviceRequest(
        name,
        count,
        # Bytes, and milli-cards already (the slice publishes compute in milli, dra/slices.py).
        memory_bytes=_request_quantity(wanted, CAPACITY_MEMORY),
        compute_milli=_request_quantity(wanted, CAPACITY_COMPUTE),
    )


def claim_from_object(
    obj: Mapping[str, Any], driver: str, classes: frozenset[str] = KUBEGPU_DEVICE_CLASSES
) -> DraClaim:
    """A ResourceClaim as the extender ranks with it: its requests for ``classes`` and, when
    allocated, ``driver``'s results (the same decoding prepare and steering use). A request
    that cannot be ranked leaves the claim with a ``problem`` naming it, never an exception."""
    meta = obj.get("metadata") or {}
    ref = ClaimRef(
        str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", ""))
    )
    allocation = (obj.get("status") or {}).get("allocation")
    problem = ""
    devices: tuple[AllocatedDevice, ...] = ()
    if allocation:
        try:
            devices = tuple(_our_results(allocation, ref, driver))
        except ClaimLookupError as exc:
            problem = str(exc)
    requests: list[DeviceRequest] = []
    for raw in ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if not isinstance(raw, Mapping):
            continue
        try:
            request = _device_request(raw, classes)
        except RequestError as exc:
            problem = problem or f"resourceclaim {ref.namespace}/{ref.name}: {exc}"
            continue
        if request is not None:
            requests.append(request)
    return DraClaim(ref, tuple(requests), bool(allocation), devices, problem)


class LightkubeResourceClaimSource:
    def __init__(self, client: lightkube.AsyncClient) -> None:
        self.client = client

    async def allocation(self, claim: ClaimRef, driver: str) -> ClaimAllocation:
        try:
            obj = await self.client.get(ResourceClaim, claim.name, namespace=claim.namespace)
        except lightkube.ApiError as exc:
            if exc.status.code == 404:
                raise ClaimLookupError(f"resourceclaim {claim} not found") from None
            raise
        return allocation_from_claim(dict(obj), claim, driver)

    async def pool_allocations(self, driver: str, pool: str) -> list[AllocatedDevice]:
        # Claims carry no field that selects them by node or pool: list them all.
        objs = [dict(obj) async for obj in self.client.list(ResourceClaim, namespace="*")]
        return pool_devices_from_claims(objs, driver, pool)
