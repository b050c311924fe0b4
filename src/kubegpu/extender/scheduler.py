"""The extender's decisions: filter, prioritize and card choice over the placement engine.

:class:`GpuScheduler` keeps one :class:`~kubegpu.placement.engine.PlacementEngine` in step with
the cluster view (:class:`~kubegpu.extender.view.ClusterState`): rows of nodes whose usage
changed are rewritten before each call, and the engine is rebuilt when the node set or a node's
cards change (the engine has no add/remove-node operation). The target workload is refreshed
off the request path (:mod:`kubegpu.extender.refresh`): a background thread checks it and, when
it changed, builds the replacement engine, swapped in at the start of a later call.
Everything else here is synchronous: a decision and its reservation happen in one step of the
event loop, so two binds can never both take the last room on a card, and no lock (node-wide
or other) is needed; the swap happens in such a step too.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from kubegpu.extender.holdings import held_cards, split_whole, usage_of
from kubegpu.extender.ranking import extender_priorities, ranked
from kubegpu.extender.reasons import (
    EXPLAIN_CATEGORIES,
    STRUCTURAL_CATEGORIES,
    UNSEEN_NODE,
    NodeFacts,
    explain_codes,
    phrases_of,
    refusal_phrases,
    rows_of,
    structural,
    structural_phrases,
)
from kubegpu.extender.refresh import Refreshed, Refresher, RefreshJob, ViewCopy
from kubegpu.extender.view import ClusterState
from kubegpu.placement.engine import PlacementEngine, RowShapeChanged
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.policies import extender_policy
from kubegpu.sharing.accounting import NodeInfo, node_state
from kubegpu.sharing.annotations import (
    AllocationDecision,
    CardShare,
    ContainerAllocation,
)
from kubegpu.sharing.resources import (
    GpuRequest,
    RequestKind,
)

log = logging.getLogger(__name__)


class Unschedulable(Exception):
    """The pod does not fit the node; the message is the actionable reason."""


@dataclass
class FilterOutcome:
    passed: tuple[str, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)  # preemption might help
    unresolvable: dict[str, str] = field(default_factory=dict)  # it will not
    # Rejections per reason_category label, counted from which check failed (not the text).
    categories: Counter[str] = field(default_factory=Counter)


def reason_category(reason: str) -> str:
    """A small, fixed label for the rejections metric, from the reason's wording."""
    for needle, label in (
        ("milli-CPU", "cpu"),
        ("MiB memory free", "memory"),
        ("inventory", "no-inventory"),
        ("has no GPU", "no-gpu"),
        ("GPU model", "gpu-model"),
        ("whole GPU", "whole-gpus"),
        ("milli", "gpu-compute"),
        ("MiB", "gpu-memory"),
        ("not yet seen", "unknown-node"),
    ):
        if needle in reason:
            return label
    return "other"


# Rows a refreshed engine takes back per call before it is swapped in (~0.2 ms each).
CATCH_UP_ROWS = 16


@dataclass
class CatchUp:
    """A finished refresh's engine, taking back the rows the serving one rewrote since the
    refresh copied the view (``job.rewritten``, still growing) before it is swapped in."""

    job: RefreshJob
    refreshed: Refreshed
    engine: PlacementEngine
    rows: int = 0
    calls: int = 0
    seconds: float = 0.0


class GpuScheduler:
    """Filter / prioritize / decide for GPU pods on the current cluster view."""

    def __init__(
        self,
        view: ClusterState,
        policy: str = "kubegpu",
        *,
        workload: TypicalWorkload | None = None,
        workload_refresh_s: float = 300.0,
        clock: Callable[[], float] = time.time,
        executor: Executor | None = None,
    ) -> None:
        self.view = view
        self.policy = policy.strip().lower()
        # The registry's entry: the extender's own names ("binpack") or any registered one.
        self.engine_policy = extender_policy(self.policy)
        self.configured_workload = workload
        self.workload_refresh_s = workload_refresh_s
        self.clock = clock
        self._engine: PlacementEngine | None = None
        self._rows: dict[str, int] = {}
        self._row_names: npt.NDArray[np.object_] = np.empty(0, dtype=object)
        self._row_cache: list[tuple[tuple[str, ...], npt.NDArray[np.int64]]] = []
        self._facts: NodeFacts | None = None
        self._built_topology = -1
        # The engine's row names: kept across workload refreshes (same rows), so what is made
        # per name list (server.py's PriorityEncoder) is made again only on a rebuild.
        self._names: Sequence[str] = ()
        self._workload: TypicalWorkload | None = None  # the engine's
        # ``executor`` runs the refreshes (default: a daemon thread each).
        self._refresher = Refresher(self.engine_policy, workload_refresh_s, executor=executor)
        self._catching_up: CatchUp | None = None  # a refreshed engine taking the rows back
        self.rebuilds = 0  # on the request path: first call, node set or a node's cards
        self.refreshes = 0  # engines swapped in for a changed workload, built off the path

    # ------------------------------------------------------------------ engine upkeep
    def _needs_workload(self) -> bool:
        return self.engine_policy.needs_workload

    def current_workload(self) -> TypicalWorkload:
        """The configured distribution, else every pod in the cluster, CPU-only ones included,
        by the definition the simulator uses too (``kubegpu.placement.target``); an empty
        workload makes every node equally unfragmented. Computed now, from the claims the view
        parsed (:func:`~kubegpu.extender.refresh.pod_classes`); the engine's own object
        when equal to it, so a caller caching on the workload's identity (DRA ranking) keeps
        its cache."""
        if self.configured_workload is not None:
            return self.configured_workload
        view = self.view
        found = self._refresher.workload(view.pod_claims().values(), view.nodes.values())
        return self._workload if self._workload is not None and found == self._workload else found

    def engine(self) -> PlacementEngine:
        """The engine, brought up to date with the view."""
        view = self.view
        if self._engine is None or view.topology_version != self._built_topology:
            self._rebuild()
        elif self._swap_refreshed():
            for node in sorted(view.dirty_nodes):
                if not self._rewrite_row(node):
                    self._rebuild()
                    break
        view.dirty_nodes.clear()
        assert self._engine is not None
        now = self.clock()
        if self._refreshes_workload() and self._refresher.due(now):
            # The engine is in step with the view here; rows rewritten from now on are noted
            # (_rewrite_row) and written again into the new engine.
            self._refresher.start(self._engine, self._workload, ViewCopy.of(view), now)
        return self._engine

    def serving(self) -> contextlib.AbstractContextManager[None]:
        """Marks a verb being served (the server wraps each): a workload refresh building
        meanwhile steps aside for it (:class:`~kubegpu.extender.refresh.VerbsInFlight`)."""
        return self._refresher.verbs.serving()

    def verbs_idle(self) -> bool:
        """No verb is being served now (:meth:`serving`)."""
        return self._refresher.verbs.idle

    def _refreshes_workload(self) -> bool:
        return self._needs_workload() and self.configured_workload is None

    def _swap_refreshed(self) -> bool:
        """Swap in the engine a finished refresh built, once it holds every row the serving
        one took since the refresh copied the view. Those rows are written into it a few at a
        time (:data:`CATCH_UP_ROWS` per call), so no call pays for a whole refresh's worth:
        5-21 ms at 5,000 nodes after a 300 s refresh, written at once. False when the engine
        was rebuilt instead (a row changed shape meanwhile)."""
        if self._catching_up is None:
            done = self._refresher.finished()
            if done is None:
                return True
            job, refreshed = done
            old, new = self._engine, refreshed.engine
            if job.base is not old or new is None:
                # Rebuilt on the path meanwhile (with the workload of then), or unchanged.
                if new is not None:
                    new.retire()
                log.debug("target workload checked in %.0f ms", refreshed.seconds * 1000)
                return True
            assert old is not None
            if new.names != old.names:  # the node set is the same (no rebuild since), so never
                self._rebuild()
                return False
            self._catching_up = CatchUp(job, refreshed, new)
        catch_up = self._catching_up
        started = time.perf_counter()
        rewritten = catch_up.job.rewritten  # still noted into by _rewrite_row
        for node in sorted(rewritten)[:CATCH_UP_ROWS]:
            rewritten.discard(node)
            info = self.view.nodes.get(node)
            if info is None:
                continue  # gone: the topology changed, and the next call rebuilds
            try:
                catch_up.engine.update_node(node_state(info, self.view.usages_on(node)))
            except RowShapeChanged:
                self._rebuild()
                return False
            catch_up.rows += 1
        catch_up.calls += 1
        catch_up.seconds += time.perf_counter() - started
        if rewritten:
            return True  # more next call; the serving engine stays until then
        self._catching_up = None
        assert self._engine is not None
        self._refresher.retire(self._engine)  # taken apart off the loop
        self._engine = catch_up.engine
        self._workload = catch_up.refreshed.workload
        self.refreshes += 1
        log.info(
            "placement engine swapped for a new target workload of %d classes (built in %.0f ms "
            "off the request path; %d rows written again, in %.1f ms on it over %d calls)",
            len(catch_up.refreshed.workload.pods),
            catch_up.refreshed.seconds * 1000,
            catch_up.rows,
            catch_up.seconds * 1000,
            catch_up.calls,
        )
        return True

    def _rebuild(self) -> None:
        view = self.view
        states = [node_state(info, view.usages_on(name)) for name, info in view.nodes.items()]
        workload = self.current_workload() if self._needs_workload() else None
        if self._engine is not None:
            self._engine.retire()
        if self._catching_up is not None:  # built for the engine replaced here
            self._catching_up.engine.retire()
            self._catching_up = None
        self._engine = PlacementEngine(states, self.engine_policy, workload=workload)
        self._workload = workload
        self._names = self._engine.names
        self._rows = {name: i for i, name in enumerate(self._engine.names)}
        # Row -> name as an object array: numpy picks thousands of names in C.
        self._row_names = np.empty(len(self._engine.names), dtype=object)
        self._row_names[:] = self._engine.names
        self._row_cache.clear()
        self._facts = NodeFacts.build(self._engine, view.nodes)
        self._built_topology = view.topology_version
        # The workload was found just now. A refresh in flight is dropped when it finishes
        # (it was not built for this engine).
        self._refresher.checked_at = self.clock()
        self.rebuilds += 1
        log.info("placement engine rebuilt over %d nodes", len(states))

    def _rewrite_row(self, node: str) -> bool:
        """Write one node's current free resources into its engine row; False when the row's
        shape no longer matches (the caller rebuilds)."""
        engine = self._engine
        info = self.view.nodes.get(node)
        if engine is None or info is None or node not in self._rows:
            return info is None  # a vanished node's row is harmless until the next rebuild
        i = engine.row_of(node)
        state = node_state(info, self.view.usages_on(node))
        self._refresher.note_rewrite(node)  # a refresh in flight copied the row before this
        if self._catching_up is not None:  # and a finished one, until it is swapped in
            self._catching_up.job.rewritten.add(node)
        try:
            engine.update_node(state)
        except RowShapeChanged:
            # Cards appeared or vanished (the row's width may change), or a card's model or the
            # CPU capacity changed: per-row constants of the engine (model masks, normalisers).
            return False
        if self._facts is not None:
            self._facts.update(i, node, info)
        return True

    # ------------------------------------------------------------------ verbs
    def structural_reason(self, info: NodeInfo | None, name: str, request: GpuRequest) -> str:
        """Why the node can never take this pod, whatever is freed (empty if it might)."""
        self.engine()
        row = self._rows.get(name)
        if info is None or row is None or self._facts is None:
            return ""
        return structural(self._facts, row, name, request)

    def filter(self, request: GpuRequest, node_names: Sequence[str]) -> FilterOutcome:
        out = FilterOutcome()
        if request.kind is RequestKind.NONE:
            out.passed = tuple(node_names)
            return out
        engine = self.engine()
        facts = self._facts
        assert facts is not None
        pod = request.to_placement()
        rows = self.rows(node_names)
        # One spare False slot at the end: unknown names (row -1) land there.
        feasible = np.zeros(len(engine.names) + 1, dtype=bool)
        feasible[engine.feasible_rows(pod)] = True
        fits = feasible[rows]
        if fits.all():
            # Everything passes on a roomy cluster: the list sent is the answer, as is (and
            # its rows are cached already).
            out.passed = tuple(node_names)
        else:
            out.passed = self._names_of(rows[fits])
            # kube-scheduler usually prioritizes exactly the nodes that just passed.
            self._remember_rows(out.passed, rows[fits])
        failing = np.flatnonzero(~fits)
        failing_rows = rows[failing]
        unknown = failing_rows < 0
        never = np.zeros(failing.size, dtype=bool)
        never[~unknown] = facts.never_fits(failing_rows[~unknown], request)
        # One reason per failing check, the same words on every node (reasons.py says why),
        # picked per node in C: on a busy cluster most of thousands of nodes are rejected.
        if unknown.any():
            out.failed.update(dict.fromkeys(_pick(node_names, failing[unknown]), UNSEEN_NODE))
            out.categories["unknown-node"] += int(unknown.sum())
        if never.any():
            never_rows = failing_rows[never]
            codes = facts.structural_codes(never_rows, request)
            out.unresolvable = dict(
                zip(
                    self._names_of(never_rows),
                    phrases_of(structural_phrases(request), codes),
                    strict=True,
                )
            )
            _count(out.categories, STRUCTURAL_CATEGORIES, codes)
        now = failing[~unknown & ~never]
        if now.size:
            codes = explain_codes(engine, pod, rows[now])
            out.failed.update(
                zip(self._names_of(rows[now]), phrases_of(refusal_phrases(pod), codes), strict=True)
            )
            _count(out.categories, EXPLAIN_CATEGORIES, codes)
        return out

    def _names_of(self, rows: npt.NDArray[np.int64]) -> tuple[str, ...]:
        """Names of engine ``rows`` (all known), i.e. the names the caller sent for them."""
        return tuple(self._row_names[rows].tolist())

    def rows(self, node_names: Sequence[str]) -> npt.NDArray[np.int64]:
        """Engine rows of ``node_names`` (-1: unknown). kube-scheduler sends the same list
        again and again (every node, with percentageOfNodesToScore 100), so the last few
        mappings are cached until the engine is rebuilt.

        The cache is a short list searched by identity, then equality, not a dict: hashing a
        tuple of thousands of names is not cached by Python and cost more than the lookup
        saved (the wire layer hands back the same tuple object for the same list)."""
        key = tuple(node_names)
        cache = self._row_cache
        for k in range(len(cache) - 1, -1, -1):
            known, found = cache[k]
            if known is key or (len(known) == len(key) and known == key):
                cache.append(cache.pop(k))  # most recently used last
                return found
        found = rows_of(self._rows, key)
        self._remember_rows(key, found)
        return found

    def _remember_rows(self, key: tuple[str, ...], rows: npt.NDArray[np.int64]) -> None:
        self._row_cache.append((key, rows))
        if len(self._row_cache) > 8:
            del self._row_cache[0]

    def prioritize(self, request: GpuRequest, node_names: Sequence[str]) -> list[tuple[str, int]]:
        """(node, score 0..10) for each of ``node_names`` the pod fits, in their order."""
        positions, _, scores = self.prioritize_rows(request, node_names)
        return list(zip(_pick(node_names, positions), scores.tolist(), strict=True))

    @property
    def row_names(self) -> Sequence[str]:
        """Node name of each engine row (a new object whenever the engine is rebuilt)."""
        self.engine()
        return self._names

    def prioritize_rows(
        self, request: GpuRequest, node_names: Sequence[str]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """:meth:`prioritize` as arrays: positions in ``node_names`` of the nodes that fit, in
        order, their engine rows (see :attr:`row_names`) and their scores 0..10."""
        empty = np.zeros(0, dtype=np.int64)
        if request.kind is RequestKind.NONE:
            return empty, empty, empty
        engine = self.engine()
        # The engine scores a share at its level on each card, memory included
        # (PlacementEngine.levelled): a pod asking only memory is ranked by its memory.
        pod = request.to_placement()
        if self._refreshes_workload():
            self._refresher.note_shape(pod)  # a refreshed engine is warmed with it
        rows = self.rows(node_names)
        feasible = np.zeros(len(engine.names) + 1, dtype=bool)
        feasible[engine.feasible_rows(pod)] = True
        wanted = np.flatnonzero(feasible[rows])  # positions in node_names, in their order
        by_row = np.argsort(rows[wanted], kind="stable")  # the engine wants tie-break order
        ordered = rows[wanted][by_row]
        ordered_scores, best = ranked(engine, pod, ordered)
        priorities = np.empty(wanted.size, dtype=np.int64)
        priorities[by_row] = extender_priorities(ordered_scores, best)
        return wanted, rows[wanted], priorities

    def decide(self, pod: dict[str, Any], request: GpuRequest, node: str) -> AllocationDecision:
        """Choose the cards on ``node`` and reserve them in the view (undo with
        ``view.unreserve(uid)``); raises :class:`Unschedulable` with the reason."""
        decision = self.choose(request, node)
        self.view.reserve(usage_of(pod, request, decision, bound=False))
        # Apply the reservation to the engine now, so the next decision in this loop step sees it.
        self.engine()
        return decision

    def choose(self, request: GpuRequest, node: str) -> AllocationDecision:
        """The cards the pod would get on ``node`` now, reserving nothing; raises
        :class:`Unschedulable` with the reason."""
        info = self.view.nodes.get(node)
        if info is None:
            raise Unschedulable(f"{node}: not yet seen by the kubegpu extender's node watch")
        structural = self.structural_reason(info, node, request)
        if structural:
            raise Unschedulable(structural)
        assert info.inventory is not None
        engine = self.engine()
        placement = request.to_placement()
        fit = engine.explain(node, placement)
        if not fit.fits:
            raise Unschedulable(fit.reason)
        cards = held_cards(info.inventory, request, engine.pick_gpus(node, placement))
        if request.kind is RequestKind.SHARED:
            card = cards[0]
            containers = tuple(
                ContainerAllocation(
                    c.name,
                    c.init,
                    (CardShare(card.uuid, card.index, c.compute_milli, c.gpu_memory_mib),),
                )
                for c in request.containers
                if c.compute_milli or c.gpu_memory_mib
            )
        else:
            containers = split_whole(request, cards)
        decided_at = datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return AllocationDecision(
            node, cards, containers, decided_at, self.policy, request.kind is RequestKind.SHARED
        )


def _pick(names: Sequence[str], positions: npt.NDArray[np.int64]) -> tuple[str, ...]:
    """``tuple(names[k] for k in positions)`` without a Python-level loop (thousands of
    nodes)."""
    if positions.size == 0:
        return ()
    if positions.size == 1:
        return (names[int(positions[0])],)
    picked: tuple[str, ...] = operator.itemgetter(*positions.tolist())(names)
    return picked


def _count(counter: Counter[str], labels: Sequence[str], codes: npt.NDArray[np.int64]) -> None:
    for code, number in enumerate(np.bincount(codes, minlength=len(labels)).tolist()):
        if number:
            counter[labels[code]] += number
