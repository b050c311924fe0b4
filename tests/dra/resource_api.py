"""A minimal ``resource.k8s.io/v1`` API over real HTTP on loopback, for the lightkube ports.

The project's fake API server (``kubegpu.testing.apiserver``) serves a fixed table of core
types and cannot hold ResourceClaims or ResourceSlices, so the lightkube implementations are
tested against this: ResourceClaim get, ResourceSlice list (with the ``spec.nodeName`` and
``spec.driver`` field selectors), create, replace (resourceVersion checked: a stale one is a
409 Conflict, as on the real server) and delete. A claim's GET can be made to fail
(``fail_claims``: an error status, or ``DROP`` to close the connection without an answer), and
every request's path is kept (``paths``), matched by a route or not.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import lightkube
from aiohttp import web

from kubegpu.testing.local_api import lightkube_client_for

PREFIX = "/apis/resource.k8s.io/v1"
DROP = "drop"  # in fail_claims: the connection is closed with no answer at all


def _json(body: Any, status: int = 200) -> web.Response:
    # Exactly "application/json", as kube-apiserver sends it: lightkube turns an error into
    # ApiError only for that content type (aiohttp's json_response adds a charset).
    return web.Response(
        body=json.dumps(body).encode(), status=status, headers={"Content-Type": "application/json"}
    )


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
    return _json({**body, "reason": reason, "code": code}, status=code)


class ResourceApi:
    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.field_selectors: list[str] = []
        # (RBAC verb, resource) of every request served, to check the driver's ClusterRole.
        self.requests: list[tuple[str, str]] = []
        self._versions = itertools.count(1)
        # (namespace, name) -> HTTP status to answer a GET of that claim with, or DROP.
        self.fail_claims: dict[tuple[str, str], int | str] = {}
        self.paths: list[str] = []  # of every request, in order

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.paths.append(request.path)
        response: web.StreamResponse = await handler(request)
        return response

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_get(PREFIX + "/namespaces/{ns}/resourceclaims/{name}", self._get_claim)
        app.router.add_get(PREFIX + "/resourceclaims", self._list_claims)
        app.router.add_get(PREFIX + "/resourceslices", self._list_slices)
        app.router.add_post(PREFIX + "/resourceslices", self._create_slice)
        app.router.add_put(PREFIX + "/resourceslices/{name}", self._replace_slice)
        app.router.add_delete(PREFIX + "/resourceslices/{name}", self._delete_slice)
        return app

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
        return obj

    async def _get_claim(self, request: web.Request) -> web.Response:
        self.requests.append(("get", "resourceclaims"))
        key = (request.match_info["ns"], request.match_info["name"])
        failure = self.fail_claims.get(key)
        if failure == DROP:
            assert request.transport is not None
            request.transport.abort()  # no status line, no body: the client sees it dropped
            return web.Response()
        if isinstance(failure, int):
            reason = {403: "Forbidden", 429: "TooManyRequests"}.get(failure, "InternalError")
            return _status(failure, reason, f"scripted {failure} for resourceclaims {key[1]!r}")
        if key not in self.claims:
            return _status(404, "NotFound", f"resourceclaims {key[1]!r} not found")
        return _json(self.claims[key])

    async def _list_claims(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") in ("1", "true"):
            return await self._watch_claims(request)
        self.requests.append(("list", "resourceclaims"))
        return _json(
            {
                "kind": "ResourceClaimList",
                "apiVersion": "resource.k8s.io/v1",
                "items": list(self.claims.values()),
                "metadata": {"resourceVersion": "1"},
            }
        )

    async def _watch_claims(self, request: web.Request) -> web.StreamResponse:
        """A watch of the claims (steering's): tests change ``self.claims`` directly, so the
        stream compares it with what it last sent every few milliseconds and sends the
        differences as ADDED / MODIFIED / DELETED events, until ``timeoutSeconds``."""
        self.requests.append(("watch", "resourceclaims"))
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        sent = {k: copy.deepcopy(v) for k, v in self.claims.items()}
        deadline = asyncio.get_running_loop().time() + float(
            request.query.get("timeoutSeconds", "300")
        )
        while asyncio.get_running_loop().time() < deadline:
            if request.transport is None or request.transport.is_closing():
                break  # the client went away
            now = {k: copy.deepcopy(v) for k, v in self.claims.items()}
            events = [("DELETED", sent[k]) for k in sent if k not in now]
            events += [
                ("ADDED" if k not in sent else "MODIFIED", v)
                for k, v in now.items()
                if sent.get(k) != v
            ]
            for kind, obj in events:
                line = json.dumps({"type": kind, "object": self._stamp(obj)}) + "\n"
                await response.write(line.encode())
            sent = now
            await asyncio.sleep(0.02)
        return response

    async def _list_slices(self, request: web.Request) -> web.Response:
        self.requests.append(("list", "resourceslices"))
        selector = request.query.get("fieldSelector", "")
        self.field_selectors.append(selector)
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        items = [
            s
            for s in self.slices.values()
            if all(
                {"spec.nodeName": s["spec"].get("nodeName"), "spec.driver": s["spec"]["driver"]}[k]
                == v
                for k, v in wanted.items()
            )
        ]
        return _json(
            {
                "kind": "ResourceSliceList",
                "apiVersion": "resource.k8s.io/v1",
                "items": items,
                "metadata": {"resourceVersion": "1"},
            }
        )

    async def _create_slice(self, request: web.Request) -> web.Response:
        self.requests.append(("create", "resourceslices"))
        obj = await request.json()
        name = obj["metadata"]["name"]
        if name in self.slices:
            return _status(409, "AlreadyExists", f"resourceslices {name!r} already exists")
        self.slices[name] = self._stamp(obj)
        return _json(self.slices[name], status=201)

    async def _replace_slice(self, request: web.Request) -> web.Response:
        self.requests.append(("update", "resourceslices"))
        obj = await request.json()
        name = request.match_info["name"]
        current = self.slices.get(name)
        if current is None:
            return _status(404, "NotFound", f"resourceslices {name!r} not found")
        if obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", "the object has been modified")
        self.slices[name] = self._stamp(obj)
        return _json(self.slices[name])

    async def _delete_slice(self, request: web.Request) -> web.Response:
        self.requests.append(("delete", "resourceslices"))
        name = request.match_info["name"]
        if self.slices.pop(name, None) is None:
            return _status(404, "NotFound", f"resourceslices {name!r} not found")
        return _json({"kind": "Status", "apiVersion": "v1", "status": "Success"})


@asynccontextmanager
async def serve(api: ResourceApi) -> AsyncIterator[lightkube.AsyncClient]:
    async with lightkube_client_for(api.app()) as client:
        yield client
