"""The verbs on a collection of the fake API server: list, deletecollection and watch.

A list page (selectors, ``limit`` and ``continue``), a deletecollection built on it, and a watch
stream with bookmarks, ``timeoutSeconds`` and the real server's in-stream ``ERROR`` event. The
verbs on one object live in :mod:`kubegpu.testing.apiserver.verbs`; these are separate because
they answer many objects, and a watch is a stream rather than one reply.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from kubegpu.testing.apiserver import verbs
from kubegpu.testing.apiserver.errors import StatusError, bad_request
from kubegpu.testing.apiserver.replies import JSON, WATCH_TRUE, int_param, watch_event_line
from kubegpu.testing.apiserver.resources import ResourceType
from kubegpu.testing.apiserver.selectors import parse_field_selector, parse_label_selector
from kubegpu.testing.apiserver.store import END, Store

log = logging.getLogger(__name__)


def list_collection(
    store: Store, rtype: ResourceType, namespace: str | None, query: dict[str, str]
) -> dict[str, Any]:
    """One list page, as kube-apiserver answers a GET on a collection."""
    labels = parse_label_selector(query.get("labelSelector", ""))
    fields = parse_field_selector(query.get("fieldSelector", ""), rtype.selectable_fields)
    limit = int_param(query, "limit")
    items, rv, token, remaining = store.select(
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


def delete_collection(
    store: Store,
    rtype: ResourceType,
    namespace: str | None,
    query: dict[str, str],
    *,
    graceful_pods: bool,
) -> dict[str, Any]:
    """Delete what a list with the same query returns; answers the deleted objects."""
    listing = list_collection(store, rtype, namespace, query)
    deleted = []
    for item in listing["items"]:
        meta = item["metadata"]
        deleted.append(
            verbs.delete(
                store,
                rtype,
                meta.get("namespace", ""),
                meta["name"],
                None,
                grace_period_s=int_param(query, "gracePeriodSeconds"),
                graceful_pods=graceful_pods,
            )
        )
    return {
        "kind": rtype.list_kind,
        "apiVersion": rtype.api_version,
        "metadata": {"resourceVersion": str(store.resource_version)},
        "items": deleted,
    }


# kube-apiserver's watch cache sends a bookmark (to a watch that asked) about every minute
# whatever the traffic, and one 2 s before the watch's deadline, so a client re-opening at the
# timeout resumes from a version the server still holds (k8s.io/apiserver's cacheWatcher).
PRE_TIMEOUT_BOOKMARK_S = 2.0


def _next_bookmark(now: float, deadline: float | None, interval_s: float) -> float | None:
    """When the next bookmark is due after one sent (or the watch opened) at ``now``: the
    interval on, or the pre-timeout one when that comes sooner; None when that is past (as the
    cacher: a watch of under 2 s gets none, one past its pre-timeout bookmark no more)."""
    due = now + interval_s
    if deadline is not None:
        due = min(due, deadline - PRE_TIMEOUT_BOOKMARK_S)
    return due if due >= now else None


async def serve_watch(
    request: web.Request,
    store: Store,
    rtype: ResourceType,
    namespace: str | None,
    query: dict[str, str],
    *,
    bookmark_interval_s: float,
) -> web.StreamResponse:
    """Stream a watch's events until its timeout, its end, or the client hangs up."""
    labels = parse_label_selector(query.get("labelSelector", ""))
    fields = parse_field_selector(query.get("fieldSelector", ""), rtype.selectable_fields)
    timeout = int_param(query, "timeoutSeconds")
    bookmarks = query.get("allowWatchBookmarks", "").lower() in WATCH_TRUE
    rv = query.get("resourceVersion", "")
    if rv not in ("", "0") and not rv.isdigit():
        raise bad_request(f'resourceVersion: Invalid value: "{rv}": must be an integer')
    since = int(rv) if rv not in ("", "0") else None
    response = web.StreamResponse(status=200, headers={"Content-Type": JSON})
    response.enable_chunked_encoding()
    try:
        watch = store.open_watch(rtype, namespace, labels, fields, since, bookmarks=bookmarks)
    except StatusError as error:
        # Like the real server: 200, then one ERROR event carrying the Status, then end.
        await response.prepare(request)
        await response.write(watch_event_line({"type": "ERROR", "object": error.to_status()}))
        await response.write_eof()
        return response
    await response.prepare(request)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout if timeout else None
    next_bookmark = (
        _next_bookmark(loop.time(), deadline, bookmark_interval_s) if bookmarks else None
    )
    try:
        while True:
            now = loop.time()
            if deadline is not None and now >= deadline:
                break
            if next_bookmark is not None and now >= next_bookmark:
                store.bookmark(watch)
                next_bookmark = _next_bookmark(now, deadline, bookmark_interval_s)
            waits = [t - now for t in (deadline, next_bookmark) if t is not None]
            item = await watch.next(max(0.0, min(waits)) if waits else None)
            if item is None:
                continue
            if item == END:
                break
            if isinstance(item, str):  # ABORT
                if request.transport is not None:
                    request.transport.abort()
                return response
            await response.write(watch_event_line(item))
        await response.write_eof()
    except ConnectionResetError:
        # The client went away mid-stream; that ends a watch, it is not a server error.
        log.debug("watch client of %s disconnected", rtype.plural)
    finally:
        store.close_watch(watch)
    return response
