"""The HTTP face of the fake API server: Kubernetes REST paths, verbs and watch streams.

This module parses requests into (verb, resource, namespace, name, subresource), hands them to
:mod:`kubegpu.testing.apiserver.verbs` or the store, and renders results and ``Status`` errors
the way kube-apiserver does, so a real client library (lightkube) can be pointed at it. It also
owns the server's lifecycle: on the caller's event loop, or on its own loop in a thread for
synchronous code.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import lightkube
from aiohttp import web
from lightkube.config.kubeconfig import KubeConfig

from kubegpu.testing.apiserver import verbs
from kubegpu.testing.apiserver.errors import StatusError, bad_request, not_found
from kubegpu.testing.apiserver.resources import (
    BY_PATH,
    RESOURCE_TYPES,
    SYSTEM_NAMESPACES,
    ResourceType,
)
from kubegpu.testing.apiserver.selectors import parse_field_selector, parse_label_selector
from kubegpu.testing.apiserver.store import END, Store
from kubegpu.testing.kubeconfig import kubeconfig_dict, write_kubeconfig
from kubegpu.testing.waiting import wait_until_async

log = logging.getLogger(__name__)

T = TypeVar("T")

JSON = "application/json"
# kube-apiserver's default --max-request-body-bytes (3 MB).
DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024
GIT_VERSION = "v1.31.0-kubegpu-fake"
_WATCH_TRUE = ("true", "1")


@dataclass(frozen=True)
class RequestRecord:
    """One served API request, for tests that assert on client behaviour."""

    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    resource: str  # plural, with "/subresource" when there is one: "pods/binding"
    namespace: str | None
    name: str | None
    params: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Target:
    rtype: ResourceType | None  # None for the legacy "bindings" collection
    namespace: str | None
    name: str | None
    subresource: str | None
    watch_path: bool  # the deprecated /watch/ path prefix


@dataclass
class _Hook:
    verb: str
    resource: str
    namespace: str | None
    name: str | None
    action: Callable[[Store], Awaitable[None] | None]
    remaining: int

    def matches(self, verb: str, resource: str, namespace: str | None, name: str | None) -> bool:
        return (
            self.verb == verb
            and self.resource == resource
            and self.name in (None, name)
            and self.namespace in (None, namespace)
        )


class FakeApiServer:
    """A Kubernetes API server for tests and demos, backed by an in-memory :class:`Store`.

    Use it as ``async with FakeApiServer() as server:`` on a running loop, or from synchronous
    code as ``with FakeApiServer().run_in_thread() as handle:``. ``server.client()`` returns a
    lightkube client pointed at it.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        store: Store | None = None,
        history_size: int = 1000,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        bookmark_interval_s: float = 60.0,
        tls_cert_file: str | Path | None = None,
        tls_key_file: str | Path | None = None,
        seed_namespaces: bool = True,
        graceful_pod_deletion: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        self.store = store if store is not None else Store(history_size=history_size)
        self.max_body_bytes = max_body_bytes
        # Off by default: with no kubelet to finish them, terminating pods would never go.
        self.graceful_pod_deletion = graceful_pod_deletion
        self.bookmark_interval_s = bookmark_interval_s
        self.tls_cert_file = Path(tls_cert_file) if tls_cert_file else None
        self.tls_key_file = Path(tls_key_file) if tls_key_file else None
        # (verb, resource) -> number of requests served, e.g. ("create", "pods/binding").
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self.request_log: collections.deque[RequestRecord] = collections.deque(maxlen=10_000)
        self._runner: web.AppRunner | None = None
        self._hooks: list[_Hook] = []
        if seed_namespaces:
            for namespace in SYSTEM_NAMESPACES:
                if self.store.get("namespaces", None, namespace) is None:
                    self.store.put(
                        "namespaces",
                        {"metadata": {"name": namespace}, "status": {"phase": "Active"}},
                    )

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._runner is None:
            raise RuntimeError("the fake API server is not started")
        scheme = "https" if self.tls_cert_file else "http"
        return f"{scheme}://{self.host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client that hangs up cancels its handler, so an idle watch
        # whose client is gone does not stay registered. Verbs never await mid-write, so a
        # cancellation cannot leave a half-done change.
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=5.0,
            handler_cancellation=True,
        )
        await runner.setup()
        ssl_context = None
        if self.tls_cert_file:
            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        # A deep backlog so a thousand clients connecting at once are not refused.
        site = web.TCPSite(
            runner,
            self.host,
            self.port,
            ssl_context=ssl_context,
            backlog=2048,
        )
        await site.start()
        self._runner = runner
        self.port = runner.addresses[0][1]
        log.info("fake API server listening on %s", self.url)

    async def stop(self) -> None:
        if self._runner is None:
            return
        # Watches never end by themselves; end them so the runner's cleanup does not wait.
        self.store.drop_watches()
        await self._runner.cleanup()
        self._runner = None

    async def __aenter__(self) -> FakeApiServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def run_in_thread(self) -> ServerThread:
        """Start this server on its own event loop in a daemon thread (for sync callers)."""
        return ServerThread.start(self)

    # -- clients ---------------------------------------------------------------------------

    def kubeconfig(self, namespace: str = "default") -> KubeConfig:
        return KubeConfig.from_dict(
            kubeconfig_dict(self.url, namespace=namespace, ca_file=self.tls_cert_file)
        )

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        return write_kubeconfig(path, self.url, namespace=namespace, ca_file=self.tls_cert_file)

    def client(self, namespace: str = "default", **kwargs: Any) -> lightkube.Client:
        """A sync lightkube client for this server. ``trust_env`` is off so that proxy
        settings in the environment cannot send loopback traffic elsewhere."""
        kwargs.setdefault("trust_env", False)
        return lightkube.Client(self.kubeconfig(namespace), **kwargs)

    def async_client(self, namespace: str = "default", **kwargs: Any) -> lightkube.AsyncClient:
        kwargs.setdefault("trust_env", False)
        return lightkube.AsyncClient(self.kubeconfig(namespace), **kwargs)

    # -- test hooks ------------------------------------------------------------------------

    def count(self, verb: str, resource: str | None = None) -> int:
        """Requests served for a verb (and resource, e.g. "pods" or "pods/binding")."""
        return sum(
            n
            for (v, r), n in self.requests.items()
            if v == verb and (resource is None or r == resource)
        )

    def drop_watches(self, *, abrupt: bool = False) -> int:
        return self.store.drop_watches(abrupt=abrupt)

    async def wait_for_watches(self, count: int = 1, timeout_s: float = 10.0) -> None:
        """Return once ``count`` watch streams are open: for a test that must not write before
        a client watching from "now" (no resourceVersion) is listening."""
        # The store counts its watches under a thread lock (a server in a thread serves them),
        # and announces no change of that count: it is looked at, not awaited.
        await wait_until_async(
            lambda: self.store.open_watches >= count,
            timeout_s=timeout_s,
            what=lambda: f"{count} open watch streams (open: {self.store.open_watches})",
        )

    def inject_failures(
        self,
        resource: str,
        name: str | None = None,
        *,
        namespace: str | None = None,
        count: int = 1,
        code: int = 409,
    ) -> None:
        self.store.inject_failures(resource, name, namespace=namespace, count=count, code=code)

    def before(
        self,
        verb: str,
        resource: str,
        action: Callable[[Store], Awaitable[None] | None],
        *,
        name: str | None = None,
        namespace: str | None = None,
        count: int = 1,
    ) -> None:
        """Run ``action(store)`` just before serving each of the next ``count`` requests that
        match ``verb`` and ``resource`` ("patch", "pods"; "create", "pods/binding"), and
        ``name`` / ``namespace`` when given.

        This is how a test puts a concurrent writer exactly between a client's read and its
        write (the action changes the object, so a precondition the client sends is stale), or
        holds a request until the test lets it go (an async action that waits). A
        :class:`StatusError` the action raises is the request's answer, as if the server had
        failed it."""
        self._hooks.append(_Hook(verb, resource, namespace, name, action, count))

    # -- HTTP ------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._dispatch(request)
        except StatusError as error:
            if error.code >= 500:
                log.warning("%s %s failed: %s", request.method, request.path, error.message)
            return _json(error.to_status(), error.code)
        except Exception as error:
            # A bug here must still reach the client as a Status, or lightkube reports a bare
            # HTTP error and the test shows the wrong failure.
            log.exception("%s %s crashed", request.method, request.path)
            status = StatusError("InternalError", f"Internal error occurred: {error!r}")
            return _json(status.to_status(), 500)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if parts in (["healthz"], ["livez"], ["readyz"]):
            return web.Response(text="ok", content_type="text/plain")
        if parts == ["version"]:
            return _json(
                {"major": "1", "minor": "31", "gitVersion": GIT_VERSION, "platform": "linux/amd64"}
            )
        if request.method == "GET" and (
            parts in (["api"], ["apis"], ["api", "v1"]) or (len(parts) == 3 and parts[0] == "apis")
        ):
            return _json(_discovery(parts, self.host))
        target = _route(parts)
        return await self._serve(request, target)

    async def _serve(self, request: web.Request, target: _Target) -> web.StreamResponse:
        method = request.method
        query = dict(request.query)
        rtype, namespace, name, sub = (
            target.rtype,
            target.namespace,
            target.name,
            target.subresource,
        )
        if rtype is None:  # legacy POST namespaces/<ns>/bindings
            if method != "POST" or namespace is None or name is not None:
                raise _method_not_allowed()
            await self._record("create", "bindings", namespace, None, query)
            return _json(verbs.bind(self.store, namespace, None, await self._body(request)), 201)
        resource = f"{rtype.plural}/{sub}" if sub else rtype.plural
        ns = namespace or ""
        if name is None:
            if method == "GET":
                is_watch = target.watch_path or query.get("watch", "").lower() in _WATCH_TRUE
                await self._record(
                    "watch" if is_watch else "list", resource, namespace, None, query
                )
                if is_watch:
                    return await self._watch(request, rtype, namespace, query)
                return _json(self._list(rtype, namespace, query))
            if rtype.namespaced and namespace is None:
                raise _method_not_allowed()
            if method == "POST":
                await self._record("create", resource, namespace, None, query)
                obj = verbs.create(self.store, rtype, ns, await self._body(request))
                return _json(obj, 201)
            if method == "DELETE":
                await self._record("deletecollection", resource, namespace, None, query)
                return _json(self._delete_collection(rtype, namespace, query))
            raise _method_not_allowed()
        if sub not in (None, "status", "binding") or (sub == "status" and not rtype.has_status):
            raise StatusError("NotFound", "the server could not find the requested resource")
        if sub == "binding":
            if rtype.plural != "pods" or method != "POST":
                raise _method_not_allowed()
            await self._record("create", resource, namespace, name, query)
            return _json(verbs.bind(self.store, ns, name, await self._body(request)), 201)
        if method == "GET":
            await self._record("get", resource, namespace, name, query)
            stored = self.store.get(rtype, ns, name)
            if stored is None:
                raise _not_found(rtype, name)
            return _json(stored)
        if method == "PUT":
            await self._record("update", resource, namespace, name, query)
            return _json(
                verbs.update(
                    self.store, rtype, ns, name, await self._body(request), subresource=sub
                )
            )
        if method == "PATCH":
            await self._record("patch", resource, namespace, name, query)
            body = await self._body(request)
            return _json(
                verbs.patch(
                    self.store, rtype, ns, name, request.content_type, body, subresource=sub
                )
            )
        if method == "DELETE" and sub is None:
            await self._record("delete", resource, namespace, name, query)
            options = await self._body(request, optional=True)
            deleted = verbs.delete(
                self.store,
                rtype,
                ns,
                name,
                options,
                grace_period_s=_int_param(query, "gracePeriodSeconds"),
                graceful_pods=self.graceful_pod_deletion,
            )
            return _json(deleted)
        raise _method_not_allowed()

    async def _record(
        self,
        verb: str,
        resource: str,
        namespace: str | None,
        name: str | None,
        params: dict[str, str],
    ) -> None:
        self.requests[(verb, resource)] += 1
        self.request_log.append(RequestRecord(verb, resource, namespace, name, params))
        for hook in list(self._hooks):
            if hook.remaining > 0 and hook.matches(verb, resource, namespace, name):
                hook.remaining -= 1
                if hook.remaining == 0:
                    self._hooks.remove(hook)
                outcome = hook.action(self.store)
                if outcome is not None:
                    await outcome
        log.debug("%s %s namespace=%s name=%s", verb, resource, namespace, name)

    async def _body(self, request: web.Request, *, optional: bool = False) -> Any:
        """The decoded JSON body, within the size limit (None when optional and empty)."""
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge as error:
            raise _too_large(self.max_body_bytes) from error
        if optional and not raw.strip():
            return None
        if request.method in ("POST", "PUT") and request.content_type != JSON:
            raise StatusError(
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {request.content_type}; "
                "accepted media types include: application/json",
            )
        return _decode(raw)

    def _list(
        self, rtype: ResourceType, namespace: str | None, query: dict[str, str]
    ) -> dict[str, Any]:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), rtype.selectable_fields)
        limit = _int_param(query, "limit")
        items, rv, token, remaining = self.store.select(
            rtype, namespace, labels, fields, limit=limit, continue_token=query.get("continue")
        )
        for item in items:
            # List items carry no kind or apiVersion on the real server either.
            item.pop("kind", None)
            item.pop("apiVersion", None)
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if token:
            meta["continue"] = token
            meta["remainingItemCount"] = remaining
        return {
            "kind": rtype.list_kind,
            "apiVersion": rtype.api_version,
            "metadata": meta,
            "items": items,
        }

    def _delete_collection(
        self, rtype: ResourceType, namespace: str | None, query: dict[str, str]
    ) -> dict[str, Any]:
        listing = self._list(rtype, namespace, query)
        deleted = []
        for item in listing["items"]:
            meta = item["metadata"]
            deleted.append(
                verbs.delete(
                    self.store,
                    rtype,
                    meta.get("namespace", ""),
                    meta["name"],
                    None,
                    grace_period_s=_int_param(query, "gracePeriodSeconds"),
                    graceful_pods=self.graceful_pod_deletion,
                )
            )
        return {
            "kind": rtype.list_kind,
            "apiVersion": rtype.api_version,
            "metadata": {"resourceVersion": str(self.store.resource_version)},
            "items": deleted,
        }

    async def _watch(
        self,
        request: web.Request,
        rtype: ResourceType,
        namespace: str | None,
        query: dict[str, str],
    ) -> web.StreamResponse:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), rtype.selectable_fields)
        timeout = _int_param(query, "timeoutSeconds")
        bookmarks = query.get("allowWatchBookmarks", "").lower() in _WATCH_TRUE
        rv = query.get("resourceVersion", "")
        if rv not in ("", "0") and not rv.isdigit():
            raise bad_request(f'resourceVersion: Invalid value: "{rv}": must be an integer')
        since = int(rv) if rv not in ("", "0") else None
        response = web.StreamResponse(status=200, headers={"Content-Type": JSON})
        response.enable_chunked_encoding()
        try:
            watch = self.store.open_watch(
                rtype, namespace, labels, fields, since, bookmarks=bookmarks
            )
        except StatusError as error:
            # Like the real server: 200, then one ERROR event carrying the Status, then end.
            await response.prepare(request)
            await response.write(_line({"type": "ERROR", "object": error.to_status()}))
            await response.write_eof()
            return response
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        try:
            while True:
                wait = self.bookmark_interval_s if bookmarks else None
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    wait = left if wait is None else min(wait, left)
                item = await watch.next(wait)
                if item is None:
                    if deadline is not None and loop.time() >= deadline:
                        break
                    self.store.bookmark(watch)
                    continue
                if item == END:
                    break
                if isinstance(item, str):  # ABORT
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                await response.write(_line(item))
            await response.write_eof()
        except ConnectionResetError:
            # The client went away mid-stream; that ends a watch, it is not a server error.
            log.debug("watch client of %s disconnected", rtype.plural)
        finally:
            self.store.close_watch(watch)
        return response


class ServerThread:
    """A :class:`FakeApiServer` running on its own event loop in a daemon thread."""

    def __init__(
        self, server: FakeApiServer, loop: asyncio.AbstractEventLoop, thread: threading.Thread
    ) -> None:
        self.server = server
        self.loop = loop
        self._thread = thread

    @classmethod
    def start(cls, server: FakeApiServer, timeout_s: float = 10.0) -> ServerThread:
        loop = asyncio.new_event_loop()
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(server.start())
            except BaseException as error:  # reported to the starting thread below
                failure.append(error)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.close()

        thread = threading.Thread(target=run, name="fake-apiserver", daemon=True)
        thread.start()
        if not started.wait(timeout_s):
            raise RuntimeError("the fake API server did not start in time")
        if failure:
            raise failure[0]
        return cls(server, loop, thread)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def store(self) -> Store:
        return self.server.store

    def call(self, function: Callable[[], Awaitable[T]], timeout_s: float = 30.0) -> T:
        """Run a coroutine function on the server's loop and wait for its result."""

        async def runner() -> T:
            return await function()

        return asyncio.run_coroutine_threadsafe(runner(), self.loop).result(timeout_s)

    def client(self, namespace: str = "default", **kwargs: Any) -> lightkube.Client:
        return self.server.client(namespace, **kwargs)

    def kubeconfig(self, namespace: str = "default") -> KubeConfig:
        return self.server.kubeconfig(namespace)

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        return self.server.write_kubeconfig(path, namespace)

    def count(self, verb: str, resource: str | None = None) -> int:
        return self.server.count(verb, resource)

    def drop_watches(self, *, abrupt: bool = False) -> int:
        """Thread-safe: the streams end on the server's loop."""
        return self.server.drop_watches(abrupt=abrupt)

    def inject_failures(
        self,
        resource: str,
        name: str | None = None,
        *,
        namespace: str | None = None,
        count: int = 1,
        code: int = 409,
    ) -> None:
        self.server.inject_failures(resource, name, namespace=namespace, count=count, code=code)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.loop.is_closed() or not self._thread.is_alive():
            return
        self.call(self.server.stop, timeout_s)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _route(parts: list[str]) -> _Target:
    """Split an API path into what it addresses; 404 for anything this server does not serve."""
    if len(parts) >= 2 and parts[0] == "api" and parts[1] == "v1":
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise _no_route()
    watch_path = bool(rest) and rest[0] == "watch"
    if watch_path:
        rest = rest[1:]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise _no_route()
    plural, name, sub = (
        rest[0],
        (rest[1] if len(rest) > 1 else None),
        (rest[2] if len(rest) > 2 else None),
    )
    if group == "" and plural == "bindings":
        return _Target(None, namespace, name, sub, watch_path)
    rtype = BY_PATH.get((group, version, plural))
    if rtype is None or (namespace is not None and not rtype.namespaced):
        raise _no_route()
    return _Target(rtype, namespace, name, sub, watch_path)


def _discovery(parts: list[str], host: str) -> dict[str, Any]:
    if parts == ["api"]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
        }
    groups: dict[str, list[ResourceType]] = collections.defaultdict(list)
    for rtype in RESOURCE_TYPES:
        groups[rtype.group].append(rtype)
    if parts == ["apis"]:
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                    "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"},
                }
                for g in sorted(groups)
                if g
            ],
        }
    group = "" if parts[0] == "api" else parts[1]
    if group not in groups:
        raise _no_route()
    resources: list[dict[str, Any]] = []
    for rtype in groups[group]:
        resources.append(
            {
                "name": rtype.plural,
                "singularName": rtype.kind.lower(),
                "namespaced": rtype.namespaced,
                "kind": rtype.kind,
                "verbs": [
                    "create",
                    "delete",
                    "deletecollection",
                    "get",
                    "list",
                    "patch",
                    "update",
                    "watch",
                ],
                "shortNames": list(rtype.short_names),
            }
        )
        if rtype.has_status:
            resources.append(
                {
                    "name": f"{rtype.plural}/status",
                    "singularName": "",
                    "namespaced": rtype.namespaced,
                    "kind": rtype.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    if group == "":
        resources.append(
            {
                "name": "pods/binding",
                "singularName": "",
                "namespaced": True,
                "kind": "Binding",
                "verbs": ["create"],
            }
        )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/v1" if group else "v1",
        "resources": resources,
    }


def _json(body: Any, status: int = 200) -> web.Response:
    # Exactly "application/json", no charset: lightkube only turns an error response into
    # ApiError when the Content-Type header equals that string.
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        status=status,
        headers={"Content-Type": JSON},
    )


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise bad_request(f"couldn't get version/kind; json parse error: {error}") from error


def _int_param(query: dict[str, str], name: str) -> int | None:
    value = query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError as error:
        raise bad_request(f"{name}: Invalid value: {value!r}: must be an integer") from error


def _not_found(rtype: ResourceType, name: str) -> StatusError:
    return not_found(rtype.plural, name, rtype.group)


def _no_route() -> StatusError:
    return StatusError("NotFound", "the server could not find the requested resource")


def _method_not_allowed() -> StatusError:
    return StatusError(
        "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def _too_large(limit: int) -> StatusError:
    return StatusError(
        "RequestEntityTooLarge", f"the request body is larger than the limit of {limit} bytes"
    )
