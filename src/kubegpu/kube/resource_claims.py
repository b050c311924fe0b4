"""ResourceClaims (``resource.k8s.io/v1``) read for the DRA driver, through lightkube.

lightkube's bundled models may lag the API server, so the type is a lightkube generic resource
and the JSON is decoded here by :func:`allocation_from_claim` (pure, table-tested): the
``status.allocation.devices.results`` of our driver, with a share's ``shareID`` and consumed
capacity (KEP-5075) converted to bytes and milli-cards, and the opaque configs for our driver in
``status.allocation.devices.config`` (the class's and the claim's, copied there by the
allocator), their parameters read by :mod:`kubegpu.kube.gpu_config`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

import httpx2 as httpx
import lightkube
from lightkube.generic_resource import create_namespaced_resource

from kubegpu.core.dra import (
    CAPACITY_COMPUTE,
    CAPACITY_MEMORY,
    KUBEGPU_NAMING,
    AllocatedDevice,
    ClaimAllocation,
    ClaimRef,
    DeviceConfig,
)
from kubegpu.core.dra_cluster import DeviceRequest, DraClaim
from kubegpu.core.dra_ports import ClaimLookupError
from kubegpu.kube.gpu_config import GpuConfigError, gpu_sharing, kind_of
from kubegpu.sharing.claim_budget import ClaimDemand, ClaimDemandError, DeviceAsk, RequestDemand
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


def _object(value: Any, claim: ClaimRef, where: str) -> Mapping[str, Any]:
    """``value`` when it is a JSON object; an absent one (None) is empty."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ClaimLookupError(
            f"resourceclaim {claim}: {where} is a {type(value).__name__}, not an object"
        )
    return value


def _text(result: Mapping[str, Any], key: str, claim: ClaimRef, where: str) -> str:
    value = result.get(key, "")
    if not isinstance(value, str):
        raise ClaimLookupError(
            f"resourceclaim {claim}: {where}.{key} is a {type(value).__name__}, not a string"
        )
    return value


def _ref_of(obj: Mapping[str, Any]) -> ClaimRef:
    """The claim ``obj`` says it is, for messages; fields of the wrong type read as empty."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    namespace, name, uid = (meta.get(k) for k in ("namespace", "name", "uid"))
    return ClaimRef(*(v if isinstance(v, str) else "" for v in (namespace, name, uid)))


def _allocation_of(obj: Mapping[str, Any], claim: ClaimRef) -> Mapping[str, Any]:
    """``status.allocation``, empty when the claim is not allocated; raises
    :class:`ClaimLookupError` for a status or allocation of the wrong type."""
    status = _object(obj.get("status"), claim, "status")
    return _object(status.get("allocation"), claim, "status.allocation")


def allocation_from_claim(obj: Mapping[str, Any], claim: ClaimRef, driver: str) -> ClaimAllocation:
    """Our driver's allocated devices in ``obj``; raises :class:`ClaimLookupError` when the
    object is another claim of the same name (UID differs), is not allocated, or is not shaped
    as a ResourceClaim where we read it (one malformed claim fails alone, never the call)."""
    if not isinstance(obj, Mapping):
        raise ClaimLookupError(f"resourceclaim {claim}: the API server sent no object")
    uid = _object(obj.get("metadata"), claim, "metadata").get("uid")
    if uid != claim.uid:
        raise ClaimLookupError(f"resourceclaim {claim}: the API server has UID {uid!r:.80}")
    allocation = _allocation_of(obj, claim)
    if not allocation:
        raise ClaimLookupError(f"resourceclaim {claim} is not allocated")
    return ClaimAllocation(
        claim,
        tuple(_our_results(allocation, claim, driver)),
        tuple(_our_configs(allocation, claim, driver)),
    )


CONFIG_SOURCES = ("FromClass", "FromClaim")


def _our_configs(allocation: Mapping[str, Any], claim: ClaimRef, driver: str) -> list[DeviceConfig]:
    """The opaque configs for ``driver`` in ``status.allocation.devices.config``, the class's
    before the claim's (the claim's take precedence, each list in its order). One whose
    parameters cannot be read is kept with its ``problem``: the driver refuses the claim if
    it applies to a device of ours, rather than drop a setting it was given."""
    devices_of = _object(allocation.get("devices"), claim, "status.allocation.devices")
    entries = devices_of.get("config")
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise ClaimLookupError(
            f"resourceclaim {claim}: status.allocation.devices.config is a "
            f"{type(entries).__name__}, not a list"
        )
    found: list[DeviceConfig] = []
    for i, raw in enumerate(entries):
        where = f"status.allocation.devices.config[{i}]"
        entry = _object(raw, claim, where)
        requests = entry.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise ClaimLookupError(
                f"resourceclaim {claim}: {where}.requests is not a list of names"
            )
        source = _text(entry, "source", claim, where)
        problem = None if source in CONFIG_SOURCES else f"source {source!r:.40} is not known"
        opaque = entry.get("opaque")
        if opaque is None:
            # A kind of config newer than this driver: it may be meant for us, so it is not
            # passed over (NVIDIA's driver refuses it too).
            problem = problem or "it has no opaque parameters, the only config kubegpu reads"
            found.append(DeviceConfig(i, source, tuple(requests), "?", problem=problem))
            continue
        opaque = _object(opaque, claim, f"{where}.opaque")
        if opaque.get("driver") != driver:
            continue  # another driver's, for its own devices of the claim
        parameters = opaque.get("parameters")
        sharing = None
        if problem is None:
            try:
                sharing = gpu_sharing(parameters)
            except GpuConfigError as exc:
                problem = str(exc)
        found.append(
            DeviceConfig(i, source, tuple(requests), kind_of(parameters), sharing, problem)
        )
    return sorted(found, key=lambda c: c.source != "FromClass")


def _our_results(
    allocation: Mapping[str, Any], claim: ClaimRef, driver: str
) -> list[AllocatedDevice]:
    devices_of = _object(allocation.get("devices"), claim, "status.allocation.devices")
    results = devices_of.get("results")
    if results is None:
        results = []
    if not isinstance(results, list):
        raise ClaimLookupError(
            f"resourceclaim {claim}: status.allocation.devices.results is a "
            f"{type(results).__name__}, not a list"
        )
    devices: list[AllocatedDevice] = []
    for i, raw in enumerate(results):
        where = f"status.allocation.devices.results[{i}]"
        result = _object(raw, claim, where)
        if result.get("driver") != driver:
            continue
        consumed = _object(result.get("consumedCapacity"), claim, f"{where}.consumedCapacity")
        share_id = result.get("shareID")
        if share_id is not None and not isinstance(share_id, str):
            raise ClaimLookupError(
                f"resourceclaim {claim}: {where}.shareID is a {type(share_id).__name__}, "
                "not a string"
            )
        devices.append(
            AllocatedDevice(
                request=_text(result, "request", claim, where),
                pool=_text(result, "pool", claim, where),
                device=_text(result, "device", claim, where),
                share_id=share_id or None,
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
        if not isinstance(obj, Mapping):
            continue
        claim = _ref_of(obj)
        try:
            allocation = _allocation_of(obj, claim)
            if not allocation:
                continue
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
    obj: Mapping[str, Any], driver: str, classes: frozenset[str] = KUBEGPU_NAMING.device_classes
) -> DraClaim:
    """A ResourceClaim as the extender ranks with it: its requests for ``classes`` and, when
    allocated, ``driver``'s results (the same decoding prepare and steering use). A request
    that cannot be ranked leaves the claim with a ``problem`` naming it, never an exception."""
    ref = _ref_of(obj)
    problem = ""
    allocated = False
    devices: tuple[AllocatedDevice, ...] = ()
    try:
        allocation = _allocation_of(obj, ref)
        allocated = bool(allocation)
        if allocation:
            devices = tuple(_our_results(allocation, ref, driver))
    except ClaimLookupError as exc:
        problem = str(exc)
    spec = obj.get("spec")
    wanted = spec.get("devices") if isinstance(spec, Mapping) else None
    raw_requests = wanted.get("requests") if isinstance(wanted, Mapping) else None
    requests: list[DeviceRequest] = []
    for raw in raw_requests if isinstance(raw_requests, list) else []:
        if not isinstance(raw, Mapping):
            continue
        try:
            request = _device_request(raw, classes)
        except RequestError as exc:
            problem = problem or f"resourceclaim {ref.namespace}/{ref.name}: {exc}"
            continue
        if request is not None:
            requests.append(request)
    return DraClaim(ref, tuple(requests), allocated, devices, problem)


def _demand_ask(
    exactly: Mapping[str, Any], class_drivers: Mapping[str, str], where: str
) -> DeviceAsk | None:
    """One ``exactly`` request or ``firstAvailable`` subrequest as a :class:`DeviceAsk`; None
    for a class that is not a GPU class of ``class_drivers``."""
    driver = class_drivers.get(str(exactly.get("deviceClassName", "")))
    if driver is None:
        return None
    mode = exactly.get("allocationMode") or "ExactCount"
    count: int | None = None
    if mode != "All":
        count = exactly.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ClaimDemandError(f"{where}: count {count!r:.40} is not a positive integer")
    capacity = exactly.get("capacity") or {}
    wanted = capacity.get("requests") if isinstance(capacity, Mapping) else None
    memory = None
    if isinstance(wanted, Mapping) and CAPACITY_MEMORY in wanted:
        try:
            memory = _request_quantity(wanted, CAPACITY_MEMORY)
        except RequestError as exc:
            raise ClaimDemandError(f"{where}: capacity.requests.memory: {exc}") from None
    return DeviceAsk(driver, count, memory)


def claim_demand(obj: Mapping[str, Any], class_drivers: Mapping[str, str]) -> ClaimDemand:
    """What a ResourceClaim asks of the GPU classes in ``class_drivers`` (class -> driver), for
    the namespace's GPU-memory budget (:mod:`kubegpu.sharing.claim_budget`). Raises
    :class:`ClaimDemandError` for a request of a GPU class that cannot be read."""
    ref = _ref_of(obj)
    meta = obj.get("metadata")
    deleting = isinstance(meta, Mapping) and bool(meta.get("deletionTimestamp"))
    spec = obj.get("spec")
    wanted = spec.get("devices") if isinstance(spec, Mapping) else None
    raw_requests = wanted.get("requests") if isinstance(wanted, Mapping) else None
    requests: list[RequestDemand] = []
    for raw in raw_requests if isinstance(raw_requests, list) else []:
        if not isinstance(raw, Mapping):
            continue
        name = str(raw.get("name", ""))
        where = f"resourceclaim {ref.namespace}/{ref.name} request {name}"
        exactly = raw.get("exactly")
        if isinstance(exactly, Mapping):
            subrequests: list[tuple[str, Mapping[str, Any]]] = [(where, exactly)]
        else:
            subrequests = [
                (f"{where}/{sub.get('name', '')}", sub)
                for sub in raw.get("firstAvailable") or []
                if isinstance(sub, Mapping)
            ]
        asks = [_demand_ask(sub, class_drivers, at) for at, sub in subrequests]
        found = tuple(a for a in asks if a is not None)
        if found:
            requests.append(RequestDemand(name, found))
    return ClaimDemand(ref.namespace, ref.name, ref.uid, tuple(requests), deleting)


class LightkubeResourceClaimSource:
    def __init__(self, client: lightkube.AsyncClient) -> None:
        self.client = client

    async def allocation(self, claim: ClaimRef, driver: str) -> ClaimAllocation:
        # The names go into the request's URL: only names Kubernetes could have given.
        problem = claim.problem()
        if problem is not None:
            raise ClaimLookupError(f"resourceclaim {claim}: {problem}")
        try:
            obj = await self.client.get(ResourceClaim, claim.name, namespace=claim.namespace)
        except lightkube.ApiError as exc:
            # Any answer but the object (403, 429, 500, ...) fails this claim alone; the
            # kubelet retries it.
            status = exc.status
            if status.code == 404:
                raise ClaimLookupError(f"resourceclaim {claim} not found") from None
            reason = f" {status.reason}" if status.reason else ""
            raise ClaimLookupError(
                f"resourceclaim {claim}: the API server answered {status.code}{reason}: "
                f"{status.message or 'no message'}"
            ) from None
        except httpx.HTTPError as exc:
            # No answer at all: refused, dropped, timed out.
            raise ClaimLookupError(
                f"resourceclaim {claim}: cannot read it from the API server: "
                f"{type(exc).__name__}: {str(exc) or 'no detail'}"
            ) from None
        return allocation_from_claim(dict(obj), claim, driver)

    async def pool_allocations(self, driver: str, pool: str) -> list[AllocatedDevice]:
        # Claims carry no field that selects them by node or pool: list them all.
        objs = [dict(obj) async for obj in self.client.list(ResourceClaim, namespace="*")]
        return pool_devices_from_claims(objs, driver, pool)
