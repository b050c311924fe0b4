"""An offline reference packing: a placement of arrived pods found with hindsight.

The upper bound (:mod:`kubegpu.simulate.bound`) says how much GPU no placement can beat;
this finds one that is feasible, so the best possible lies between the two. It rounds the
bound's linear relaxation into a placement, then repairs greedily:

1. **Which pods, on which node type**: the relaxation's ``x[c, t]``, rounded per class by
   largest remainder; the earliest arrived pods of a class are taken first.
2. **Multi-card pods**: each node of a type gets one of the relaxation's node patterns
   (rounded), filled with that type's multi-card pods.
3. **Cards**: the type's arc flow is split into card patterns (paths), rounded; each card is
   filled with that type's pods of the pattern's sizes.
4. **Cards onto nodes**: cards in decreasing CPU, each to the node of its type left with the
   most CPU beyond what its other free cards will want (CPU and memory are per node here,
   unlike in the relaxation); a card no node takes swaps with one a third node can take.
5. **Repair**: every GPU pod still unplaced, largest first, goes where it fits best (the
   fullest card that holds a share, the node with the fewest whole free cards that holds a
   whole-card pod; ties to the node with the most free CPU); then CPU-only pods, in arrival
   order, to the node with the most free CPU.

The relaxation spends a node type's CPU to the last milli, which one node at a time seldom
can; so the same is done for relaxations offering 90, 80 and 70 % of each node's CPU and
memory (:data:`SHARES`, not bounds), and the packing that holds the most GPU is kept.

:func:`verify` replays the result in arrival order through the simulator's own state and
checks (:mod:`kubegpu.placement.explain`, :mod:`kubegpu.placement.feasibility`), so a packing
it accepts is one the simulator itself would have allowed.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kubegpu.placement.explain import FITS, FITS_WITHOUT_GPU, explain_row
from kubegpu.placement.feasibility import eligible_cards, feasible_rows
from kubegpu.placement.model import MILLI_PER_GPU, NodeState, PodRequest
from kubegpu.placement.state import ClusterState
from kubegpu.simulate.bound import (
    NodeType,
    PodClass,
    Relaxation,
    Solution,
    TypeColumns,
    node_types,
    pod_class,
    pod_classes,
)

# A pod's place: (node row in the packing's ClusterState, card columns), or None.
Slot = tuple[int, tuple[int, ...]] | None
EPS = 1e-6
# The shares of each node's CPU and memory the extra relaxations offer (see offline_packing).
SHARES = (0.9, 0.8, 0.7)


class InfeasiblePacking(ValueError):
    """A packing the simulator's checks refuse."""


@dataclass(frozen=True)
class Packing:
    """Where each pod (by arrival index) went, on nodes by name."""

    nodes: tuple[str, ...]  # row -> node name
    slots: tuple[Slot, ...]

    def allocated_milli(self, pods: Sequence[PodRequest]) -> int:
        return sum(p.total_gpu_milli for p, s in zip(pods, self.slots, strict=True) if s)

    def placed(self) -> int:
        return sum(1 for s in self.slots if s is not None)


def _node_type(state: ClusterState, row: int) -> NodeType:
    count = int(state.gpu_count[row])
    return NodeType(int(state.cpu_free[row]), int(state.memory_free[row]), count, state.models[row])


def verify(nodes: Sequence[NodeState], pods: Sequence[PodRequest], packing: Packing) -> int:
    """The GPU milli ``packing`` allocates; raises :class:`InfeasiblePacking` unless every
    placed pod, bound in arrival order on an empty cluster, passes the simulator's checks on
    its node and cards (CPU, memory, model, whole free cards, a share's card)."""
    state = ClusterState(nodes)
    rows = {name: state.row_of(name) for name in packing.nodes}
    used = 0
    for pod, slot in zip(pods, packing.slots, strict=True):
        if slot is None:
            continue
        row = rows[packing.nodes[slot[0]]]
        cols = slot[1]
        check, reason = explain_row(state, row, pod)
        if check not in (FITS, FITS_WITHOUT_GPU):
            raise InfeasiblePacking(f"pod {pod.name}: {reason}")
        if len(set(cols)) != pod.gpu_count:
            raise InfeasiblePacking(
                f"pod {pod.name}: {len(set(cols))} cards, wants {pod.gpu_count}"
            )
        if cols and not eligible_cards(state, np.array([row]), pod)[0, list(cols)].all():
            raise InfeasiblePacking(f"pod {pod.name}: card {cols} of {state.names[row]} refuses it")
        state.allocate_row(row, pod, cols)
        used += pod.total_gpu_milli
    return used


class _Builder:
    """The packing under construction: the cluster state and each pod's slot."""

    def __init__(self, nodes: Sequence[NodeState], pods: Sequence[PodRequest]) -> None:
        self.state = ClusterState(nodes)
        self.pods = pods
        self.slots: list[Slot] = [None] * len(pods)

    def bind(self, index: int, row: int, cols: tuple[int, ...]) -> None:
        self.state.allocate_row(row, self.pods[index], cols)
        self.slots[index] = (row, cols)

    def fits(self, index: int, row: int) -> bool:
        return explain_row(self.state, row, self.pods[index])[0] in (FITS, FITS_WITHOUT_GPU)

    def packing(self) -> Packing:
        return Packing(tuple(self.state.names), tuple(self.slots))


def offline_packing(
    nodes: Sequence[NodeState],
    pods: Sequence[PodRequest],
    relaxation: Relaxation | None = None,
    solution: Solution | None = None,
    shares: Sequence[float] = SHARES,
) -> Packing:
    """A feasible placement of ``pods`` (any subset, any order) on the empty ``nodes``: the
    relaxation rounded, then greedy repair (module docstring); the best of that and the same
    for relaxations offering only ``shares`` of each node's CPU and memory, whose per-node
    assignment has room to spare. Without a relaxation, only the repair runs: best fit
    decreasing."""
    if relaxation is None or solution is None or not solution.values:
        builder = _Builder(nodes, pods)
        _repair(builder)
        return builder.packing()
    candidates = [(relaxation, solution)]
    for share in shares:
        tighter = Relaxation(node_types(nodes), pod_classes(pods), share=share)
        candidates.append((tighter, tighter.solve()))
    packings = [_rounded(nodes, pods, r, s) for r, s in candidates]
    return max(packings, key=lambda p: p.allocated_milli(pods))


def _rounded(
    nodes: Sequence[NodeState],
    pods: Sequence[PodRequest],
    relaxation: Relaxation,
    solution: Solution,
) -> Packing:
    builder = _Builder(nodes, pods)
    pools: dict[PodClass, deque[int]] = defaultdict(deque)
    for i, pod in enumerate(pods):
        if pod.gpu_count:
            pools[pod_class(pod)].append(i)
    rows_by_type: dict[NodeType, list[int]] = defaultdict(list)
    for row in range(len(builder.state.names)):
        rows_by_type[_node_type(builder.state, row)].append(row)
    take = _round_classes(relaxation, solution.values)
    for t, columns in relaxation.types.items():
        mine = {c: [pools[c].popleft() for _ in range(n)] for (c, tt), n in take.items() if tt == t}
        _pack_type(builder, columns, rows_by_type[t], mine, solution.values)
    _repair(builder)
    return builder.packing()


def _round_classes(
    relaxation: Relaxation, values: Sequence[float]
) -> dict[tuple[PodClass, NodeType], int]:
    """Pods of each class per node type: the relaxation's counts rounded by largest remainder
    (their sum per class rounded to the nearest, never above the class's pods)."""
    by_class: dict[PodClass, list[tuple[NodeType, float]]] = defaultdict(list)
    for (c, t), col in relaxation.x.items():
        if c.gpu_count:  # CPU-only pods it seats are the repair's
            by_class[c].append((t, max(0.0, values[col])))
    take: dict[tuple[PodClass, NodeType], int] = {}
    for c, shares in by_class.items():
        counts = {t: math.floor(v + EPS) for t, v in shares}
        extra = round(sum(v for _, v in shares)) - sum(counts.values())
        for t, _ in sorted(shares, key=lambda tv: -(tv[1] - math.floor(tv[1] + EPS)))[
            : max(0, extra)
        ]:
            counts[t] += 1
        take.update({(c, t): n for t, n in counts.items() if n})
    return take


def _pack_type(
    builder: _Builder,
    columns: TypeColumns,
    rows: list[int],
    mine: dict[PodClass, list[int]],
    values: Sequence[float],
) -> None:
    """Steps 2–4 of the module docstring for one node type."""
    pods = builder.pods
    multi: dict[int, deque[int]] = defaultdict(deque)
    pieces: dict[int, list[int]] = defaultdict(list)
    for c, indices in mine.items():
        if c.is_piece:
            pieces[c.gpu_milli].extend(indices)
        else:
            multi[c.gpu_count].extend(indices)
    t = columns.node_type
    cpu = {r: t.cpu_milli for r in rows}
    memory = {r: t.memory_mib for r in rows}
    cards = {r: t.cards for r in rows}
    plans = _round_amounts([(q, values[z]) for q, z in columns.patterns], len(rows))
    queue = iter(rows)
    for pattern, count in sorted(plans, key=lambda qc: -sum(qc[0])):
        for _ in range(count):
            row = next(queue)
            for k in pattern:
                if multi[k] and builder.fits(multi[k][0], row):
                    index = multi[k].popleft()
                    cols = tuple(
                        int(c)
                        for c in np.flatnonzero(builder.state.card_free[row] == MILLI_PER_GPU)[:k]
                    )
                    builder.bind(index, row, cols)
                    cpu[row] -= pods[index].cpu_milli
                    memory[row] -= pods[index].memory_mib
                    cards[row] -= k
    card_total = sum(cards.values())
    patterns = _round_amounts(_paths(columns, values), card_total)
    for size in pieces:  # the CPU-heaviest first: they lead the heaviest cards
        pieces[size].sort(key=lambda i: -pods[i].cpu_milli)
    filled: list[list[int]] = []
    for pattern, count in patterns:
        for _ in range(count):
            card = [pieces[s].pop(0) for s in pattern if pieces[s]]
            if card:
                filled.append(card)
    filled.sort(key=lambda card: -sum(pods[i].cpu_milli for i in card))
    needs = [
        (sum(pods[i].cpu_milli for i in card), sum(pods[i].memory_mib for i in card))
        for card in filled
    ]
    free = [[cpu[r], memory[r], cards[r]] for r in rows]
    for card, position in zip(filled, _assign_cards(needs, free), strict=True):
        if position < 0:
            continue  # its pods are left to the repair
        row = rows[position]
        col = int(np.flatnonzero(builder.state.card_free[row] == MILLI_PER_GPU)[0])
        for index in card:
            if builder.fits(index, row):
                builder.bind(index, row, (col,))


def _assign_cards(needs: list[tuple[int, int]], free: list[list[int]]) -> list[int]:
    """Cards (CPU, memory) onto nodes (free CPU, memory, cards): each card's node position,
    or -1. Greedy in the given order (the CPU-heaviest first), each card to the node left
    with the most CPU beyond what its other free cards will want at the mean load still to
    come; then each card left over takes the place of a card that moves to another node with
    the CPU for it (one swap)."""
    where = [-1] * len(needs)
    held: list[list[int]] = [[] for _ in free]
    cpu = np.array([f[0] for f in free], dtype=np.float64)
    memory = np.array([f[1] for f in free], dtype=np.float64)
    slots = np.array([f[2] for f in free], dtype=np.float64)
    left_cpu = float(sum(n for n, _ in needs))
    left_cards = len(needs)

    def put(card: int, node: int, sign: int = 1) -> None:
        cpu[node] -= sign * needs[card][0]
        memory[node] -= sign * needs[card][1]
        slots[node] -= sign
        if sign > 0:
            held[node].append(card)
            where[card] = node
        else:
            held[node].remove(card)

    for card, (need_cpu, need_memory) in enumerate(needs):
        left_cpu -= need_cpu
        left_cards -= 1
        rho = left_cpu / max(1, left_cards)
        ok = (slots > 0) & (cpu >= need_cpu) & (memory >= need_memory)
        if ok.any():
            put(card, int(np.where(ok, cpu - need_cpu - rho * (slots - 1), -np.inf).argmax()))
    for card in [c for c in range(len(needs)) if where[c] < 0]:
        need_cpu, need_memory = needs[card]
        for node in np.flatnonzero((slots > 0) & (memory >= need_memory)).tolist():
            short = need_cpu - cpu[node]
            # A card of this node heavy enough to make room, that another node can take.
            movable = sorted((needs[c][0], c) for c in held[node] if needs[c][0] >= short)
            done = False
            for moved_cpu, moved in movable:
                ok = (slots > 0) & (cpu >= moved_cpu) & (memory >= needs[moved][1])
                ok[node] = False
                if ok.any() and memory[node] + needs[moved][1] >= need_memory:
                    put(moved, node, -1)
                    put(moved, int(np.where(ok, cpu, -np.inf).argmax()))
                    put(card, node)
                    done = True
                    break
            if done:
                break
    return where


def _paths(columns: TypeColumns, values: Sequence[float]) -> list[tuple[tuple[int, ...], float]]:
    """The type's arc flow split into card patterns (the piece sizes of a path) and their
    amounts (cards)."""
    flow = {arc: max(0.0, values[col]) for arc, col in columns.arcs}
    leaving: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for arc in flow:
        leaving[arc[0]].append(arc)
    found: dict[tuple[int, ...], float] = defaultdict(float)
    while True:
        start = [a for a in leaving[0] if flow[a] > EPS]
        if not start:
            break
        path = [max(start, key=lambda a: flow[a])]
        while True:
            nxt = [a for a in leaving[path[-1][1]] if flow[a] > EPS]
            if not nxt:
                break
            path.append(max(nxt, key=lambda a: flow[a]))
        amount = min(flow[a] for a in path)
        for a in path:
            flow[a] -= amount
        found[tuple(s for _, _, s in path if s)] += amount
    return [(pattern, amount) for pattern, amount in found.items() if pattern]


def _round_amounts(
    amounts: list[tuple[tuple[int, ...], float]], limit: int
) -> list[tuple[tuple[int, ...], int]]:
    """Fractional counts to whole ones by largest remainder, their total at most ``limit``."""
    counts = [math.floor(a + EPS) for _, a in amounts]
    room = min(limit, round(sum(a for _, a in amounts))) - sum(counts)
    by_remainder = sorted(range(len(amounts)), key=lambda i: -(amounts[i][1] - counts[i]))
    for i in by_remainder[: max(0, room)]:
        counts[i] += 1
    while sum(counts) > limit:  # never more than the cards there are
        i = max(range(len(counts)), key=lambda j: counts[j])
        counts[i] -= 1
    return [(pattern, n) for (pattern, _), n in zip(amounts, counts, strict=True) if n]


def _repair(builder: _Builder) -> None:
    """Step 5: every unplaced GPU pod, largest first, where it fits best; then CPU-only pods."""
    pods = builder.pods
    left = [i for i, s in enumerate(builder.slots) if s is None]
    gpu = [i for i in left if pods[i].gpu_count]
    gpu.sort(key=lambda i: (-pods[i].total_gpu_milli, -pods[i].gpu_milli, i))
    for index in gpu:
        _place_one(builder, index)
    for index in left:
        if pods[index].gpu_count == 0:
            _place_one(builder, index)


def _place_one(builder: _Builder, index: int) -> None:
    """Pod ``index`` where it fits best, if anywhere: a share on the fullest card that holds
    it, whole cards on the node with the fewest whole free cards that holds them, a CPU-only
    pod on the node with the most free CPU; ties to the most free CPU."""
    pod, state = builder.pods[index], builder.state
    rows = feasible_rows(state, pod)
    if rows.size == 0:
        return
    if not pod.gpu_count:
        builder.bind(index, int(rows[int(state.cpu_free[rows].argmax())]), ())
        return
    eligible = eligible_cards(state, rows, pod)
    if pod.gpu_milli >= MILLI_PER_GPU:
        spare = eligible.sum(axis=1)
        best = int(np.lexsort((-state.cpu_free[rows], spare))[0])
        cols = tuple(int(c) for c in np.flatnonzero(eligible[best])[: pod.gpu_count])
    else:
        free = np.where(eligible, state.card_free[rows], MILLI_PER_GPU + 1)
        tightest = free.min(axis=1)
        best = int(np.lexsort((-state.cpu_free[rows], tightest))[0])
        cols = (int(free[best].argmin()),)
    builder.bind(index, int(rows[best]), cols)


def extend(nodes: Sequence[NodeState], pods: Sequence[PodRequest], packing: Packing) -> Packing:
    """``packing`` (of the first pods) with each later pod of ``pods`` added in arrival
    order where it fits best (:func:`_place_one`), none moved: a packing of every prefix."""
    builder = _Builder(nodes, pods)
    if builder.state.names != list(packing.nodes):
        raise ValueError("the packing is of other nodes")
    for index, slot in enumerate(packing.slots):
        if slot is not None:
            builder.bind(index, *slot)
    for index in range(len(packing.slots), len(pods)):
        _place_one(builder, index)
    return builder.packing()
