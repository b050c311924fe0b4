"""The devices allocated from each pool of our driver, kept current by a list + watch of every
ResourceClaim: what a steering DRA driver orders its devices from (``kubegpu.dra.steering``).

Polling (one list of all claims per node per ``dra.steering.intervalS``) left the published
order stale for up to an interval: on the real allocator, every claim allocated on the node in
that time met the old order, and on a cluster replay that lost most of what steering recovers in
the simulator (docs/benchmarks.md, issue 27). A watch hears an allocation as soon as the
scheduler writes it, so the driver re-orders before the next pod is allocated, and costs one
stream instead of a full list per interval.

* :meth:`WatchedPoolAllocations.pool_allocations` answers the
  :class:`~kubegpu.core.dra_ports.PoolAllocationSource` port from memory (no API call);
* :meth:`WatchedPoolAllocations.changed` is an event set whenever a claim holding (or having
  held) a device of that pool changes: the driver re-steers at once when it is set;
* claims are decoded by the one decoder of the wire format
  (:func:`~kubegpu.kube.resource_claims.pool_devices_from_claims`); a dropped watch resumes
  after a bounded backoff, 410 Gone relists (:mod:`kubegpu.kube.list_watch`), and a relist
  wakes every pool, since anything may have changed meanwhile.

Claims have no field that selects them by node or driver, so all are watched (RBAC: ``list``
and ``watch`` on ``resourceclaims``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import lightkube

from kubegpu.core.dra import AllocatedDevice
from kubegpu.kube.list_watch import Backoff, keep_listing_and_watching, watch_events
from kubegpu.kube.resource_claims import ResourceClaim, pool_devices_from_claims

log = logging.getLogger(__name__)

_LABEL = "resourceclaims"


class WatchedPoolAllocations:
    """Every claim's results of ``driver``, by pool, kept current by list + watch."""

    def __init__(
        self,
        client: lightkube.AsyncClient,
        driver: str,
        *,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        watch_timeout_s: int = 300,
    ) -> None:
        self.client = client
        self.driver = driver
        self.backoff = backoff or Backoff()
        self._sleep = sleep
        self.watch_timeout_s = watch_timeout_s
        # (namespace, name) -> the claim's devices of our driver (any pool)
        self._claims: dict[tuple[str, str], list[AllocatedDevice]] = {}
        self._by_pool: dict[str, set[tuple[str, str]]] = {}
        self._events: dict[str, asyncio.Event] = {}
        self._versions: dict[str, str | None] = {}
        self._task: asyncio.Task[None] | None = None
        self.synced = asyncio.Event()
        self.relists = 0
        self.events_seen = 0

    # ------------------------------------------------------------------ the port
    def start(self) -> None:
        if self._task is None:
            log.info("steering: watching resourceclaims for the pools of %s", self.driver)
            self._task = asyncio.create_task(
                keep_listing_and_watching(
                    _LABEL,
                    self._versions,
                    self._relist,
                    self._watch,
                    self.backoff,
                    self._sleep,
                ),
                name="kubegpu-pool-allocations",
            )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def pool_allocations(self, driver: str, pool: str) -> list[AllocatedDevice]:
        """What the allocator counts as taken from ``pool`` now, as far as the watch has
        heard; raises LookupError before the first list (the driver keeps its order)."""
        if driver != self.driver:
            raise LookupError(f"watching claims of driver {self.driver}, not {driver}")
        if not self.synced.is_set():
            raise LookupError("resourceclaims not listed yet")
        found: list[AllocatedDevice] = []
        for key in sorted(self._by_pool.get(pool, ())):
            found.extend(d for d in self._claims[key] if d.pool == pool)
        return found

    def changed(self, pool: str) -> asyncio.Event:
        """Set whenever the allocations of ``pool`` may have changed; the caller clears it."""
        event = self._events.get(pool)
        if event is None:
            event = self._events[pool] = asyncio.Event()
            if self.synced.is_set():
                event.set()
        return event

    # ------------------------------------------------------------------ applying claims
    def apply(self, obj: Mapping[str, Any], *, deleted: bool = False) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        old = self._claims.pop(key, [])
        new = [] if deleted else pool_devices_of(obj, self.driver)
        if new:
            self._claims[key] = new
        if old == new:
            return
        touched = {d.pool for d in old} | {d.pool for d in new}
        for device in old:
            self._by_pool.get(device.pool, set()).discard(key)
        for device in new:
            self._by_pool.setdefault(device.pool, set()).add(key)
        for pool in touched:
            event = self._events.get(pool)
            if event is not None:
                event.set()

    async def _relist(self) -> str:
        listing = self.client.list(ResourceClaim, namespace="*")
        objects = [dict(obj) async for obj in listing]
        self._claims.clear()
        self._by_pool.clear()
        for obj in objects:
            self.apply(obj)
        self.relists += 1
        self.synced.set()
        for event in self._events.values():  # anything may have changed meanwhile
            event.set()
        version = str(listing.resourceVersion)
        log.info("steering: listed %d resourceclaims at version %s", len(objects), version)
        return version

    async def _watch(self) -> None:
        stream = watch_events(
            self.client,
            ResourceClaim,
            namespace="*",
            resource_version=self._versions[_LABEL],
            server_timeout=self.watch_timeout_s,
        )
        async for event, data in stream:
            rv = (data.get("metadata") or {}).get("resourceVersion")
            if rv:
                self._versions[_LABEL] = rv
            if event == "BOOKMARK":
                continue
            self.events_seen += 1
            self.apply(data, deleted=event == "DELETED")


def pool_devices_of(obj: Mapping[str, Any], driver: str) -> list[AllocatedDevice]:
    """One claim's allocated devices of ``driver``, every pool (none when unallocated or
    unreadable: such a claim cannot be prepared either)."""
    pools = {
        r.get("pool")
        for r in (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        )
        or []
        if isinstance(r, Mapping) and r.get("driver") == driver
    }
    found: list[AllocatedDevice] = []
    for pool in sorted(p for p in pools if isinstance(p, str)):
        found.extend(pool_devices_from_claims([obj], driver, pool))
    return found
