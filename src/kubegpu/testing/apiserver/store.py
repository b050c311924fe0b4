"""In-memory object storage with etcd's versioning and the API server's watch fan-out.

The store owns what etcd and the watch cache own on a real cluster: one global, monotonically
increasing ``resourceVersion`` stamped on every write, a bounded history of change events (so a
watch can resume from a recent version and gets 410 Expired from an old one), and delivery of
each event to the open watches whose filters it passes. It knows nothing about HTTP or about
per-verb semantics (those live in :mod:`kubegpu.testing.apiserver.verbs`).

Writes take a lock so that tests may read and write the store from their own thread while the
server runs on another; on the server's event loop the lock is never contended.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import copy
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubegpu.testing.apiserver.errors import CODES, StatusError, bad_request, expired, stale
from kubegpu.testing.apiserver.resources import BY_PLURAL, RESOURCE_TYPES, ResourceType
from kubegpu.testing.apiserver.selectors import (
    FieldRequirement,
    Requirement,
    fields_match,
    labels_match,
)

Object = dict[str, Any]
ObjectKey = tuple[ResourceType, str, str]
# Spelled out here because Store.list shadows the builtin inside the class body.
Objects = list[Object]
TypeNames = list[tuple[ResourceType, str]]


def resolve(resource: str | ResourceType) -> ResourceType:
    """Accept ``"pods"``, ``"pod"``, ``"Pod"`` or a ResourceType, as tests find convenient."""
    if isinstance(resource, ResourceType):
        return resource
    if resource in BY_PLURAL:
        return BY_PLURAL[resource]
    for rtype in RESOURCE_TYPES:
        if resource.lower() in (rtype.kind.lower(), *rtype.short_names):
            return rtype
    raise KeyError(f"unknown resource {resource!r}")


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ChangeEvent:
    """One committed write, as kept in the history and handed to watches."""

    type: str  # ADDED, MODIFIED or DELETED
    resource_version: int
    rtype: ResourceType
    namespace: str
    obj: Object  # the new state; for DELETED the last state, stamped with the delete's version
    old: Object | None  # the previous state, for MODIFIED and DELETED


# Markers a watch's queue carries besides events.
END = "END"  # finish the response cleanly (client sees a normal end of stream)
ABORT = "ABORT"  # cut the connection (client sees a broken stream)


@dataclass(eq=False)
class Watch:
    """One open watch: its filter and a queue of wire events still to send.

    The queue is a deque appended under the store lock, so events keep commit order even when
    writes come from another thread; ``wakeup`` is only a doorbell for the serving coroutine.
    """

    rtype: ResourceType
    namespace: str | None
    labels: tuple[Requirement, ...]
    fields: tuple[FieldRequirement, ...]
    bookmarks: bool
    loop: asyncio.AbstractEventLoop
    queue: collections.deque[dict[str, Any] | str] = field(default_factory=collections.deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _loop_thread: int = field(default_factory=threading.get_ident)

    def matches(self, namespace: str, obj: Object | None) -> bool:
        if obj is None:
            return False
        if self.namespace is not None and namespace != self.namespace:
            return False
        return labels_match(self.labels, obj) and fields_match(self.fields, obj)

    def offer(self, event: ChangeEvent) -> None:
        """Translate a change into what this watch sees, as the real watch cache does.

        An object that stops matching the selector is reported DELETED (with its previous
        content) and one that starts matching is reported ADDED.
        """
        if event.rtype != self.rtype:
            return
        now = self.matches(event.namespace, event.obj)
        before = self.matches(event.namespace, event.old)
        if event.type == "ADDED":
            if now:
                self.push({"type": "ADDED", "object": event.obj})
        elif event.type == "DELETED":
            if before:
                self.push({"type": "DELETED", "object": event.obj})
        elif now and before:
            self.push({"type": "MODIFIED", "object": event.obj})
        elif now:
            self.push({"type": "ADDED", "object": event.obj})
        elif before and event.old is not None:
            gone = copy.deepcopy(event.old)
            gone["metadata"]["resourceVersion"] = str(event.resource_version)
            self.push({"type": "DELETED", "object": gone})

    def push(self, item: dict[str, Any] | str) -> None:
        self.queue.append(item)
        if threading.get_ident() == self._loop_thread:
            self.wakeup.set()
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.wakeup.set)

    async def next(self, timeout: float | None) -> dict[str, Any] | str | None:
        """The next item, or None when ``timeout`` passes first."""
        while not self.queue:
            self.wakeup.clear()
            if self.queue:
                break
            try:
                async with asyncio.timeout(timeout):
                    await self.wakeup.wait()
            except TimeoutError:
                return None
        return self.queue.popleft()


@dataclass
class Fault:
    rtype: ResourceType
    namespace: str | None
    name: str | None
    remaining: int
    code: int


class Store:
    """All objects of the fake cluster, versioned like etcd."""

    def __init__(
        self,
        *,
        history_size: int = 1000,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self._objects: dict[ObjectKey, Object] = {}
        self._rv = 0
        self._history: collections.deque[ChangeEvent] = collections.deque(maxlen=history_size)
        # Version of the newest event that fell out of the history: watching from before it
        # cannot be served any more (etcd compaction).
        self._compacted_rv = 0
        self._watches: set[Watch] = set()
        self._faults: list[Fault] = []
        self.clock = clock or (lambda: datetime.now(UTC))

    # -- reading ---------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def get(self, resource: str | ResourceType, namespace: str | None, name: str) -> Object | None:
        """A copy of the stored object, or None."""
        rtype = resolve(resource)
        with self._lock:
            obj = self._objects.get((rtype, namespace or "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, resource: str | ResourceType, namespace: str | None = None) -> list[Object]:
        """Copies of every stored object of a type (in one namespace if given), in key order."""
        rtype = resolve(resource)
        with self._lock:
            return [copy.deepcopy(obj) for _, obj in self._select(rtype, namespace, (), ())]

    def _select(
        self,
        rtype: ResourceType,
        namespace: str | None,
        labels: tuple[Requirement, ...],
        fields: tuple[FieldRequirement, ...],
        after: str | None = None,
    ) -> Iterator[tuple[str, Object]]:
        keys = sorted(
            (ns, name)
            for (t, ns, name) in self._objects
            if t == rtype and (namespace is None or ns == namespace)
        )
        for ns, name in keys:
            position = f"{ns}/{name}"
            if after is not None and position <= after:
                continue
            obj = self._objects[(rtype, ns, name)]
            if labels_match(labels, obj) and fields_match(fields, obj):
                yield position, obj

    def select(
        self,
        rtype: ResourceType,
        namespace: str | None,
        labels: tuple[Requirement, ...],
        fields: tuple[FieldRequirement, ...],
        *,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> tuple[Objects, int, str | None, int | None]:
        """A LIST: (items, list resourceVersion, continue token, remaining item count).

        A continued list reports the version of its first page, as the real server does; its
        later pages are read from the current state, since there is no MVCC snapshot here.
        """
        with self._lock:
            list_rv = self._rv
            after = None
            if continue_token:
                list_rv, after = _decode_continue(continue_token)
            matched = list(self._select(rtype, namespace, labels, fields, after))
            if limit is not None and limit > 0 and len(matched) > limit:
                page = matched[:limit]
                token = _encode_continue(list_rv, page[-1][0])
                return [copy.deepcopy(o) for _, o in page], list_rv, token, len(matched) - limit
            return [copy.deepcopy(o) for _, o in matched], list_rv, None, None

    # -- writing ---------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Hold the write lock across a read-check-write sequence."""
        with self._lock:
            yield

    def keys_in_namespace(self, namespace: str) -> TypeNames:
        with self._lock:
            return [(t, name) for (t, ns, name) in self._objects if ns == namespace]

    def current(self, rtype: ResourceType, namespace: str, name: str) -> Object | None:
        """The stored object itself (not a copy); only for use inside :meth:`transaction`."""
        return self._objects.get((rtype, namespace, name))

    def commit(self, rtype: ResourceType, namespace: str, name: str, new: Object | None) -> Object:
        """Store ``new`` (or delete when None) at a fresh resourceVersion and notify watches.

        Returns a copy of what was written (for a delete, the last state at the new version).
        """
        with self._lock:
            key = (rtype, namespace, name)
            old = self._objects.get(key)
            self._rv += 1
            rv = str(self._rv)
            if new is None:
                if old is None:
                    raise KeyError(key)
                written = copy.deepcopy(old)
                written["metadata"]["resourceVersion"] = rv
                del self._objects[key]
                kind = "DELETED"
            else:
                written = copy.deepcopy(new)
                written["metadata"]["resourceVersion"] = rv
                self._objects[key] = written
                kind = "ADDED" if old is None else "MODIFIED"
            event = ChangeEvent(kind, self._rv, rtype, namespace, written, old)
            if len(self._history) == self._history.maxlen:
                self._compacted_rv = self._history[0].resource_version
            self._history.append(event)
            for watch in list(self._watches):
                watch.offer(event)
            return copy.deepcopy(written)

    def put(self, resource: str | ResourceType, obj: Object) -> Object:
        """Write an object directly, bypassing validation and admission (a test hook).

        Fills in what the server would (kind, apiVersion, uid, creationTimestamp, generation)
        where missing, and notifies watches like any write.
        """
        rtype = resolve(resource)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace", "") if rtype.namespaced else ""
        if rtype.namespaced and not namespace:
            namespace = meta["namespace"] = "default"
        obj.setdefault("kind", rtype.kind)
        obj.setdefault("apiVersion", rtype.api_version)
        with self._lock:
            old = self._objects.get((rtype, namespace, meta["name"]))
            self.stamp_new(meta, old)
            return self.commit(rtype, namespace, meta["name"], obj)

    def stamp_new(self, meta: dict[str, Any], old: Object | None) -> None:
        """Server-owned metadata: kept from the stored object, else created."""
        previous = old["metadata"] if old is not None else {}
        meta["uid"] = previous.get("uid") or meta.get("uid") or str(uuid.uuid4())
        meta["creationTimestamp"] = (
            previous.get("creationTimestamp")
            or meta.get("creationTimestamp")
            or format_time(self.clock())
        )
        meta.setdefault("generation", previous.get("generation", 1))

    def remove(self, resource: str | ResourceType, namespace: str | None, name: str) -> Object:
        """Delete an object directly (a test hook); KeyError when absent."""
        return self.commit(resolve(resource), namespace or "", name, None)

    # -- watching --------------------------------------------------------------------------

    def open_watch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        labels: tuple[Requirement, ...],
        fields: tuple[FieldRequirement, ...],
        since: int | None,
        *,
        bookmarks: bool = False,
    ) -> Watch:
        """Register a watch, pre-filled with what it must replay first.

        ``since=None`` is the real server's "start at the current state": a synthetic ADDED for
        every matching object, then changes. Otherwise replay the history after ``since``, or
        410 Expired when that part of the history is gone.
        """
        watch = Watch(rtype, namespace, labels, fields, bookmarks, asyncio.get_running_loop())
        with self._lock:
            if since is None:
                for _, obj in self._select(rtype, namespace, labels, fields):
                    watch.push({"type": "ADDED", "object": copy.deepcopy(obj)})
            else:
                if since < self._compacted_rv:
                    raise expired(f"too old resource version: {since} ({self._compacted_rv + 1})")
                for event in self._history:
                    if event.resource_version > since:
                        watch.offer(event)
            self._watches.add(watch)
        return watch

    def close_watch(self, watch: Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def send_bookmarks(self) -> None:
        """Send a BOOKMARK at the current version to every watch that asked for bookmarks."""
        with self._lock:
            for watch in self._watches:
                self.bookmark(watch)

    def bookmark(self, watch: Watch) -> None:
        with self._lock:
            if watch.bookmarks:
                watch.push({"type": "BOOKMARK", "object": bookmark_object(watch.rtype, self._rv)})

    def drop_watches(self, *, abrupt: bool = False) -> int:
        """End every open watch stream; returns how many were open.

        ``abrupt=False`` ends each response cleanly, as the real server does at its timeout;
        ``abrupt=True`` cuts the connections, as a crashed server or a proxy would.
        """
        with self._lock:
            watches = list(self._watches)
            self._watches.clear()
        for watch in watches:
            watch.push(ABORT if abrupt else END)
        return len(watches)

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    # -- fault injection -------------------------------------------------------------------

    def inject_failures(
        self,
        resource: str | ResourceType,
        name: str | None = None,
        *,
        namespace: str | None = None,
        count: int = 1,
        code: int = 409,
    ) -> None:
        """Make the next ``count`` writes to an object (or to any object of the type when
        ``name`` is None) fail with ``code`` before they change anything."""
        with self._lock:
            self._faults.append(Fault(resolve(resource), namespace, name, count, code))

    def check_faults(self, rtype: ResourceType, namespace: str, name: str) -> None:
        with self._lock:
            for fault in self._faults:
                if (
                    fault.remaining > 0
                    and fault.rtype == rtype
                    and fault.name in (None, name)
                    and fault.namespace in (None, namespace)
                ):
                    fault.remaining -= 1
                    self._faults = [f for f in self._faults if f.remaining > 0]
                    raise _injected(fault.code, rtype, name)


def _injected(code: int, rtype: ResourceType, name: str) -> StatusError:
    if code == 409:
        return stale(rtype.plural, name, rtype.group)
    reason = next((r for r, c in CODES.items() if c == code), "InternalError")
    message = "Internal error occurred: injected fault" if code >= 500 else "injected fault"
    return StatusError(reason, message, code=code, resource=rtype.plural, name=name)


def _encode_continue(rv: int, after: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": after}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), str(data["start"])
    except (ValueError, KeyError, TypeError) as error:
        raise bad_request(f"continue key is not valid: {error}") from error


# What kube-apiserver's JSON of a kind's zero value holds besides its kind and metadata: the
# fields Go writes even when empty (no ``omitempty``, or a struct). Those of the kinds kubegpu
# watches with bookmarks, each compared with the real server's by e2e/tests/test_01_watch.py.
_ZERO_VALUE_FIELDS: dict[str, dict[str, Any]] = {
    "Pod": {"spec": {"containers": None}, "status": {}},
    "Node": {
        "spec": {},
        "status": {
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "",
                "osImage": "",
                "containerRuntimeVersion": "",
                "kubeletVersion": "",
                "kubeProxyVersion": "",
                "operatingSystem": "",
                "architecture": "",
            },
        },
    },
    "ResourceClaim": {"spec": {"devices": {"requests": None}}, "status": {}},
    "ResourceSlice": {
        "spec": {"driver": "", "pool": {"name": "", "generation": 0, "resourceSliceCount": 0}}
    },
}


def bookmark_object(rtype: ResourceType, version: int | str) -> dict[str, Any]:
    """A BOOKMARK's object as kube-apiserver sends it: the kind's zero value with only its
    version set (a Pod's ``spec.containers`` is null, which a client decoding it as a Pod must
    survive). Kinds kubegpu does not watch carry the metadata alone."""
    return {
        "kind": rtype.kind,
        "apiVersion": rtype.api_version,
        "metadata": {"resourceVersion": str(version)},
        **copy.deepcopy(_ZERO_VALUE_FIELDS.get(rtype.kind, {})),
    }
