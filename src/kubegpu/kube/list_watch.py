"""The one list-then-watch loop of every cluster view the extender keeps (nodes and pods in
:mod:`kubegpu.kube.view`, ResourceSlices and ResourceClaims in :mod:`kubegpu.kube.dra_view`).

Relist when there is no resource version yet (the start, a 410 Gone, a bug), otherwise watch
from it; failures back off, and a relist, or a watch that moved the version on before it
failed, starts the count over. The view supplies what to do: list (returning the version),
watch (returning when the stream ends), and how to wait.

Every watch of kubegpu's opens through :func:`watch_events`, which asks for bookmarks: an idle
watch (the nodes of a quiet cluster, one node's pods) otherwise holds a resource version the
server compacts away after a few minutes, and its next re-open costs a 410 and a full relist.
Its events are the objects as the server sent them (plain JSON): kube-apiserver sends a
bookmark as the kind's zero value, and a Pod's (``"spec": {"containers": null}``) is not a
valid Pod to lightkube's models. Lists give the same form (:class:`RawNode`,
:class:`RawPod`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import httpx2 as httpx
import lightkube
from lightkube import ApiError
from lightkube.core.selector import build_selector
from lightkube.generic_resource import GenericGlobalResource, GenericNamespacedResource
from lightkube.resources.core_v1 import Node, Pod

log = logging.getLogger(__name__)


class RawNode(GenericGlobalResource):
    """Nodes listed as plain JSON, the form :func:`watch_events` gives: the views read a few
    fields, so decoding every object into lightkube's typed models buys nothing, costs most of
    a large listing's time, and refuses an object the models find incomplete."""

    _api_info = Node._api_info


class RawPod(GenericNamespacedResource):
    """Pods as plain JSON (see :class:`RawNode`)."""

    _api_info = Pod._api_info


@dataclass(frozen=True)
class Backoff:
    """Retry delays as data: ``initial_s`` doubling (``factor``) up to ``max_s``; ``delay(n)``
    after ``n`` failures in a row, counted from 1 (the node agent's
    :class:`kubegpu.kubelet.retry.RetryBackoff` counts retries from 0)."""

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0

    def delay(self, attempt: int) -> float:
        return float(min(self.max_s, self.initial_s * self.factor ** max(0, attempt - 1)))


class WatchedObject(dict[str, Any]):
    """One watched object exactly as the server sent it.

    lightkube's watch loop decodes each event's object into the request's response type and
    resumes a re-opened stream from ``obj.metadata.resourceVersion``; a plain ``dict`` with
    that one attribute keeps the loop and skips the models (and their validation)."""

    @property
    def metadata(self) -> _Version:
        meta = self.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        return _Version(str(version) if version else None)


class _Version(NamedTuple):
    resourceVersion: str | None  # lightkube's attribute name


def watch_events(
    client: lightkube.AsyncClient,
    kind: type[Any],
    *,
    resource_version: str | None,
    server_timeout: int | None,
    namespace: str | None = None,
    fields: dict[str, Any] | None = None,
) -> AsyncIterable[tuple[str, WatchedObject]]:
    """``client.watch(kind, ...)`` with ``allowWatchBookmarks=true``: events ``ADDED``,
    ``MODIFIED``, ``DELETED`` and ``BOOKMARK`` (an object holding only the version reached),
    each object a :class:`WatchedObject` (plain JSON).

    lightkube re-opens a stream the server ended cleanly from the last version it decoded, a
    bookmark's included, so an idle watch resumes from a version the server still has. Its
    ``watch`` has no parameter for bookmarks: the request is prepared here the way it prepares
    it, with the one parameter added."""
    params = {
        "timeoutSeconds": server_timeout,
        "resourceVersion": resource_version,
        "fieldSelector": build_selector(fields, for_fields=True) if fields else None,
        "allowWatchBookmarks": "true",
    }
    http = client._client
    request = http.prepare_request("list", res=kind, namespace=namespace, watch=True, params=params)
    # lightkube types it as one of its models; its decoder takes any dict subclass.
    request.response_type = WatchedObject  # type: ignore[assignment]
    stream: AsyncIterable[tuple[str, WatchedObject]] = http.watch(request)
    return stream


async def keep_listing_and_watching(
    label: str,
    versions: MutableMapping[str, str | None],
    relist: Callable[[], Awaitable[str]],
    watch: Callable[[], Awaitable[None]],
    backoff: Backoff,
    sleep: Callable[[float], Awaitable[None]],
) -> None:
    """Until cancelled. ``versions[label]`` is the resource version a watch resumes from,
    ``None`` to list first; after a failure the loop logs why and sleeps ``backoff``'s delay
    for the failures in a row that moved the version no further."""

    async def pause(failures: int, why: str) -> None:
        delay = backoff.delay(failures)
        log.warning("%s watch failed (%s); retrying in %.1f s", label, why, delay)
        await sleep(delay)

    failures = 0
    while True:
        watched_from = versions.get(label)
        relist_next = False
        try:
            if watched_from is None:
                versions[label] = watched_from = await relist()
                failures = 0
            await watch()
            continue
        except asyncio.CancelledError:
            raise
        except httpx.HTTPStatusError as exc:
            code = exc.status.code if isinstance(exc, ApiError) else exc.response.status_code
            if code == 410:
                log.info("%s watch expired at %s; relisting", label, versions.get(label))
                versions[label] = None
                continue
            why = f"API error {code}: {exc}"
        except (httpx.HTTPError, OSError, ValueError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a bug must not end the watch and leave the view stale
            log.exception("%s watch loop failed; relisting", label)
            relist_next = True
            why = f"{type(exc).__name__}: {exc}"
        # A watch that got somewhere before it failed starts the backoff over: counting every
        # failure since the last relist once grew a pause a minute to 30 s.
        failures = 1 if versions.get(label) != watched_from else failures + 1
        if relist_next:
            versions[label] = None
        await pause(failures, why)
