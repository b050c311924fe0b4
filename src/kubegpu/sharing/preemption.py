"""Card-level preemption: which lower-priority pods to evict so that one card (or, for whole
GPUs, enough cards) can take a waiting pod.

kube-scheduler's own preemption counts node totals only (``nvidia.com/gpu``, share slots, CPU,
memory): it may evict pods whose removal frees no card the waiting share could use, and for a
share blocked only by card memory or compute it finds no victim at all (docs/sharing.md,
"Priorities and preemption"). This module answers the card-level question, pure (values in,
values out), for both the extender's preempt verb and its own preemption
(:mod:`kubegpu.extender.preemption`):

* :func:`victims_on_node`: on one node, the smallest set of candidates whose removal lets the
  pod fit (a share: one card with the compute and memory it asks; whole GPUs: that many cards
  entirely free; CPU and memory of the node too), fewest disruption-budget violations first,
  then fewest pods, then the lowest priorities;
* :func:`pick_node`: among nodes, kube-scheduler's own order (``pickOneNodeForPreemption``):
  fewest violations, lowest highest-priority victim, lowest priority sum, fewest victims;
* :func:`budget_violations`: which victims a set of PodDisruptionBudgets would count as
  violations, the way kube-scheduler's ``filterPodsWithPDBViolation`` counts them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubegpu.core.names import model_key
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.model import MILLI_PER_GPU, NodeState, PodRequest
from kubegpu.sharing.accounting import NodeInfo, PodUsage, card_usage, node_state

# Candidates on one card searched exhaustively by subset size; beyond it, largest holders
# first (a card holds at most its share slots, 32 by default, and rarely more than a dozen).
EXHAUSTIVE_CANDIDATES = 12
# Subsets of one size examined per card before settling for the best found.
MAX_SUBSETS = 4096


@dataclass(frozen=True)
class Candidate:
    """A pod that may be evicted for the waiting one: strictly lower priority, bound.
    ``started`` orders equal priorities (seconds; a newer pod is less important, as in
    kube-scheduler's ``MoreImportantPod``)."""

    usage: PodUsage
    priority: int
    started: float = 0.0
    violates_budget: bool = False

    @property
    def uid(self) -> str:
        return self.usage.uid


@dataclass(frozen=True)
class NodeVictims:
    """Pods to evict on ``node``, most important first (kube-scheduler's order, which its
    node choice reads), and the cards the waiting pod then gets."""

    node: str
    victims: tuple[Candidate, ...]
    budget_violations: int
    cards: tuple[int, ...]

    @property
    def uids(self) -> tuple[str, ...]:
        return tuple(v.uid for v in self.victims)


def importance(candidate: Candidate) -> tuple[int, float]:
    """Sort key, least important first: lower priority, then the newer pod."""
    return (candidate.priority, -candidate.started)


def victims_on_node(
    info: NodeInfo,
    usages: Sequence[PodUsage],
    candidates: Sequence[Candidate],
    pod: PodRequest,
) -> NodeVictims | None:
    """The cheapest eviction on this node that lets ``pod`` fit, or ``None`` when no set of
    ``candidates`` does. Already fitting: an empty set."""
    base = node_state(info, usages)
    if _fits(base, pod) is not None:
        return NodeVictims(info.name, (), 0, ())
    if info.inventory is None or not pod.gpu_count:
        return None  # nothing card-level to free; kube-scheduler's own preemption covers it
    by_uid = {c.uid: c for c in candidates}
    holders = _holders(usages)
    best: tuple[tuple[int, int, int, int], NodeVictims] | None = None
    for option in _card_options(info, usages, holders, by_uid, pod):
        chosen = _complete(info, usages, option, candidates, pod)
        if chosen is None:
            continue
        cost = _cost(chosen.victims)
        if best is None or cost < best[0]:
            best = (cost, chosen)
    return best[1] if best is not None else None


def pick_node(options: Iterable[NodeVictims]) -> NodeVictims | None:
    """kube-scheduler's choice among nodes where preemption would help: fewest budget
    violations, then the lowest highest-priority victim, the lowest sum of priorities, the
    fewest victims, then the node name."""
    ranked = sorted(
        (o for o in options if o.victims),
        key=lambda o: (
            o.budget_violations,
            max(v.priority for v in o.victims),
            sum(v.priority for v in o.victims),
            len(o.victims),
            o.node,
        ),
    )
    return ranked[0] if ranked else None


def budget_violations(
    victims: Sequence[Mapping[str, Any]], budgets: Sequence[Mapping[str, Any]]
) -> set[str]:
    """UIDs of ``victims`` (pod JSON, most important first) whose eviction would take a
    PodDisruptionBudget below zero allowed disruptions: each budget of the pod's namespace
    whose selector matches it loses one, unless the budget already lists the pod as
    disrupted. Budgets with an empty or missing selector match nothing (as in kube-scheduler)."""
    allowed: dict[int, int] = {}
    for i, budget in enumerate(budgets):
        status = budget.get("status") or {}
        allowed[i] = int(status.get("disruptionsAllowed") or 0)
    violating: set[str] = set()
    for pod in victims:
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        labels = meta.get("labels") or {}
        name = str(meta.get("name") or "")
        for i, budget in enumerate(budgets):
            bmeta = budget.get("metadata") or {}
            if str(bmeta.get("namespace") or "default") != namespace:
                continue
            selector = (budget.get("spec") or {}).get("selector")
            if not selector or not selector_matches(selector, labels):
                continue
            disrupted = (budget.get("status") or {}).get("disruptedPods") or {}
            if name in disrupted:
                continue
            allowed[i] -= 1
            if allowed[i] < 0:
                violating.add(str(meta.get("uid") or ""))
    return violating


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector against ``labels``; an empty selector matches nothing here (the
    caller's rule for budgets)."""
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expression in expressions:
        key = str(expression.get("key") or "")
        operator = str(expression.get("operator") or "")
        values = set(expression.get("values") or [])
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # unknown operator: the API server refuses it; never match
    return True


# ----------------------------------------------------------------- internals
def _fits(state: NodeState, pod: PodRequest) -> tuple[int, ...] | None:
    engine = PlacementEngine([state], "bestfit")
    if not engine.explain(state.name, pod).fits:
        return None
    return engine.pick_gpus(state.name, pod)


def _holders(usages: Sequence[PodUsage]) -> dict[int, list[PodUsage]]:
    """Card index -> the pods holding part of it."""
    out: dict[int, list[PodUsage]] = {}
    for usage in usages:
        for index in sorted({card.index for card in usage.cards}):
            out.setdefault(index, []).append(usage)
    return out


def _card_options(
    info: NodeInfo,
    usages: Sequence[PodUsage],
    holders: Mapping[int, list[PodUsage]],
    by_uid: Mapping[str, Candidate],
    pod: PodRequest,
) -> Iterable[frozenset[str]]:
    """Sets of candidate UIDs that free a card (a share) or enough cards (whole GPUs)."""
    assert info.inventory is not None
    held = card_usage(info.inventory, usages)
    cards = [g for g in info.inventory.gpus if g.healthy and pod.allows_model(model_key(g.model))]
    if pod.gpu_milli < MILLI_PER_GPU:
        for gpu in cards:
            milli, memory = held.get(gpu.uuid, (0, 0))
            yield from _share_sets(
                holders.get(gpu.index, []),
                by_uid,
                gpu.index,
                need_milli=pod.gpu_milli - (MILLI_PER_GPU - milli),
                need_mib=(pod.gpu_memory_mib or 0) - (gpu.memory_mib - memory),
            )
        return
    # Whole cards: a card is usable when every pod on it may be evicted; cheapest cards first.
    usable: list[tuple[tuple[int, int], frozenset[str]]] = []
    for gpu in cards:
        on_card = holders.get(gpu.index, [])
        if any(u.uid not in by_uid for u in on_card):
            continue
        uids = frozenset(u.uid for u in on_card)
        top = max((by_uid[u].priority for u in uids), default=-(2**31))
        usable.append(((len(uids), top), uids))
    if len(usable) < pod.gpu_count:
        return
    usable.sort(key=lambda item: item[0])
    chosen: frozenset[str] = frozenset()
    for _, uids in usable[: pod.gpu_count]:
        chosen |= uids
    yield chosen


def _share_sets(
    on_card: Sequence[PodUsage],
    by_uid: Mapping[str, Candidate],
    index: int,
    *,
    need_milli: int,
    need_mib: int,
) -> Iterable[frozenset[str]]:
    """The smallest sets of candidates on card ``index`` freeing ``need_milli`` compute and
    ``need_mib`` memory there (all sets of that size, up to :data:`MAX_SUBSETS`)."""
    if need_milli <= 0 and need_mib <= 0:
        yield frozenset()  # the card has room: something else (CPU, memory) is short
        return
    freed: dict[str, tuple[int, int]] = {}
    for usage in on_card:
        if usage.uid in by_uid:
            freed[usage.uid] = (
                sum(c.compute_milli for c in usage.cards if c.index == index),
                sum(c.gpu_memory_mib for c in usage.cards if c.index == index),
            )
    if (
        sum(m for m, _ in freed.values()) < need_milli
        or sum(b for _, b in freed.values()) < need_mib
    ):
        return  # even every candidate on it would not free enough
    uids = sorted(freed, key=lambda u: importance(by_uid[u]))
    if len(uids) > EXHAUSTIVE_CANDIDATES:
        # Largest holders first, then drop what turns out not to be needed (_complete).
        uids.sort(key=lambda u: freed[u], reverse=True)
        taken: list[str] = []
        milli = mib = 0
        for u in uids:
            taken.append(u)
            milli += freed[u][0]
            mib += freed[u][1]
            if milli >= need_milli and mib >= need_mib:
                yield frozenset(taken)
                return
        return
    for size in range(1, len(uids) + 1):
        found = False
        for subset in itertools.islice(itertools.combinations(uids, size), MAX_SUBSETS):
            if (
                sum(freed[u][0] for u in subset) >= need_milli
                and sum(freed[u][1] for u in subset) >= need_mib
            ):
                found = True
                yield frozenset(subset)
        if found:
            return


def _complete(
    info: NodeInfo,
    usages: Sequence[PodUsage],
    option: frozenset[str],
    candidates: Sequence[Candidate],
    pod: PodRequest,
) -> NodeVictims | None:
    """``option`` made sufficient for the whole node (CPU and memory too, adding the least
    important candidates) and then minimal (each victim, most important first, kept back when
    the pod still fits without evicting it), or ``None``."""
    chosen = set(option)
    rest = sorted((c for c in candidates if c.uid not in chosen), key=importance)
    while _fits(_without(info, usages, chosen), pod) is None:
        if not rest:
            return None
        chosen.add(rest.pop(0).uid)
    by_uid = {c.uid: c for c in candidates}
    for victim in sorted((by_uid[u] for u in chosen), key=importance, reverse=True):
        trial = chosen - {victim.uid}
        if _fits(_without(info, usages, trial), pod) is not None:
            chosen = trial
    cards = _fits(_without(info, usages, chosen), pod)
    assert cards is not None
    victims = tuple(sorted((by_uid[u] for u in chosen), key=importance, reverse=True))
    return NodeVictims(
        info.name, victims, sum(1 for v in victims if v.violates_budget), tuple(cards)
    )


def _without(info: NodeInfo, usages: Sequence[PodUsage], uids: set[str]) -> NodeState:
    return node_state(info, [u for u in usages if u.uid not in uids])


def _cost(victims: Sequence[Candidate]) -> tuple[int, int, int, int]:
    return (
        sum(1 for v in victims if v.violates_budget),
        len(victims),
        max((v.priority for v in victims), default=-(2**31)),
        sum(v.priority for v in victims),
    )
