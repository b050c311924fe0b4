"""The HTTP face of the fake API server: Kubernetes REST paths, verbs and watch streams.

This module takes each request, routes it (:mod:`~kubegpu.testing.apiserver.routing`) into
(verb, resource, namespace, name, subresource), hands it to
:mod:`kubegpu.testing.apiserver.verbs`, :mod:`kubegpu.testing.apiserver.collection_verbs` or the
store, and renders results and ``Status`` errors the way kube-apiserver does
(:mod:`~kubegpu.testing.apiserver.replies`), so a real client library (lightkube) can be pointed
at it. It also owns the server's lifecycle on the caller's event loop and the test hooks;
:mod:`~kubegpu.testing.apiserver.server_thread` runs it on a loop of its own for synchronous
code.
"""

from __future__ import annotations

import collections
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import lightkube
from aiohttp import web
from lightkube.config.kubeconfig import KubeConfig

from kubegpu.testing.apiserver import verbs
from kubegpu.testing.apiserver.collection_verbs import (
    delete_collection,
    list_collection,
    serve_watch,
)
from kubegpu.testing.apiserver.errors import StatusError
from kubegpu.testing.apiserver.replies import (
    JSON,
    WATCH_TRUE,
    body_too_large,
    decode_json_body,
    int_param,
    json_response,
    method_not_allowed,
    object_not_found,
)
from kubegpu.testing.apiserver.resources import SYSTEM_NAMESPACES
from kubegpu.testing.apiserver.routing import RouteTarget, discovery_document, route
from kubegpu.testing.apiserver.server_thread import ServerThread
from kubegpu.testing.apiserver.store import Store
from kubegpu.testing.kubeconfig import kubeconfig_dict, write_kubeconfig
from kubegpu.testing.waiting import wait_until_async

log = logging.getLogger(__name__)

# kube-apiserver's default --max-request-body-bytes (3 MB).
DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024
GIT_VERSION = "v1.31.0-kubegpu-fake"


@dataclass(frozen=True)
class RequestRecord:
    """One served API request, for tests that assert on client behaviour."""

    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    resource: str  # plural, with "/subresource" when there is one: "pods/binding"
    namespace: str | None
    name: str | None
    params: dict[str, str] = field(default_factory=dict)


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
            return json_response(error.to_status(), error.code)
        except Exception as error:
            # A bug here must still reach the client as a Status, or lightkube reports a bare
            # HTTP error and the test shows the wrong failure.
            log.exception("%s %s crashed", request.method, request.path)
            status = StatusError("InternalError", f"Internal error occurred: {error!r}")
            return json_response(status.to_status(), 500)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if parts in (["healthz"], ["livez"], ["readyz"]):
            return web.Response(text="ok", content_type="text/plain")
        if parts == ["version"]:
            return json_response(
                {"major": "1", "minor": "31", "gitVersion": GIT_VERSION, "platform": "linux/amd64"}
            )
        if request.method == "GET" and (
            parts in (["api"], ["apis"], ["api", "v1"]) or (len(parts) == 3 and parts[0] == "apis")
        ):
            return json_response(discovery_document(parts, self.host))
        target = route(parts)
        return await self._serve(request, target)

    async def _serve(self, request: web.Request, target: RouteTarget) -> web.StreamResponse:
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
                raise method_not_allowed()
            await self._record("create", "bindings", namespace, None, query)
            return json_response(
                verbs.bind(self.store, namespace, None, await self._body(request)), 201
            )
        resource = f"{rtype.plural}/{sub}" if sub else rtype.plural
        ns = namespace or ""
        if name is None:
            if method == "GET":
                is_watch = target.watch_path or query.get("watch", "").lower() in WATCH_TRUE
                await self._record(
                    "watch" if is_watch else "list", resource, namespace, None, query
                )
                if is_watch:
                    return await serve_watch(
                        request,
                        self.store,
                        rtype,
                        namespace,
                        query,
                        bookmark_interval_s=self.bookmark_interval_s,
                    )
                return json_response(list_collection(self.store, rtype, namespace, query))
            if rtype.namespaced and namespace is None:
                raise method_not_allowed()
            if method == "POST":
                await self._record("create", resource, namespace, None, query)
                obj = verbs.create(self.store, rtype, ns, await self._body(request))
                return json_response(obj, 201)
            if method == "DELETE":
                await self._record("deletecollection", resource, namespace, None, query)
                return json_response(
                    delete_collection(
                        self.store,
                        rtype,
                        namespace,
                        query,
                        graceful_pods=self.graceful_pod_deletion,
                    )
                )
            raise method_not_allowed()
        if sub not in (None, "status", "binding") or (sub == "status" and not rtype.has_status):
            raise StatusError("NotFound", "the server could not find the requested resource")
        if sub == "binding":
            if rtype.plural != "pods" or method != "POST":
                raise method_not_allowed()
            await self._record("create", resource, namespace, name, query)
            return json_response(verbs.bind(self.store, ns, name, await self._body(request)), 201)
        if method == "GET":
            await self._record("get", resource, namespace, name, query)
            stored = self.store.get(rtype, ns, name)
            if stored is None:
                raise object_not_found(rtype, name)
            return json_response(stored)
        if method == "PUT":
            await self._record("update", resource, namespace, name, query)
            return json_response(
                verbs.update(
                    self.store, rtype, ns, name, await self._body(request), subresource=sub
                )
            )
        if method == "PATCH":
            await self._record("patch", resource, namespace, name, query)
            body = await self._body(request)
            return json_response(
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
                grace_period_s=int_param(query, "gracePeriodSeconds"),
                graceful_pods=self.graceful_pod_deletion,
            )
            return json_response(deleted)
        raise method_not_allowed()

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
            raise body_too_large(self.max_body_bytes)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge as error:
            raise body_too_large(self.max_body_bytes) from error
        if optional and not raw.strip():
            return None
        if request.method in ("POST", "PUT") and request.content_type != JSON:
            raise StatusError(
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {request.content_type}; "
                "accepted media types include: application/json",
            )
        return decode_json_body(raw)
