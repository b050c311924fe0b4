"""kube-scheduler's extender JSON, parsed into plain values and rendered back.

The scheduler's Go types have no JSON tags, so keys are the Go field names (PascalCase) on the
way in; Go reads replies case-insensitively but we answer in PascalCase too. Unused members are
``null``. Anything that does not have the documented shape raises :class:`WireError` (mapped
to HTTP 400 by the server), never a KeyError deep in a handler.

The hot path (a filter and a prioritize per pod, each with up to thousands of node names) has
its own decoder and encoders: :func:`parse_extender_body` reads the exact shape kube-scheduler
writes with typed msgspec decoding and a cache of recently seen ``NodeNames`` lists (by their
raw bytes), and :func:`encode_filter_result` / :class:`PriorityEncoder` write the replies
without building a Python object per node. Each gives byte-for-byte what the generic path
gives; tests hold them equal.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from kubegpu.core.names import is_dns_label, is_dns_subdomain

MAX_NODE_NAMES = 100_000


class WireError(ValueError):
    """The request body does not have the shape kube-scheduler sends."""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    node_names: tuple[str, ...]
    # Full Node objects when the scheduler is not node-cache-capable (echoed back on filter).
    nodes: tuple[Mapping[str, Any], ...] | None
    # The Pod's JSON as sent, when read by the fast path: filter and prioritize of one pod send
    # the same bytes, so what is derived from the pod can be remembered under them.
    pod_raw: bytes | None = field(default=None, compare=False)


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


class _CacheModeArgs(msgspec.Struct, forbid_unknown_fields=True):
    """ExtenderArgs exactly as kube-scheduler's Go encoder writes it for a node-cache-capable
    extender: all three fields, ``Nodes`` null, ``NodeNames`` kept raw for the cache."""

    Pod: msgspec.Raw
    Nodes: None
    NodeNames: msgspec.Raw


_CACHE_MODE_DECODER = msgspec.json.Decoder(_CacheModeArgs)
_NAMES_DECODER = msgspec.json.Decoder(list[str])
_GENERIC_DECODER = msgspec.json.Decoder()


class NodeNamesCache:
    """The last few ``NodeNames`` lists by their raw JSON bytes.

    kube-scheduler sends the same node list to filter pod after pod, and prioritize gets back
    the list filter just answered; recognising the bytes skips decoding thousands of strings
    and, because the same tuple object comes back, makes the scheduler's name -> row cache hit
    on identity instead of comparing every name.
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._entries: OrderedDict[bytes, tuple[str, ...]] = OrderedDict()

    def names(self, raw: bytes) -> tuple[str, ...] | None:
        """The names in ``raw`` (a JSON array), or ``None`` when it is anything but a list of
        at most :data:`MAX_NODE_NAMES` non-empty strings (the generic path then says why)."""
        found = self._entries.get(raw)
        if found is not None:
            self._entries.move_to_end(raw)
            return found
        try:
            decoded = _NAMES_DECODER.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            return None
        if len(decoded) > MAX_NODE_NAMES or "" in decoded:
            return None
        names = tuple(decoded)
        self.remember(raw, names)
        return names

    def remember(self, raw: bytes, names: tuple[str, ...]) -> None:
        self._entries[raw] = names
        self._entries.move_to_end(raw)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


def parse_extender_body(
    raw: bytes, cache: NodeNamesCache, check: Callable[[Any], None] | None = None
) -> ExtenderArgs:
    """:func:`parse_extender_args` of the JSON ``raw``, fast for kube-scheduler's own shape.

    Raises ``msgspec.DecodeError`` when ``raw`` is not JSON (``UnicodeDecodeError`` when a
    string in it is not UTF-8) and :class:`WireError` when it is
    not ExtenderArgs, exactly as decoding generically and calling :func:`parse_extender_args`
    would; any body the typed decoder does not take goes that generic way. ``check`` is shown
    every value decoded without a schema (the pod; on the generic way the whole body) and may
    raise: the caller's depth limit.
    """
    try:
        fast = _CACHE_MODE_DECODER.decode(raw)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        fast = None
    if fast is not None:
        pod_raw = bytes(fast.Pod)
        pod = _GENERIC_DECODER.decode(pod_raw)
        names = cache.names(bytes(fast.NodeNames))
        if (
            names is not None
            and isinstance(pod, dict)
            and isinstance(pod.get("metadata", {}), Mapping)
            and isinstance(pod.get("spec", {}), Mapping)
        ):
            if check is not None:
                check(pod)
            return ExtenderArgs(pod, names, None, pod_raw)
    body = _GENERIC_DECODER.decode(raw)
    if check is not None:
        check(body)
    return parse_extender_args(body)


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
    if not is_dns_subdomain(name) or not is_dns_subdomain(node):
        raise WireError(f"PodName {name!r:.60} and Node {node!r:.60} must be DNS subdomain names")
    if not is_dns_label(namespace):
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


_ENCODER = msgspec.json.Encoder()


def encode_filter_result(
    passed: Sequence[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    cache: NodeNamesCache | None = None,
) -> bytes:
    """``filter_result`` of a node-cache-mode request, encoded; the same bytes, without copying
    the reason maps. With ``cache``, the passed names are remembered under the bytes written,
    so the prioritize call that sends them back is recognised."""
    names = _ENCODER.encode(passed)
    if cache is not None and isinstance(passed, tuple):
        cache.remember(names, passed)
    return b"".join(
        (
            b'{"Nodes":null,"NodeNames":',
            names,
            b',"FailedNodes":',
            _ENCODER.encode(failed),
            b',"FailedAndUnresolvableNodes":',
            _ENCODER.encode(unresolvable),
            b',"Error":""}',
        )
    )


class PriorityEncoder:
    """Writes a HostPriorityList for engine rows: the JSON of every (row, score 0..10) entry is
    made once per node list, so a reply is a join of ready-made pieces (thousands of nodes)."""

    SCORES = 11  # extender priorities are 0..10

    def __init__(self, names: Sequence[str]) -> None:
        self.names = names
        pieces: list[bytes] = []
        for name in names:
            head = b'{"Host":' + _ENCODER.encode(name) + b',"Score":'
            pieces.extend(head + str(score).encode() + b"}" for score in range(self.SCORES))
        # An object array: numpy's fancy indexing picks thousands of pieces in C.
        self._pieces = np.empty(len(pieces), dtype=object)
        self._pieces[:] = pieces

    def encode(self, rows: npt.NDArray[np.int64], scores: npt.NDArray[np.int64]) -> bytes:
        """The list for ``names[rows[k]]`` scoring ``scores[k]``, in that order."""
        if rows.size == 0:
            return b"[]"
        if int(scores.min()) < 0 or int(scores.max()) >= self.SCORES:
            return _ENCODER.encode(
                priority_list(
                    [
                        (self.names[r], s)
                        for r, s in zip(rows.tolist(), scores.tolist(), strict=True)
                    ]
                )
            )
        picked: list[bytes] = self._pieces[rows * self.SCORES + scores].tolist()
        return b"[" + b",".join(picked) + b"]"


class HostPriority(msgspec.Struct):
    """One HostPriorityList entry; a Struct so 5,000 of them are built and encoded in C."""

    Host: str
    Score: int


def priority_list(scores: Sequence[tuple[str, int]]) -> list[HostPriority]:
    return [HostPriority(host, score) for host, score in scores]


@dataclass(frozen=True)
class PreemptionArgs:
    """kube-scheduler's ExtenderPreemptionArgs: the waiting pod and, per candidate node, the
    UIDs of the victims its own dry run chose (most important first) with its count of
    disruption-budget violations among them."""

    pod: Mapping[str, Any]
    victims: dict[str, tuple[tuple[str, ...], int]]


def parse_preemption_args(body: object) -> PreemptionArgs:
    """Either map may come: ``NodeNameToMetaVictims`` (UIDs, nodeCacheCapable: true) or
    ``NodeNameToVictims`` (whole pods); the unused one is ``null``."""
    if not isinstance(body, Mapping):
        raise WireError("body must be a JSON object (ExtenderPreemptionArgs)")
    pod = _get(body, "Pod")
    if not isinstance(pod, Mapping) or not isinstance(pod.get("metadata", {}), Mapping):
        raise WireError("Pod must be an object with metadata")
    victims: dict[str, tuple[tuple[str, ...], int]] = {}
    for key, uid_of in (("NodeNameToMetaVictims", _meta_uid), ("NodeNameToVictims", _pod_uid)):
        by_node = _get(body, key)
        if by_node is None:
            continue
        if not isinstance(by_node, Mapping) or len(by_node) > MAX_NODE_NAMES:
            raise WireError(f"{key} must be an object keyed by node name, or null")
        for node, entry in by_node.items():
            if not isinstance(node, str) or not is_dns_subdomain(node):
                raise WireError(f"{key}: node name {node!r:.60} is not a DNS subdomain name")
            if not isinstance(entry, Mapping):
                raise WireError(f"{key}[{node}] must be an object (Pods, NumPDBViolations)")
            pods = _get(entry, "Pods") or []
            count = _get(entry, "NumPDBViolations") or 0
            if not isinstance(pods, list) or not isinstance(count, int) or count < 0:
                raise WireError(f"{key}[{node}]: Pods must be a list, NumPDBViolations >= 0")
            victims[node] = (tuple(uid_of(key, node, p) for p in pods), count)
    return PreemptionArgs(pod, victims)


def _meta_uid(key: str, node: str, entry: object) -> str:
    uid = _get(entry, "UID") if isinstance(entry, Mapping) else None
    if not isinstance(uid, str) or not uid or not uid.isprintable():
        raise WireError(f"{key}[{node}].Pods: every entry needs a UID")
    return uid


def _pod_uid(key: str, node: str, entry: object) -> str:
    meta = entry.get("metadata") if isinstance(entry, Mapping) else None
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    if not isinstance(uid, str) or not uid or not uid.isprintable():
        raise WireError(f"{key}[{node}].Pods: every pod needs metadata.uid")
    return uid


def preemption_result(victims: Mapping[str, tuple[Sequence[str], int]]) -> dict[str, Any]:
    """ExtenderPreemptionResult: always the meta form (UIDs), whatever nodeCacheCapable says;
    a node left out is one the extender refuses."""
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": count}
            for node, (uids, count) in victims.items()
        }
    }
