"""The ``kubegpu.io/gpu-allocated`` annotation: what the node agent handed out, per container.

The device plugin API gives ``Allocate`` no pod identity (docs/sharing.md, "Node agent"), so
the agent records each share it hands out on the pod it served, *before* the answer goes back:
card, slot, GPU memory and compute, exactly what the container's environment says. A
restarted agent continues from these records, and reconciliation against the kubelet's
PodResources rewrites them (:mod:`kubegpu.kubelet.records`). This module is the annotation's
only codec. Pure: strings in, frozen values out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from kubegpu.sharing.annotations import CardShare

ALLOCATED_ANNOTATION = "kubegpu.io/gpu-allocated"
LEDGER_VERSION = 1


class LedgerError(ValueError):
    """A malformed ``kubegpu.io/gpu-allocated`` annotation."""


@dataclass(frozen=True)
class GrantedContainer:
    """One container's card as handed out (``source`` "allocate") or as learnt from the
    kubelet's PodResources API ("podresources"); ``verified`` once PodResources agreed (never,
    for a regular init container: PodResources does not list those).
    ``trade`` is set when PodResources showed that this container was handed the share decided
    for another pod's container (see :class:`Trade`)."""

    name: str
    uuid: str
    slot: str
    compute_milli: int
    gpu_memory_mib: int
    allocated_at: str
    verified: bool = False
    source: str = "allocate"
    trade: Trade | None = None


@dataclass(frozen=True)
class Trade:
    """This container got the share decided for ``pod``'s ``container``, so that container
    takes over ``token`` (the share decided for this one) and ``grant`` (what had been handed
    out under this container's name, if anything). Written on the holder first: should the
    agent stop before the other pod's records are rewritten, the next agent finishes the
    exchange from here (:mod:`kubegpu.kubelet.records`)."""

    pod: str  # namespace/name
    container: str
    token: CardShare
    grant: GrantedContainer | None = None


@dataclass(frozen=True)
class Ledger:
    node: str
    containers: tuple[GrantedContainer, ...] = ()

    def names(self) -> set[str]:
        return {c.name for c in self.containers}

    def get(self, name: str) -> GrantedContainer | None:
        return next((c for c in self.containers if c.name == name), None)

    def with_container(self, granted: GrantedContainer) -> Ledger:
        rest = tuple(c for c in self.containers if c.name != granted.name)
        return replace(self, containers=(*rest, granted))


def _granted_doc(c: GrantedContainer) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": c.name,
        "uuid": c.uuid,
        "slot": c.slot,
        "computeMilli": c.compute_milli,
        "memoryMiB": c.gpu_memory_mib,
        "allocatedAt": c.allocated_at,
        "verified": c.verified,
        "source": c.source,
    }
    if c.trade is not None:
        t = c.trade
        doc["trade"] = {
            "pod": t.pod,
            "container": t.container,
            "token": {
                "uuid": t.token.uuid,
                "index": t.token.index,
                "computeMilli": t.token.compute_milli,
                "memoryMiB": t.token.gpu_memory_mib,
            },
            # One level only: a traded grant's own trade is history nobody needs.
            "grant": None if t.grant is None else _granted_doc(replace(t.grant, trade=None)),
        }
    return doc


def encode_ledger(ledger: Ledger) -> str:
    doc = {
        "v": LEDGER_VERSION,
        "node": ledger.node,
        "containers": [_granted_doc(c) for c in ledger.containers],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def decode_ledger(text: object) -> Ledger:
    if not isinstance(text, str) or len(text) > 64 * 1024:
        raise LedgerError(f"{ALLOCATED_ANNOTATION} must be a string of at most 64 KiB")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise LedgerError(f"{ALLOCATED_ANNOTATION}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("v") != LEDGER_VERSION:
        raise LedgerError(f"{ALLOCATED_ANNOTATION}: not a v{LEDGER_VERSION} object")
    node = doc.get("node")
    items = doc.get("containers")
    if not isinstance(node, str) or not isinstance(items, list):
        raise LedgerError(f"{ALLOCATED_ANNOTATION}: node and containers are required")
    out: list[GrantedContainer] = []
    for i, item in enumerate(items):
        try:
            out.append(_granted(item, nested=False))
        except (KeyError, TypeError) as exc:
            raise LedgerError(f"{ALLOCATED_ANNOTATION}: containers[{i}]: {exc}") from None
    return Ledger(node, tuple(out))


def _granted(item: object, *, nested: bool) -> GrantedContainer:
    trade: Trade | None = None
    raw = item.get("trade") if isinstance(item, dict) and not nested else None
    if raw is not None:
        token = _typed(raw, "token", dict)
        grant = raw.get("grant") if isinstance(raw, dict) else None
        trade = Trade(
            pod=_typed(raw, "pod", str),
            container=_typed(raw, "container", str),
            token=CardShare(
                _typed(token, "uuid", str),
                _typed(token, "index", int),
                _typed(token, "computeMilli", int),
                _typed(token, "memoryMiB", int),
            ),
            grant=None if grant is None else _granted(grant, nested=True),
        )
    return GrantedContainer(
        name=_typed(item, "name", str),
        uuid=_typed(item, "uuid", str),
        slot=_typed(item, "slot", str),
        compute_milli=_typed(item, "computeMilli", int),
        gpu_memory_mib=_typed(item, "memoryMiB", int),
        allocated_at=_typed(item, "allocatedAt", str),
        verified=_typed(item, "verified", bool),
        source=_typed(item, "source", str),
        trade=trade,
    )


def _typed(item: object, key: str, kind: type) -> Any:
    if not isinstance(item, dict):
        raise TypeError("must be an object")
    value = item[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"{key} must be {kind.__name__}")
    return value
