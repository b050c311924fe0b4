"""kube-scheduler's extender JSON, parsed into plain values and rendered back.

The scheduler's Go types have no JSON tags, so keys are the Go field names (PascalCase) on the
way in; Go reads replies case-insensitively but we answer in PascalCase too. Unused members are
``null``. Anything that does not have the documented shape raises :class:`WireError` (mapped
to HTTP 400 by the server), never a KeyError deep in a handler.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

MAX_NODE_NAMES = 100_000
# Object names as kube-apiserver validates them: RFC 1123 subdomains (namespaces: labels).
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class WireError(ValueError):
    """The request body does not have the shape kube-scheduler sends."""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    node_names: tuple[str, ...]
    # Full Node objects when the scheduler is not node-cache-capable (echoed back on filter).
    nodes: tuple[Mapping[str, Any], ...] | None


@dataclass(frozen=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def _get(body: Mapping[str, Any], key: str) -> Any:
    # Go decodes field names case-insensitively; accept the same on the way in.
    if key in body:
        return body[key]
    lowered = key.lower()
    for k, v in body.items():
        if isinstance(k, str) and k.lower() == lowered:
            return v
    return None


def parse_extender_args(body: object) -> ExtenderArgs:
    if not isinstance(body, Mapping):
        raise WireError("body must be a JSON object (ExtenderArgs)")
    pod = _get(body, "Pod")
    if not isinstance(pod, Mapping):
        raise WireError("Pod must be an object")
    if not isinstance(pod.get("metadata", {}), Mapping) or not isinstance(
        pod.get("spec", {}), Mapping
    ):
        raise WireError("Pod.metadata and Pod.spec must be objects")
    names_raw = _get(body, "NodeNames")
    nodes_raw = _get(body, "Nodes")
    if names_raw is not None:
        names = _names(names_raw)
        return ExtenderArgs(pod, names, None)
    if nodes_raw is not None:
        if not isinstance(nodes_raw, Mapping):
            raise WireError("Nodes must be a NodeList object or null")
        items = nodes_raw.get("items") or []
        if not isinstance(items, list) or len(items) > MAX_NODE_NAMES:
            raise WireError("Nodes.items must be a list")
        nodes: list[Mapping[str, Any]] = []
        names_list: list[str] = []
        for item in items:
            meta = item.get("metadata") if isinstance(item, Mapping) else None
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if not isinstance(name, str) or not name:
                raise WireError("every item of Nodes.items needs metadata.name")
            nodes.append(item)
            names_list.append(name)
        return ExtenderArgs(pod, tuple(names_list), tuple(nodes))
    return ExtenderArgs(pod, (), None)


def _names(raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_NODE_NAMES:
        raise WireError("NodeNames must be a list of strings or null")
    # Checked with C-level set/containment operations: this list has every node of the cluster.
    if not set(map(type, raw)) <= {str} or "" in raw:
        raise WireError("NodeNames must hold non-empty strings")
    return tuple(raw)


def parse_binding_args(body: object) -> BindingArgs:
    if not isinstance(body, Mapping):
        raise WireError("body must be a JSON object (ExtenderBindingArgs)")
    values = []
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = _get(body, key)
        if not isinstance(value, str) or not value or len(value) > 253:
            raise WireError(f"{key} must be a non-empty string")
        values.append(value)
    name, namespace, uid, node = values
    if not _SUBDOMAIN.fullmatch(name) or not _SUBDOMAIN.fullmatch(node):
        raise WireError(f"PodName {name!r:.60} and Node {node!r:.60} must be DNS subdomain names")
    if len(namespace) > 63 or not _LABEL.fullmatch(namespace):
        raise WireError(f"PodNamespace {namespace!r:.60} must be a DNS label")
    if not uid.isprintable():
        raise WireError("PodUID must be printable")
    return BindingArgs(name, namespace, uid, node)


def filter_result(
    args: ExtenderArgs,
    passed: Sequence[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> dict[str, Any]:
    """ExtenderFilterResult: ``NodeNames`` in cache mode, else ``Nodes`` echoing the passed
    Node objects (always a subset of the input, as the scheduler requires)."""
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }
    if args.nodes is None:
        result["NodeNames"] = list(passed)
    else:
        keep = set(passed)
        result["Nodes"] = {
            "metadata": {},
            "items": [n for n in args.nodes if n["metadata"]["name"] in keep],
        }
    return result


class HostPriority(msgspec.Struct):
    """One HostPriorityList entry; a Struct so 5,000 of them are built and encoded in C."""

    Host: str
    Score: int


def priority_list(scores: Sequence[tuple[str, int]]) -> list[HostPriority]:
    return [HostPriority(host, score) for host, score in scores]
