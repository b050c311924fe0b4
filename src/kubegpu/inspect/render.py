"""The inspect report as people read it (tables) and as programs read it (JSON).

:func:`report_to_json` is the ``-o json`` document; ``schema.json`` beside this module describes
it (JSON Schema 2020-12, loaded by :func:`load_schema`) and the tests validate every document
against it, so a change to one without the other fails. Memory is MiB and compute milli-GPU in
JSON (exact integers); tables show GiB and percent of a card. Pure: strings out, the caller
writes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from typing import Any

from kubegpu.inspect.mig_render import mig_json, mig_lines, mig_title
from kubegpu.inspect.report import (
    CardView,
    InspectReport,
    InventoryState,
    NodeView,
    PendingPod,
    PlacedBy,
    PodOnCard,
    Totals,
    UnplacedPod,
    UnplacedReason,
    UsageState,
)
from kubegpu.inspect.table import UNKNOWN, Grid, gib, percent
from kubegpu.placement.model import MILLI_PER_GPU

API_VERSION = "kubegpu.io/v1alpha1"
KIND = "GpuInspectReport"


def load_schema() -> dict[str, Any]:
    """The JSON Schema of :func:`report_to_json`'s output, shipped in the package."""
    text = resources.files("kubegpu.inspect").joinpath("schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


# --------------------------------------------------------------------------- JSON
def _totals_json(t: Totals) -> dict[str, Any]:
    return {
        "nodes": t.nodes,
        "gpus": t.gpus,
        "healthyGpus": t.healthy_gpus,
        "freeGpus": t.free_gpus,
        "memoryMiB": t.memory_mib,
        "allocatedMemoryMiB": t.allocated_memory_mib,
        "allocatedComputeMilli": t.allocated_compute_milli,
        "largestFreeMemoryMiB": t.largest_free_memory_mib,
        "unplacedWholeGpus": t.unplaced_whole_gpus,
        "usedMemoryMiB": t.used_memory_mib,
        "pods": t.pods,
    }


def _pod_json(p: PodOnCard) -> dict[str, Any]:
    return {
        "namespace": p.namespace,
        "name": p.name,
        "phase": p.phase,
        "mode": "shared" if p.shared else "whole",
        "bound": p.bound,
        "memoryMiB": p.memory_mib,
        "computeMilli": p.compute_milli,
        "usedMemoryMiB": p.used_memory_mib,
        "overShare": p.over_share,
        "placedBy": p.placed_by.value,
    }


def _card_json(c: CardView) -> dict[str, Any]:
    return {
        "index": c.index,
        "uuid": c.uuid,
        "model": c.model,
        "memoryMiB": c.memory_mib,
        "healthy": c.healthy,
        "allocatedMemoryMiB": c.allocated_memory_mib,
        "allocatedComputeMilli": c.allocated_compute_milli,
        "freeMemoryMiB": c.free_memory_mib,
        "overcommitted": c.overcommitted,
        "usedMemoryMiB": c.used_memory_mib,
        "utilizationRatio": c.utilization_ratio,
        "pods": [_pod_json(p) for p in c.pods],
    }


def _unplaced_json(u: UnplacedPod) -> dict[str, Any]:
    return {
        "namespace": u.namespace,
        "name": u.name,
        "phase": u.phase,
        "reason": u.reason.value,
        "wholeGpus": u.whole_gpus,
        "computeMilli": u.compute_milli,
        "memoryMiB": u.memory_mib,
    }


def _node_json(n: NodeView) -> dict[str, Any]:
    return {
        "name": n.name,
        "address": n.address,
        "inventory": n.inventory.value,
        "inventoryError": n.inventory_error,
        "advertisedGpus": n.advertised_gpus,
        "usage": n.usage.value,
        "usageError": n.usage_error,
        "totals": _totals_json(n.totals),
        "cards": [_card_json(c) for c in n.cards],
        "unplacedPods": [_unplaced_json(u) for u in n.unplaced],
        **mig_json(n),
    }


def _pending_json(p: PendingPod) -> dict[str, Any]:
    return {
        "namespace": p.namespace,
        "name": p.name,
        "state": p.state.value,
        "node": p.node,
        "wholeGpus": p.whole_gpus,
        "memoryMiB": p.memory_mib,
        "computeMilli": p.compute_milli,
        "cards": [
            {
                "uuid": c.uuid,
                "index": c.index,
                "memoryMiB": c.memory_mib,
                "computeMilli": c.compute_milli,
            }
            for c in p.cards
        ],
    }


def report_to_json(report: InspectReport) -> dict[str, Any]:
    """The ``-o json`` document (see ``schema.json``)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "generatedAt": report.generated_at,
        "filters": {"nodes": list(report.filters.nodes), "namespace": report.filters.namespace},
        "usage": report.usage.value,
        "totals": _totals_json(report.totals),
        "cpuOnlyNodes": report.cpu_only_nodes,
        "nodes": [_node_json(n) for n in report.nodes],
        "pending": [_pending_json(p) for p in report.pending],
        "warnings": [
            {
                "kind": w.kind.value,
                "message": w.message,
                "node": w.node,
                "uuid": w.uuid,
                "pod": w.pod,
            }
            for w in report.warnings
        ],
    }


# --------------------------------------------------------------------------- tables
def _compute(milli: int) -> str:
    return percent(milli, MILLI_PER_GPU)


def _used(card_used: int | None, node: NodeView) -> str:
    if node.usage is UsageState.OFF:
        return "-"
    return gib(card_used)


def _pod_label(p: PodOnCard, wide: bool, node: NodeView) -> str:
    label = p.key
    if not p.bound:
        label += " (binding)"
    if p.placed_by is PlacedBy.KUBELET:
        # No extender decision names this card; the node's kubelet does (through the exporter).
        label += " (per kubelet)"
    if wide:
        detail = f"{gib(p.memory_mib)}, {_compute(p.compute_milli)}"
        if node.usage is not UsageState.OFF and p.shared:
            detail += f", used {gib(p.used_memory_mib)}"
        if p.over_share:
            detail += ", OVER SHARE"
        label += f" [{detail}]"
    return label


def _node_title(node: NodeView) -> str:
    models = sorted({c.model for c in node.cards})
    parts = [f"node {node.name}"]
    if node.address and node.address != node.name:
        parts[0] += f" ({node.address})"
    if node.cards:
        parts.append(f"{len(node.cards)} GPU(s): {', '.join(models)}")
    if node.inventory is InventoryState.MISSING:
        parts.append(f"no inventory published, {node.advertised_gpus} GPU(s) advertised")
    elif node.inventory is InventoryState.INVALID:
        parts.append("inventory unreadable")
    if mig_title(node):
        parts.append(mig_title(node))
    if node.usage is UsageState.UNAVAILABLE:
        parts.append(f"exporter unavailable: {node.usage_error}")
    return " · ".join(parts)


def _node_lines(node: NodeView, wide: bool) -> Iterator[str]:
    headers = ["GPU", "MODEL", "MEMORY", "ALLOC MEM", "ALLOC COMPUTE", "USED MEM", "HEALTH"]
    if wide:
        headers += ["FREE MEM", "UTIL", "UUID"]
    grid = Grid([*headers, "PODS"])
    for card in node.cards:
        share = percent(card.allocated_memory_mib, card.memory_mib)
        health = "ok" if card.healthy else "UNHEALTHY"
        if card.overcommitted:
            health += " OVERCOMMITTED"
        row = [
            str(card.index),
            card.model or UNKNOWN,
            gib(card.memory_mib),
            f"{gib(card.allocated_memory_mib)} ({share})",
            _compute(card.allocated_compute_milli),
            _used(card.used_memory_mib, node),
            health,
        ]
        if wide:
            util = card.utilization_ratio
            if util is not None:
                shown_util = f"{round(util * 100)}%"
            else:
                shown_util = "-" if node.usage is UsageState.OFF else UNKNOWN
            row += [gib(card.free_memory_mib), shown_util, card.uuid]
        row.append(", ".join(_pod_label(p, wide, node) for p in card.pods) or "-")
        grid.add(row)
    for pod in node.unplaced:
        row = [
            UNKNOWN,
            "-",
            "-",
            gib(pod.memory_mib) if pod.memory_mib else "-",
            _compute(pod.compute_milli),
            "-",
            "-",
        ]
        if wide:
            row += ["-", "-", "-"]
        count = f"{pod.whole_gpus} GPU(s), " if pod.whole_gpus else ""
        row.append(f"{pod.key} ({count}{_UNPLACED_WHY[pod.reason]})")
        grid.add(row)
    t = node.totals
    row = [
        "total",
        f"{t.gpus} GPU(s), {t.healthy_gpus} healthy, {t.free_gpus} free",
        gib(t.memory_mib) if node.cards else UNKNOWN,
        f"{gib(t.allocated_memory_mib)} ({percent(t.allocated_memory_mib, t.memory_mib)})",
        f"{t.allocated_compute_milli / MILLI_PER_GPU:g} GPU",
        _used(t.used_memory_mib, node),
        "",
    ]
    if wide:
        row += [f"largest {gib(t.largest_free_memory_mib)}", "", ""]
    row.append(f"{t.pods} pod(s)")
    grid.section()
    grid.add(row)
    yield _node_title(node)
    # A node whose every card is in MIG mode has no card figures to show.
    if node.cards or node.unplaced or not node.mig_cards or node.inventory is not InventoryState.OK:
        yield from grid.lines("  ")
    yield from mig_lines(node, wide)


_UNPLACED_WHY = {
    UnplacedReason.NO_DECISION: "whole GPU(s) on cards not known (no allocation annotation)",
    UnplacedReason.UNKNOWN_CARD: "decision names a card this node does not have",
    UnplacedReason.NO_INVENTORY: "node publishes no inventory",
}


def _pending_lines(pending: tuple[PendingPod, ...]) -> Iterator[str]:
    grid = Grid(["POD", "STATE", "NODE", "REQUEST", "CARDS"])
    for p in pending:
        if p.whole_gpus:
            request = f"{p.whole_gpus} whole GPU(s)"
        else:
            request = f"{gib(p.memory_mib)}, {_compute(p.compute_milli)} of one GPU"
        cards = ", ".join(f"{c.index} ({c.uuid})" for c in p.cards) or "-"
        grid.add([p.key, p.state.value, p.node or "-", request, cards])
    # "pending" is the pod phase: refused (the scheduler found no node), unscheduled (not
    # tried yet), binding, starting.
    yield "pending GPU pods (phase Pending)"
    yield from grid.lines("  ")


def _cluster_line(report: InspectReport) -> str:
    t = report.totals
    text = (
        f"cluster: {t.nodes} GPU node(s), {t.gpus} GPU(s) ({t.healthy_gpus} healthy, "
        f"{t.free_gpus} free); memory allocated {gib(t.allocated_memory_mib)}/"
        f"{gib(t.memory_mib)} ({percent(t.allocated_memory_mib, t.memory_mib)}); compute "
        f"allocated {t.allocated_compute_milli / MILLI_PER_GPU:g}/{t.gpus} GPU"
    )
    if report.usage is not UsageState.OFF:
        text += f"; memory used {gib(t.used_memory_mib)}"
    if t.unplaced_whole_gpus:
        text += f"; {t.unplaced_whole_gpus} whole GPU(s) held on cards not known"
    mig_cards = sum(len(n.mig_cards) for n in report.nodes)
    if mig_cards:
        migs = sum(n.mig_devices for n in report.nodes)
        text += f"; {migs} MIG device(s) on {mig_cards} card(s) in MIG mode"
    if report.cpu_only_nodes:
        text += f"; {report.cpu_only_nodes} node(s) without GPUs not shown"
    return text


def render_text(report: InspectReport, *, wide: bool = False) -> str:
    """The whole report for a terminal: one table per node, cluster totals, pending pods,
    warnings; ends with a newline."""
    return "\n".join(_lines(report, wide)) + "\n"


def _lines(report: InspectReport, wide: bool) -> Iterator[str]:
    if not report.nodes:
        yield "no GPU nodes match"
    for node in report.nodes:
        yield from _node_lines(node, wide)
        yield ""
    yield _cluster_line(report)
    if report.pending:
        yield ""
        yield from _pending_lines(report.pending)
    if report.warnings:
        yield ""
        yield f"warnings ({len(report.warnings)})"
        for w in report.warnings:
            yield f"  ! {w.kind.value}: {w.message}"
