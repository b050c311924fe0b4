"""A node's cards in MIG mode as people read them (a table under the node's cards) and as
programs read them (the ``migCards``, ``migRequests`` and ``migError`` fields of a node in
``-o json``; ``schema.json`` describes them).

A table row per MIG device under a line per card, in placement order, as ``nvidia-smi mig
-lgi`` lists GPU instances: GPU-instance id, profile, placement (``start:slices``), memory,
health and the pods the kubelet gave it; then a ``?`` row per pod asking for MIG devices that
no reading names. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kubegpu.inspect.report import MigCardView, MigDeviceView, MigRequest, NodeView
from kubegpu.inspect.table import UNKNOWN, Grid, gib


# --------------------------------------------------------------------------- JSON
def _device_json(d: MigDeviceView) -> dict[str, Any]:
    return {
        "uuid": d.uuid,
        "profile": d.profile,
        "placementStart": d.start,
        "placementSlices": d.slices,
        "memoryMiB": d.memory_mib,
        "gpuInstanceId": d.gpu_instance_id,
        "resource": d.resource,
        "healthy": d.healthy,
        "pods": [{"namespace": p.namespace, "name": p.name, "phase": p.phase} for p in d.pods],
    }


def _card_json(c: MigCardView) -> dict[str, Any]:
    return {
        "index": c.index,
        "uuid": c.uuid,
        "model": c.model,
        "memoryMiB": c.memory_mib,
        "healthy": c.healthy,
        "migDevices": [_device_json(d) for d in c.devices],
    }


def _request_json(r: MigRequest) -> dict[str, Any]:
    return {
        "namespace": r.namespace,
        "name": r.name,
        "phase": r.phase,
        "resource": r.resource,
        "profile": r.profile,
        "count": r.count,
        "memoryMiB": r.memory_mib,
    }


def mig_json(node: NodeView) -> dict[str, Any]:
    """The node's MIG fields of the ``-o json`` document."""
    return {
        "migCards": [_card_json(c) for c in node.mig_cards],
        "migRequests": [_request_json(r) for r in node.mig_requests],
        "migError": node.mig_error,
    }


# --------------------------------------------------------------------------- tables
def mig_title(node: NodeView) -> str:
    """What the node's title line says of MIG ("" for a node without)."""
    if node.mig_error:
        return "MIG devices unreadable"
    if not node.mig_cards:
        return ""
    return f"{len(node.mig_cards)} card(s) in MIG mode, {node.mig_devices} MIG device(s)"


def _instances(r: MigRequest) -> str:
    if r.count == 1:
        return f"a {r.profile} instance; which one is not known"
    return f"{r.count} {r.profile} instances; which ones are not known"


def _card_note(card: MigCardView, wide: bool) -> str:
    parts = [f"GPU {card.index}", card.model or UNKNOWN, gib(card.memory_mib), "in MIG mode"]
    if not card.healthy:
        parts.append("UNHEALTHY")
    parts.append(f"{len(card.devices)} MIG device(s)" if card.devices else "no MIG devices")
    if wide:
        parts.append(card.uuid)
    return " · ".join(parts)


def mig_lines(node: NodeView, wide: bool) -> Iterator[str]:
    """The node's MIG table (nothing for a node without cards in MIG mode)."""
    if not node.mig_cards:
        return
    headers = ["MIG DEVICE", "PROFILE", "PLACEMENT", "MEMORY", "HEALTH"]
    if wide:
        headers += ["RESOURCE", "UUID"]
    grid = Grid([*headers, "PODS"])
    for card in node.mig_cards:
        grid.note(_card_note(card, wide))
        for d in card.devices:
            row = [
                f"{card.index} GI {d.gpu_instance_id}",
                d.profile,
                f"{d.start}:{d.slices}",
                gib(d.memory_mib),
                "ok" if d.healthy else "UNHEALTHY",
            ]
            if wide:
                row += [d.resource or "-", d.uuid]
            row.append(", ".join(p.key for p in d.pods) or "-")
            grid.add(row)
    for r in node.mig_requests:
        row = [UNKNOWN, r.profile, "-", gib(r.count * r.memory_mib), "-"]
        if wide:
            row += [r.resource, "-"]
        row.append(f"{r.key} ({_instances(r)})")
        grid.add(row)
    yield from grid.lines("  ")
