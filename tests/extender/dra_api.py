"""ResourceSlices and ResourceClaims over real HTTP on loopback, with list *and* watch, for the
extender's DRA view (``kubegpu.kube.dra_view``).

The project's fake API server cannot hold ``resource.k8s.io`` objects and the DRA driver's
stand-in (``tests/dra/resource_api.py``) has no watch, so this serves exactly what the view
calls: a list (``spec.driver`` field selector on slices, all namespaces for claims) answering
with a resourceVersion, and a watch from it streaming ADDED / MODIFIED / DELETED events as the
test changes objects. ``expire_watches`` answers the next watch with 410 Gone, as kube-apiserver
does when the version is too old.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import lightkube
from aiohttp import web

from kubegpu.testing.local_api import lightkube_client_for

PREFIX = "/apis/resource.k8s.io/v1"
KINDS = {"resourceslices": "ResourceSlice", "resourceclaims": "ResourceClaim"}


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("namespace", ""), meta["name"])


class DraApi:
    def __init__(self) -> None:
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in KINDS}
        self.version = 1
        self.lists: list[tuple[str, str]] = []  # (kind, fieldSelector) of every list
        self.watches: list[tuple[str, str]] = []  # (kind, resourceVersion) of every watch
        self._streams: dict[str, list[asyncio.Queue[dict[str, Any] | None]]] = {
            k: [] for k in KINDS
        }
        self._expired: set[str] = set()  # kinds whose next watch is answered 410

    # ------------------------------------------------------------------ the test's side
    def put(self, kind: str, obj: dict[str, Any]) -> None:
        self.version += 1
        stored = copy.deepcopy(obj)
        stored["apiVersion"] = "resource.k8s.io/v1"
        stored["kind"] = KINDS[kind]
        stored["metadata"]["resourceVersion"] = str(self.version)
        event = "MODIFIED" if _key(stored) in self.objects[kind] else "ADDED"
        self.objects[kind][_key(stored)] = stored
        self._send(kind, {"type": event, "object": stored})

    def delete(self, kind: str, obj: dict[str, Any]) -> None:
        self.version += 1
        stored = self.objects[kind].pop(_key(obj))
        stored = {
            **stored,
            "metadata": {**stored["metadata"], "resourceVersion": str(self.version)},
        }
        self._send(kind, {"type": "DELETED", "object": stored})

    def expire_watches(self) -> None:
        """End every open watch; the next one of each kind is answered 410 Gone."""
        self._expired = set(KINDS)
        for kind in KINDS:
            for queue in self._streams[kind]:
                queue.put_nowait(None)

    def _send(self, kind: str, event: dict[str, Any]) -> None:
        for queue in self._streams[kind]:
            queue.put_nowait(event)

    # ------------------------------------------------------------------ HTTP
    def app(self) -> web.Application:
        app = web.Application()
        for kind in KINDS:
            app.router.add_get(f"{PREFIX}/{kind}", self._handler(kind))
        return app

    def _handler(self, kind: str) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            if request.query.get("watch") in ("true", "1"):
                return await self._watch(kind, request)
            selector = request.query.get("fieldSelector", "")
            self.lists.append((kind, selector))
            wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
            items = [
                o
                for o in self.objects[kind].values()
                if all(o["spec"].get(k.removeprefix("spec.")) == v for k, v in wanted.items())
            ]
            body = {
                "kind": f"{KINDS[kind]}List",
                "apiVersion": "resource.k8s.io/v1",
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }
            return web.Response(body=json.dumps(body), content_type="application/json")

        return handle

    async def _watch(self, kind: str, request: web.Request) -> web.StreamResponse:
        self.watches.append((kind, request.query.get("resourceVersion", "")))
        if kind in self._expired:
            self._expired.discard(kind)
            gone = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "Expired",
                "code": 410,
                "message": "too old resource version",
            }
            return web.Response(
                body=json.dumps(gone), status=410, headers={"Content-Type": "application/json"}
            )
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._streams[kind].append(queue)
        try:
            while (event := await queue.get()) is not None:
                await response.write(json.dumps(event).encode() + b"\n")
        finally:
            self._streams[kind].remove(queue)
        return response


@asynccontextmanager
async def serve(api: DraApi) -> AsyncIterator[lightkube.AsyncClient]:
    async with lightkube_client_for(
        api.app(), before_close=api.expire_watches, shutdown_timeout_s=0.1
    ) as client:
        yield client
