"""An upper bound on the GPU any placement of a set of pods can allocate on a cluster.

The question: given the cluster (empty) and the pods that have arrived, known all at once,
how much GPU (milli) can the best placement allocate under the simulator's constraints: a
node's CPU and memory, whole free cards for a whole-card pod (all on one node), one card per
share with at most 1000 milli on a card, and the pod's allowed GPU models? Pods may be left
out. That is a hard packing problem; this module solves a *relaxation* of it, a linear
program, with HiGHS (``highspy``), and returns a bound on that program's optimum certified by
weak duality from the solver's duals (:meth:`Program.certify`); the optimum is at least the
best placement's (docs/bound.md has the argument):

* nodes alike in (CPU, memory, cards, model) form a *node type*; pods alike in (CPU, memory,
  GPU count, milli per card, allowed models) form a *pod class*; ``x[c, t]`` pods of class
  ``c`` go to type ``t`` (only where one such pod fits one such node alone);
* CPU and memory are summed over a type (not per node);
* multi-card pods: ``z[t, q]`` nodes of type ``t`` hold the multiset ``q`` of multi-card pod
  sizes (``q`` fits the node's cards); the cards they leave go to shares and one-card pods;
* each card a share or one-card pod uses is a path in an *arc-flow* graph over 0…1000 milli
  (an arc of length ``s`` per piece of size ``s``, pieces in non-increasing order, and a loss
  arc to the end), so the pieces on one card never exceed 1000 (Valério de Carvalho's model,
  as strong as the Gilmore–Gomory pattern LP);
* maximise the GPU milli of the placed pods (CPU-only pods allocate none and are left out,
  unless ``seated``: then at least that many of them are placed too).

GPU memory per share (``gpu_memory_mib``) is not modelled: leaving a constraint out only
raises the bound. Nodes must be empty (every card fully free) and of one model each, as
``kubegpu simulate`` loads them.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce
from types import ModuleType

import numpy as np
import numpy.typing as npt

from kubegpu.placement.model import MILLI_PER_GPU, NodeState, PodRequest

FloatArray = npt.NDArray[np.float64]

# Past this many multi-card patterns on one node type, the type's multi-card pods are only
# counted in cards (a weaker but still valid relaxation); openb has at most a few dozen.
MAX_NODE_PATTERNS = 20_000
# The solver's time limit (openb's programs solve in under a second); a program not solved
# within it is an error, not a bound.
DEFAULT_TIME_LIMIT_S = 60.0


class SolverMissing(RuntimeError):
    """HiGHS (``highspy``) is not installed."""


def solver() -> ModuleType:
    """The ``highspy`` module, or :class:`SolverMissing` saying how to install it."""
    try:
        import highspy
    except ImportError:
        raise SolverMissing(
            "the bound needs the HiGHS solver: pip install 'kubegpu[bound]' (or highspy)"
        ) from None
    return highspy


@dataclass(frozen=True)
class NodeType:
    cpu_milli: int
    memory_mib: int
    cards: int
    model: str


@dataclass(frozen=True)
class PodClass:
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_milli: int
    models: frozenset[str]

    @property
    def gpu_total(self) -> int:
        return self.gpu_count * self.gpu_milli

    @property
    def is_piece(self) -> bool:
        """One card's worth or less: a share or a one-card pod, packed into cards."""
        return self.gpu_count == 1

    def fits(self, node: NodeType) -> bool:
        """Whether one pod of this class fits one empty node of ``node``'s type."""
        return (
            self.cpu_milli <= node.cpu_milli
            and self.memory_mib <= node.memory_mib
            and self.gpu_count <= node.cards
            and (not self.models or node.model in self.models)
        )


@dataclass(frozen=True)
class Bound:
    """The relaxation's proven upper bound on the allocatable GPU (milli), and how it was got."""

    milli: int
    variables: int
    rows: int
    solve_s: float


def node_types(nodes: Sequence[NodeState]) -> Counter[NodeType]:
    types: Counter[NodeType] = Counter()
    for node in nodes:
        models = set(node.card_models)
        if len(models) > 1:
            raise ValueError(f"node {node.name}: cards of several models are not supported")
        if any(g.free_milli != MILLI_PER_GPU for g in node.gpus):
            raise ValueError(f"node {node.name}: the bound needs an empty cluster")
        model = models.pop() if models else node.gpu_model
        types[NodeType(node.cpu_free_milli, node.memory_free_mib, len(node.gpus), model)] += 1
    return types


def pod_class(pod: PodRequest) -> PodClass:
    return PodClass(pod.cpu_milli, pod.memory_mib, pod.gpu_count, pod.gpu_milli, pod.gpu_models)


def pod_classes(pods: Sequence[PodRequest]) -> Counter[PodClass]:
    """GPU pods by class (CPU-only pods allocate no GPU: the best placement may leave them out)."""
    classes: Counter[PodClass] = Counter()
    for pod in pods:
        if pod.gpu_count:
            classes[pod_class(pod)] += 1
    return classes


def multi_patterns(cards: int, sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """Every multiset of ``sizes`` (each ≥ 2) summing to at most ``cards``, the empty one first."""
    out: list[tuple[int, ...]] = []
    ordered = sorted(set(sizes), reverse=True)

    def extend(prefix: tuple[int, ...], left: int, start: int) -> None:
        out.append(prefix)
        if len(out) > MAX_NODE_PATTERNS:
            raise OverflowError
        for i in range(start, len(ordered)):
            if ordered[i] <= left:
                extend((*prefix, ordered[i]), left - ordered[i], i)

    extend((), cards, 0)
    return out


def arc_flow(sizes: Sequence[int]) -> tuple[int, list[tuple[int, int, int]]]:
    """The arc-flow graph of one card for pieces of ``sizes`` milli: (unit, arcs).

    Positions are multiples of ``unit`` (the gcd of the sizes and 1000); an arc
    ``(u, v, size)`` places a piece of ``size`` from ``u`` to ``v``, pieces in non-increasing
    order (every multiset of pieces has one such order, so no pattern is lost); a loss arc
    ``(u, end, 0)`` closes a card at ``u``. Only positions some ordered path reaches are kept.
    """
    unit = reduce(math.gcd, sizes, MILLI_PER_GPU)
    end = MILLI_PER_GPU // unit
    reached = {0}
    arcs: list[tuple[int, int, int]] = []
    for size in sorted(set(sizes), reverse=True):
        step = size // unit
        frontier = sorted(reached)
        for u in frontier:  # closure under +step, in increasing order
            v = u + step
            while v <= end and v not in reached:
                reached.add(v)
                v += step
        for u in sorted(reached):
            if u + step <= end:
                arcs.append((u, u + step, size))
    arcs += [(u, end, 0) for u in sorted(reached) if 0 < u < end]
    return unit, arcs


class Program:
    """A sparse linear program built row by row (maximise ``cost · x``, ``0 ≤ x ≤ upper``,
    ``lower ≤ A x ≤ upper`` per row), solved by HiGHS."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.upper: list[float] = []
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []
        self.entries: list[tuple[int, int, float]] = []

    def var(self, cost: float, upper: float) -> int:
        self.cost.append(cost)
        self.upper.append(upper)
        return len(self.cost) - 1

    def row(self, terms: Sequence[tuple[int, float]], lower: float, upper: float) -> None:
        r = len(self.row_upper)
        self.row_lower.append(lower)
        self.row_upper.append(upper)
        self.entries.extend((r, col, value) for col, value in terms if value)

    def solve(self, time_limit_s: float) -> tuple[int, list[float]]:
        """The certified bound (milli, rounded down) and the primal values."""
        highspy = solver()
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(time_limit_s))
        h.setOptionValue("threads", 1)
        n, m = len(self.cost), len(self.row_upper)
        inf = highspy.kHighsInf
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = n, m
        lp.col_cost_ = np.array(self.cost, dtype=np.float64)
        lp.col_lower_ = np.zeros(n)
        lp.col_upper_ = np.array(self.upper, dtype=np.float64)
        lp.row_lower_ = np.array([max(b, -inf) for b in self.row_lower], dtype=np.float64)
        lp.row_upper_ = np.array([min(b, inf) for b in self.row_upper], dtype=np.float64)
        rows, cols, values = self._triples()
        order = np.lexsort((rows, cols))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.searchsorted(cols[order], np.arange(n + 1)).astype(np.int32)
        lp.a_matrix_.index_ = rows[order].astype(np.int32)
        lp.a_matrix_.value_ = values[order]
        lp.sense_ = highspy.ObjSense.kMaximize
        h.passModel(lp)
        h.run()
        solution = h.getSolution()
        if not solution.dual_valid:
            status = h.modelStatusToString(h.getModelStatus())
            raise RuntimeError(f"the linear relaxation was not solved: {status}")
        duals = np.array(solution.row_dual, dtype=np.float64)
        bound = min(self.certify(duals), self.certify(-duals))
        return bound, list(solution.col_value)

    def _triples(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], FloatArray]:
        rows = np.array([e[0] for e in self.entries], dtype=np.int64)
        cols = np.array([e[1] for e in self.entries], dtype=np.int64)
        values = np.array([e[2] for e in self.entries], dtype=np.float64)
        return rows, cols, values

    def certify(self, y: FloatArray) -> int:
        """An upper bound on the program's optimum from any row multipliers ``y``, by weak
        duality: ``c·x = y·Ax + (c − Aᵀy)·x ≤ Σ_r y_r·(U_r if y_r > 0 else L_r) +
        Σ_j u_j·max(0, c_j − (Aᵀy)_j)`` for every feasible ``x`` (a multiplier whose row
        side is infinite counts as 0). The solver's duals make it tight; nothing about them
        has to be trusted for it to be a bound."""
        lower = np.array(self.row_lower, dtype=np.float64)
        upper = np.array(self.row_upper, dtype=np.float64)
        y = np.where((y > 0) & np.isinf(upper), 0.0, y)
        y = np.where((y < 0) & np.isinf(lower), 0.0, y)
        rhs = np.where(y > 0, upper, np.where(y < 0, lower, 0.0))
        rows, cols, values = self._triples()
        reduced = np.array(self.cost, dtype=np.float64)
        np.subtract.at(reduced, cols, values * y[rows])
        value = float(np.sum(y * rhs)) + float(
            np.sum(np.array(self.upper) * np.maximum(reduced, 0))
        )
        # Every coefficient is an integer: the integer optimum is at most the floor, here with
        # room for floating-point rounding in the sums (1e-9 relative).
        return math.floor(value + 1e-9 * max(1.0, abs(value)))


@dataclass
class TypeColumns:
    """One node type's columns: its multi-card node patterns and its card's arc flow."""

    node_type: NodeType
    count: int
    patterns: list[tuple[tuple[int, ...], int]] = field(default_factory=list)
    arcs: list[tuple[tuple[int, int, int], int]] = field(default_factory=list)


@dataclass(frozen=True)
class Solution:
    """The certified bound and the linear relaxation's values (which the offline packing
    rounds into a placement)."""

    bound_milli: int
    values: list[float]
    variables: int
    rows: int


class Relaxation:
    """The relaxation of placing ``classes`` on ``nodes`` as a linear program; ``seated``:
    CPU-only pod classes of which at least so many must be placed too (none by default: they
    allocate no GPU, so the best placement may leave them out)."""

    def __init__(
        self,
        nodes: Counter[NodeType],
        classes: Counter[PodClass],
        seated: Counter[PodClass] | None = None,
        share: float = 1.0,
    ) -> None:
        self.share = share  # of each node's CPU and memory offered (below 1: not a bound)
        self.program = program = Program()
        self.x: dict[tuple[PodClass, NodeType], int] = {}
        self.types: dict[NodeType, TypeColumns] = {}
        ordered = sorted(nodes, key=_type_key)
        seated = seated if seated is not None else Counter()
        wanted = classes + seated
        for c in sorted(wanted, key=_class_key):
            for t in ordered:
                if c.fits(t):
                    self.x[(c, t)] = program.var(float(c.gpu_total), float(wanted[c]))
        by_class: dict[PodClass, list[int]] = defaultdict(list)
        by_type: dict[NodeType, list[tuple[PodClass, int]]] = defaultdict(list)
        for (c, t), col in self.x.items():
            by_class[c].append(col)
            by_type[t].append((c, col))
        for c in wanted:  # each pod at most once; seated ones at least once
            low = float(seated[c]) or -math.inf
            program.row([(col, 1.0) for col in by_class[c]], low, float(wanted[c]))
        for t in ordered:
            here = by_type.get(t)
            if not here:
                continue
            count = nodes[t]
            cpu = [(col, float(c.cpu_milli)) for c, col in here]
            program.row(cpu, -math.inf, self.share * count * t.cpu_milli)
            memory = [(col, float(c.memory_mib)) for c, col in here]
            program.row(memory, -math.inf, self.share * count * t.memory_mib)
            self.types[t] = self._cards(t, count, here)

    def _cards(self, t: NodeType, count: int, here: list[tuple[PodClass, int]]) -> TypeColumns:
        """Type ``t``'s card rows: multi-card node patterns, then one card's arc flow."""
        program = self.program
        columns = TypeColumns(t, count)
        all_cards = float(count * t.cards)
        multi = sorted({c.gpu_count for c, _ in here if c.gpu_count > 1})
        pieces = sorted({c.gpu_milli for c, _ in here if c.is_piece})
        # The cards left to pieces, as terms of "cards used by pieces - these ≤ 0".
        left: list[tuple[int, float]] = []
        if multi:
            try:
                patterns = multi_patterns(t.cards, multi)
            except OverflowError:  # too many: count multi-card pods in cards only
                patterns = []
            if patterns:
                columns.patterns = [(q, program.var(0.0, float(count))) for q in patterns]
                program.row([(z, 1.0) for _, z in columns.patterns], -math.inf, float(count))
                for k in multi:
                    terms = [(z, -float(q.count(k))) for q, z in columns.patterns]
                    terms += [(col, 1.0) for c, col in here if c.gpu_count == k]
                    program.row(terms, -math.inf, 0.0)
                left = [(z, -float(t.cards - sum(q))) for q, z in columns.patterns]
                # Pieces only go to nodes whose pattern leaves them a card: their CPU and
                # memory is at most those nodes' (the type's sum alone would lend them the
                # CPU of nodes that multi-card pods fill).
                open_nodes = [z for q, z in columns.patterns if sum(q) < t.cards]
                for needs, capacity in ((_cpu, t.cpu_milli), (_memory, t.memory_mib)):
                    terms = [(col, float(needs(c))) for c, col in here if c.is_piece]
                    terms += [(z, -self.share * capacity) for z in open_nodes]
                    program.row(terms, -math.inf, 0.0)
            else:
                spare = program.var(0.0, all_cards)
                terms = [(col, float(c.gpu_count)) for c, col in here if c.gpu_count > 1]
                program.row([*terms, (spare, 1.0)], -math.inf, all_cards)
                left = [(spare, -1.0)]
        if not pieces:
            return columns
        _, arcs = arc_flow(pieces)
        columns.arcs = [(arc, program.var(0.0, all_cards)) for arc in arcs]
        out_of_zero = [(f, 1.0) for (u, _, _), f in columns.arcs if u == 0]
        program.row(out_of_zero + left, -math.inf, 0.0 if left else all_cards)
        balance: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for (u, v, _), f in columns.arcs:
            if u:
                balance[u].append((f, -1.0))
            balance[v].append((f, 1.0))
        end = max(v for (_, v, _), _ in columns.arcs)
        for position, terms in sorted(balance.items()):
            if position != end:  # what flows into a position flows on
                program.row(terms, 0.0, 0.0)
        for size in pieces:  # pods of a size ≤ the arcs of that size
            terms = [(f, -1.0) for (_, _, s), f in columns.arcs if s == size]
            terms += [(col, 1.0) for c, col in here if c.is_piece and c.gpu_milli == size]
            program.row(terms, -math.inf, 0.0)
        return columns

    def solve(self, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> Solution:
        program = self.program
        if not program.cost:
            return Solution(0, [], 0, 0)
        bound, values = program.solve(time_limit_s)
        return Solution(bound, values, len(program.cost), len(program.row_upper))


def _cpu(c: PodClass) -> int:
    return c.cpu_milli


def _memory(c: PodClass) -> int:
    return c.memory_mib


def _type_key(t: NodeType) -> tuple[int, int, int, str]:
    return (t.cards, t.cpu_milli, t.memory_mib, t.model)


def _class_key(c: PodClass) -> tuple[int, int, int, int, tuple[str, ...]]:
    return (c.gpu_count, c.gpu_milli, c.cpu_milli, c.memory_mib, tuple(sorted(c.models)))


def relax(
    nodes: Sequence[NodeState], pods: Sequence[PodRequest], seated: Sequence[PodRequest] = ()
) -> Relaxation:
    """The relaxation of placing ``pods`` on the empty ``nodes`` (and every CPU-only pod of
    ``seated``)."""
    cpu_only = Counter(pod_class(p) for p in seated if not p.gpu_count)
    return Relaxation(node_types(nodes), pod_classes(pods), cpu_only)


def upper_bound(
    nodes: Sequence[NodeState],
    pods: Sequence[PodRequest],
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> Bound:
    """The most GPU milli any placement of ``pods`` on the empty ``nodes`` can allocate, or
    more (never less)."""
    started = time.perf_counter()
    solution = relax(nodes, pods).solve(time_limit_s)
    elapsed = time.perf_counter() - started
    return Bound(solution.bound_milli, solution.variables, solution.rows, elapsed)
