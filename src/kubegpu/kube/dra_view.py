"""The extender's view of our driver's ResourceSlices and of all ResourceClaims: list + watch.

What the extender ranks DRA nodes with (``kubegpu.extender.dra_rank``): each slice decoded by
:func:`~kubegpu.kube.resource_slices.slice_devices` and each claim by
:func:`~kubegpu.kube.resource_claims.claim_from_object` (the one decoder of each wire format),
kept current by one list, then a watch from the list's resourceVersion, per kind; a dropped
watch resumes after a bounded backoff, 410 Expired relists, as the node and pod view does
(:mod:`kubegpu.kube.view`). Slices are selected by ``spec.driver``; claims have no field that
selects them by driver, so all are listed.

It starts only when :meth:`DraClusterView.start` is first called (by the first ``/prioritize-dra``
call): an extender whose kube-scheduler has no DRA entry never lists these kinds, and needs no
RBAC for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import lightkube

from kubegpu.core.dra import KUBEGPU_NAMING, AllocatedDevice, DraNaming
from kubegpu.core.dra_cluster import DraClaim, NodeSlices, SliceDevice, newest_devices
from kubegpu.kube.list_watch import Backoff, keep_listing_and_watching, watch_events
from kubegpu.kube.resource_claims import ResourceClaim, claim_from_object
from kubegpu.kube.resource_slices import ResourceSlice, slice_devices

log = logging.getLogger(__name__)

_Kind = type[Any]


class DraClusterView:
    """Our driver's slices by node and every claim, kept current by list + watch."""

    def __init__(
        self,
        client: lightkube.AsyncClient,
        naming: DraNaming = KUBEGPU_NAMING,
        *,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        watch_timeout_s: int = 300,
    ) -> None:
        self.client = client
        self.naming = naming
        self.driver = naming.driver
        self.backoff = backoff or Backoff()
        self._sleep = sleep
        self.watch_timeout_s = watch_timeout_s
        self.slices: dict[str, NodeSlices] = {}  # slice name -> its devices
        self._by_node: dict[str, set[str]] = {}  # node -> slice names
        self.claims: dict[tuple[str, str], DraClaim] = {}
        self._by_pool: dict[str, set[tuple[str, str]]] = {}  # pool -> claims holding its devices
        self.synced = asyncio.Event()
        self._listed: set[str] = set()
        self._versions: dict[str, str | None] = {}
        self._task: asyncio.Task[None] | None = None
        self.relists = 0

    # ------------------------------------------------------------------ the port
    def start(self) -> None:
        if self._task is None:
            log.info(
                "ranking DRA nodes: watching resourceslices of %s and resourceclaims", self.driver
            )
            self._task = asyncio.create_task(self.run(), name="kubegpu-dra-view")

    def devices_on(self, node: str) -> tuple[SliceDevice, ...]:
        return newest_devices(self.slices[n] for n in self._by_node.get(node, ()))

    def allocated_in(self, pool: str) -> list[AllocatedDevice]:
        found: list[AllocatedDevice] = []
        for key in sorted(self._by_pool.get(pool, ())):
            found.extend(d for d in self.claims[key].devices if d.pool == pool)
        return found

    def claim(self, namespace: str, name: str) -> DraClaim | None:
        return self.claims.get((namespace, name))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ------------------------------------------------------------------ applying objects
    def apply_slice(self, obj: Mapping[str, Any], *, deleted: bool = False) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if not name:
            return
        old = self.slices.pop(name, None)
        if old is not None:
            self._by_node.get(old.node, set()).discard(name)
        decoded = None if deleted else slice_devices(obj, self.driver)
        if decoded is not None:
            self.slices[name] = decoded
            self._by_node.setdefault(decoded.node, set()).add(name)

    def apply_claim(self, obj: Mapping[str, Any], *, deleted: bool = False) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        old = self.claims.pop(key, None)
        if old is not None:
            for device in old.devices:
                self._by_pool.get(device.pool, set()).discard(key)
        if deleted:
            return
        claim = claim_from_object(obj, self.driver, self.naming.device_classes)
        self.claims[key] = claim
        for device in claim.devices:
            self._by_pool.setdefault(device.pool, set()).add(key)

    def _apply(self, label: str, obj: Mapping[str, Any], *, deleted: bool = False) -> None:
        if label == "resourceslices":
            self.apply_slice(obj, deleted=deleted)
        else:
            self.apply_claim(obj, deleted=deleted)

    # ------------------------------------------------------------------ list + watch
    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._loop(ResourceSlice, "resourceslices"))
            group.create_task(self._loop(ResourceClaim, "resourceclaims"))

    def _selector(self, label: str) -> dict[str, Any]:
        if label == "resourceslices":
            return {"fields": {"spec.driver": self.driver}}
        return {"namespace": "*"}

    async def _loop(self, kind: _Kind, label: str) -> None:
        await keep_listing_and_watching(
            label,
            self._versions,
            lambda: self._relist(kind, label),
            lambda: self._watch(kind, label),
            self.backoff,
            self._sleep,
        )

    async def _relist(self, kind: _Kind, label: str) -> str:
        listing = self.client.list(kind, **self._selector(label))
        objects = [dict(obj) async for obj in listing]
        if label == "resourceslices":
            self.slices.clear()
            self._by_node.clear()
        else:
            self.claims.clear()
            self._by_pool.clear()
        for obj in objects:
            self._apply(label, obj)
        self.relists += 1
        self._listed.add(label)
        if self._listed >= {"resourceslices", "resourceclaims"}:
            self.synced.set()
        version = str(listing.resourceVersion)
        log.info("listed %d %s at version %s", len(objects), label, version)
        return version

    async def _watch(self, kind: _Kind, label: str) -> None:
        stream = watch_events(
            self.client,
            kind,
            resource_version=self._versions[label],
            server_timeout=self.watch_timeout_s,
            **self._selector(label),
        )
        async for event, data in stream:
            rv = (data.get("metadata") or {}).get("resourceVersion")
            if rv:
                self._versions[label] = rv
            if event == "BOOKMARK":
                continue
            self._apply(label, data, deleted=event == "DELETED")
