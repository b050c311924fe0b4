"""From a Kubernetes REST path to what it addresses, and the discovery documents.

:func:`route` splits ``/api/v1/...`` and ``/apis/<group>/<version>/...`` paths into a resource
type, namespace, name and subresource (404 for anything the fake API server does not serve);
:func:`discovery_document` answers ``/api``, ``/apis`` and the group-version listings clients
read first. Separate from the server: both are pure functions of the path and the resource
table.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from kubegpu.testing.apiserver.replies import no_route
from kubegpu.testing.apiserver.resources import BY_PATH, RESOURCE_TYPES, ResourceType


@dataclass(frozen=True)
class RouteTarget:
    rtype: ResourceType | None  # None for the legacy "bindings" collection
    namespace: str | None
    name: str | None
    subresource: str | None
    watch_path: bool  # the deprecated /watch/ path prefix


def route(parts: list[str]) -> RouteTarget:
    """Split an API path into what it addresses; 404 for anything this server does not serve."""
    if len(parts) >= 2 and parts[0] == "api" and parts[1] == "v1":
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise no_route()
    watch_path = bool(rest) and rest[0] == "watch"
    if watch_path:
        rest = rest[1:]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise no_route()
    plural, name, sub = (
        rest[0],
        (rest[1] if len(rest) > 1 else None),
        (rest[2] if len(rest) > 2 else None),
    )
    if group == "" and plural == "bindings":
        return RouteTarget(None, namespace, name, sub, watch_path)
    rtype = BY_PATH.get((group, version, plural))
    if rtype is None or (namespace is not None and not rtype.namespaced):
        raise no_route()
    return RouteTarget(rtype, namespace, name, sub, watch_path)


def discovery_document(parts: list[str], host: str) -> dict[str, Any]:
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
        raise no_route()
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
