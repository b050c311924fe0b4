"""The demo's closing summary, computed from what the API server holds at the end.

Owns: counting pods by outcome, card usage and packing from the nodes' inventory annotations and
the pods' allocation annotations (the same records the extender and ``kubegpu inspect`` read),
an over-commit audit per card, each refused pod's reason and the reasons grouped. Pure: JSON in,
values out.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kubegpu.sharing.annotations import (
    INVENTORY_ANNOTATION,
    AnnotationError,
    decode_inventory,
)
from kubegpu.sharing.claim import TERMINAL_PHASES, read_claim
from kubegpu.sharing.resources import RequestKind

_NUMBER = re.compile(r"\b\d+\b")  # whole numbers only: model names keep theirs
# Refused pods listed one per line on the terminal; the JSON summary has them all.
MAX_REFUSED_SHOWN = 40


@dataclass(frozen=True)
class CardUse:
    node: str
    uuid: str
    index: int
    model: str
    memory_mib: int
    used_memory_mib: int
    used_compute_milli: int
    pods: tuple[str, ...]
    whole: bool

    @property
    def over_committed(self) -> bool:
        return self.used_compute_milli > 1000 or self.used_memory_mib > self.memory_mib


@dataclass(frozen=True)
class ReasonGroup:
    reason: str  # the reason with numbers and node names taken out
    count: int  # (pod, node) pairs refused for it
    pods: int
    example: str


@dataclass(frozen=True)
class RefusedPod:
    pod: str  # namespace/name
    request: str  # what it asked for, e.g. "2 whole GPUs", "8192 MiB + 300 milli of one GPU"
    reason: str  # why, per node: the extender's (or the scheduler's) filter reasons


@dataclass(frozen=True)
class DemoSummary:
    nodes: int
    cards_total: int
    cards_used: int
    cards_whole: int
    cards_shared: int
    gpu_memory_total_mib: int
    gpu_memory_allocated_mib: int
    shared_memory_total_mib: int  # on the cards holding shares
    shared_memory_allocated_mib: int
    pods_submitted: int
    pods_running: int
    pods_refused: int
    pods_failed: int
    pods_waiting: int  # neither running, refused nor failed: not yet decided
    over_committed: tuple[str, ...]
    top_reasons: tuple[ReasonGroup, ...]
    failures: Mapping[str, str] = field(default_factory=dict)
    placements: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    cards: tuple[CardUse, ...] = ()
    refused: tuple[RefusedPod, ...] = ()

    @property
    def memory_packed_pct(self) -> float:
        if not self.gpu_memory_total_mib:
            return 0.0
        return 100.0 * self.gpu_memory_allocated_mib / self.gpu_memory_total_mib

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["memory_packed_pct"] = round(self.memory_packed_pct, 2)
        doc["cards"] = [{**asdict(c), "over_committed": c.over_committed} for c in self.cards]
        return doc


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _key(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def refused_condition(pod: Mapping[str, Any]) -> str | None:
    """The PodScheduled=False message of a pending pod, if the scheduler gave up on it."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "Unschedulable")
    return None


def reason_template(reason: str) -> str:
    """'gpu-node-1: largest free card has 6144 MiB, pod needs 10240 MiB' ->
    'largest free card has N MiB, pod needs N MiB'."""
    _, sep, rest = reason.partition(": ")
    text = rest if sep else reason
    return _NUMBER.sub("N", text)


def _without_node(node: str, reason: str) -> str:
    """The extender prefixes each node's reason with the node's name; the scheduler's own
    (NodeResourcesFit) reasons have none."""
    prefix = f"{node}: "
    return reason[len(prefix) :] if reason.startswith(prefix) else reason


def pod_reason(by_node: Mapping[str, str]) -> str:
    """One pod's refusal, node -> reason, as one line: identical reasons share the list of
    nodes they came from, the reason given on most nodes first.

    {'a': 'a: needs 2 GPUs, 1 free', 'b': 'b: needs 2 GPUs, 1 free', 'c': 'Insufficient cpu'}
    -> 'a, b: needs 2 GPUs, 1 free; c: Insufficient cpu'"""
    nodes: dict[str, list[str]] = defaultdict(list)
    for node, reason in sorted(by_node.items()):
        nodes[_without_node(node, reason)].append(node)
    ordered = sorted(nodes.items(), key=lambda item: (-len(item[1]), item[1][0], item[0]))
    return "; ".join(
        text if names == ["-"] else f"{', '.join(names)}: {text}" for text, names in ordered
    )


def describe_request(pod: Mapping[str, Any]) -> str:
    """What a pod asks of the GPUs, in the words of the inspect table."""
    claim = read_claim(pod)
    request = claim.request
    if request is None:
        return f"unreadable request: {claim.refusal}"
    if request.kind is RequestKind.WHOLE:
        return f"{request.whole_gpus} whole GPU{'s' if request.whole_gpus != 1 else ''}"
    if request.kind is RequestKind.SHARED:
        return f"{request.gpu_memory_mib} MiB + {request.compute_milli} milli of one GPU"
    return "no GPU"


def group_reasons(refusals: Mapping[str, Mapping[str, str]], top: int = 5) -> list[ReasonGroup]:
    """Refusal reasons (pod -> node -> reason) grouped by wording, most frequent first."""
    counts: Counter[str] = Counter()
    pods: dict[str, set[str]] = defaultdict(set)
    examples: dict[str, str] = {}
    for pod, by_node in refusals.items():
        for reason in by_node.values():
            template = reason_template(reason)
            counts[template] += 1
            pods[template].add(pod)
            examples.setdefault(template, reason)
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [ReasonGroup(t, n, len(pods[t]), examples[t]) for t, n in ordered[:top]]


def summarize(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    refusals: Mapping[str, Mapping[str, str]] | None = None,
) -> DemoSummary:
    """``pods`` are the demo's pods; ``refusals`` the scheduler's last per-node reasons for the
    pods it gave up on (pods without one fall back to their PodScheduled message)."""
    cards: dict[tuple[str, str], dict[str, Any]] = {}
    for node in nodes:
        name = str(_meta(node).get("name"))
        raw = (_meta(node).get("annotations") or {}).get(INVENTORY_ANNOTATION)
        if raw is None:
            continue
        try:
            inventory = decode_inventory(raw)
        except AnnotationError:
            continue
        for gpu in inventory.gpus:
            cards[(name, gpu.uuid)] = {
                "node": name,
                "uuid": gpu.uuid,
                "index": gpu.index,
                "model": gpu.model,
                "memory_mib": gpu.memory_mib,
                "used_memory_mib": 0,
                "used_compute_milli": 0,
                "pods": [],
                "whole": False,
            }
    node_names = {card["node"] for card in cards.values()}
    running = refused = failed = waiting = 0
    failures: dict[str, str] = {}
    placements: dict[str, dict[str, Any]] = {}
    reasons: dict[str, Mapping[str, str]] = {}
    refused_pods: list[RefusedPod] = []
    pod_list = list(pods)
    for pod in pod_list:
        key = _key(pod)
        status = pod.get("status") or {}
        phase = status.get("phase") or "Pending"
        bound = (pod.get("spec") or {}).get("nodeName")
        if phase == "Running":
            running += 1
        elif phase == "Failed":
            failed += 1
            failures[key] = str(status.get("message") or status.get("reason") or "Failed")
        elif not bound and (message := refused_condition(pod)) is not None:
            refused += 1
            reasons[key] = (refusals or {}).get(key) or {"-": message}
            refused_pods.append(RefusedPod(key, describe_request(pod), pod_reason(reasons[key])))
        else:
            waiting += 1
        decision = read_claim(pod).decision
        placements[key] = {
            "phase": phase,
            "node": bound,
            "cards": [c.uuid for c in decision.cards] if decision is not None else [],
            "shared": decision.shared if decision is not None else None,
        }
        if decision is None or phase in TERMINAL_PHASES or decision.node != bound:
            continue
        for share in decision.cards:
            card = cards.get((decision.node, share.uuid))
            if card is None:
                continue
            card["pods"].append(key)
            card["used_compute_milli"] += share.compute_milli
            card["used_memory_mib"] += share.gpu_memory_mib
            card["whole"] = card["whole"] or not decision.shared
    uses = tuple(
        CardUse(
            node=c["node"],
            uuid=c["uuid"],
            index=c["index"],
            model=c["model"],
            memory_mib=c["memory_mib"],
            used_memory_mib=c["used_memory_mib"],
            used_compute_milli=c["used_compute_milli"],
            pods=tuple(c["pods"]),
            whole=c["whole"],
        )
        for c in sorted(cards.values(), key=lambda c: (c["node"], c["index"]))
    )
    over = tuple(
        f"{c.node} card {c.index}: {c.used_compute_milli} milli, "
        f"{c.used_memory_mib}/{c.memory_mib} MiB, pods {', '.join(c.pods)}"
        for c in uses
        if c.over_committed or (c.whole and len(c.pods) > 1)
    )
    return DemoSummary(
        nodes=len(node_names),
        cards_total=len(uses),
        cards_used=sum(1 for c in uses if c.pods),
        cards_whole=sum(1 for c in uses if c.whole),
        cards_shared=sum(1 for c in uses if c.pods and not c.whole),
        gpu_memory_total_mib=sum(c.memory_mib for c in uses),
        gpu_memory_allocated_mib=sum(min(c.used_memory_mib, c.memory_mib) for c in uses),
        shared_memory_total_mib=sum(c.memory_mib for c in uses if c.pods and not c.whole),
        shared_memory_allocated_mib=sum(
            min(c.used_memory_mib, c.memory_mib) for c in uses if c.pods and not c.whole
        ),
        pods_submitted=len(pod_list),
        pods_running=running,
        pods_refused=refused,
        pods_failed=failed,
        pods_waiting=waiting,
        over_committed=over,
        top_reasons=tuple(group_reasons(reasons)),
        failures=failures,
        placements=placements,
        cards=uses,
        refused=tuple(sorted(refused_pods, key=lambda r: r.pod)),
    )


def _pct(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


def render_summary(summary: DemoSummary) -> list[str]:
    """Plain lines for the terminal."""
    s = summary
    used_pct = 100.0 * s.cards_used / s.cards_total if s.cards_total else 0.0
    lines = [
        f"cards used      {s.cards_used}/{s.cards_total} ({used_pct:.0f} %): "
        f"{s.cards_whole} whole, {s.cards_shared} shared",
        f"memory packed   {s.gpu_memory_allocated_mib / 1024:.1f} of "
        f"{s.gpu_memory_total_mib / 1024:.1f} GiB GPU memory allocated "
        f"({s.memory_packed_pct:.1f} %); on the {s.cards_shared} shared cards "
        f"{s.shared_memory_allocated_mib / 1024:.1f} of {s.shared_memory_total_mib / 1024:.1f} GiB "
        f"({_pct(s.shared_memory_allocated_mib, s.shared_memory_total_mib):.1f} %)",
        f"pods            {s.pods_submitted} submitted: {s.pods_running} running, "
        f"{s.pods_refused} refused by the scheduler, {s.pods_failed} failed at admission, "
        f"{s.pods_waiting} still waiting for the scheduler",
        "over-committed  "
        + ("none (every card within its compute and memory)" if not s.over_committed else ""),
    ]
    lines.extend(f"  ! {line}" for line in s.over_committed)
    if s.top_reasons:
        lines.append("top refusal reasons (pod x node):")
        for g in s.top_reasons:
            example = f"; e.g. {g.example}" if g.example != g.reason else ""
            lines.append(f"  {g.count:>3} x {g.reason}  [{g.pods} pods{example}]")
    if s.refused:
        lines.append("refused pods (why, per node):")
        for r in s.refused[:MAX_REFUSED_SHOWN]:
            lines.append(f"  {r.pod} ({r.request}): {r.reason}")
        if len(s.refused) > MAX_REFUSED_SHOWN:
            lines.append(
                f"  ... and {len(s.refused) - MAX_REFUSED_SHOWN} more (all in --summary-json)"
            )
    for pod, message in sorted(s.failures.items()):
        lines.append(f"failed {pod}: {message}")
    return lines
