"""The target workload's periodic refresh, done off the request path.

FGD and our policy measure fragmentation against the cluster's target workload, which the
extender re-reads every ``workload-refresh-seconds``. Done inside a verb, as it once was, the
refresh cost a decision ~1 s at 5,000 nodes and 20,000 pods (issue 32): reading every pod's
request (~0.7 s: quantities are parsed), building a new engine (~0.2 s) and then, in the
decisions after it, recomputing the policies' per-state score tables the new engine started
without. Now:

* each pod is classed from the claim the view parsed when it stored the pod
  (:func:`pod_classes`), so finding the workload costs a walk of the claims, ~30 ms at 12,000
  pods, done in steps;
* the check runs in a background thread (:class:`Refresher`): when the workload is unchanged
  (the usual case) nothing else happens; when it changed, the thread builds the replacement
  engine, as a rebuild would, and scores on it the pod shapes prioritize saw lately, so its
  tables are warm; once built, the new engine takes back, a few rows per call, the rows the
  serving one took meanwhile, and is swapped in when it holds them all
  (:meth:`kubegpu.extender.scheduler.GpuScheduler.engine`), so no reservation or bind is lost.

The thread reads only values the event loop does not change: copies of the view's maps of the
pods' claims, the nodes and the pods' usages, taken on the loop when the refresh starts (the view's
own maps and sets change under a thread walking them). While it runs it keeps out of the
loop's way: it steps aside whenever a verb is being served (:class:`VerbsInFlight`), in steps
of a few milliseconds at most; the cyclic garbage collector is paused, and what the build
leaves alive frozen (:func:`collector_paused`); and the GIL changes hands often
(:func:`gil_handed_back_soon`). ``bench/bench_extender_soak.py`` measures it (docs/benchmarks.md,
"Soak at 5,000 nodes").
"""

from __future__ import annotations

import collections
import contextlib
import gc
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from typing import ParamSpec, TypeVar

from kubegpu.extender.ranking import ranked
from kubegpu.extender.view import ClusterState
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import ClassKey, TypicalWorkload, class_key
from kubegpu.placement.model import PodRequest
from kubegpu.placement.policy import PolicySpec
from kubegpu.placement.state import paced
from kubegpu.placement.target import reference_card_memory, target_workload
from kubegpu.sharing.accounting import NodeInfo, PodUsage, node_state
from kubegpu.sharing.claim import PodClaim

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")
PodKey = tuple[str, str]  # (namespace, name), the view's key of a pod

# Pod shapes prioritize saw lately, scored on a new engine before it serves. A cluster's pods
# come in a few dozen shapes; more would only lengthen the build.
SHAPES_KEPT = 64
# Nodes made into node states between two of the build's steps aside (~2 ms of work).
ROWS_PER_YIELD = 100
# Pods classed, or grouped by node, between two steps aside (~2 ms of work when every pod
# is new since the last refresh, as after 300 s of churn).
PODS_PER_PACE = 100
# Nodes scored for one shape between two steps aside while warming a new engine (~2 ms).
WARM_ROWS_PER_STEP = 100
# The longest a build's step aside waits for the verbs in flight to finish: under load that
# never lets up (binds awaiting the API server back to back) it still moves, a step at a time.
STEP_ASIDE_MAX_S = 0.05
# The GIL switch interval while a refresh runs (gil_handed_back_soon); CPython's is 5 ms.
LOOP_SWITCH_S = 0.0001


def pod_classes(
    claims: Iterable[PodClaim],
    card_memory_mib: int | None,
    pace: Callable[[], None] | None = None,
) -> list[ClassKey]:
    """One class key per claim of ``claims`` that asks for something the extender serves,
    shares classed on a card of ``card_memory_mib`` (``class_key``); ``pace`` is called every
    :data:`PODS_PER_PACE` claims.

    The claims are those the view parsed when it stored each pod (``ClusterState.pod_claims``),
    so classing one costs ~2.5 us and nothing is remembered between refreshes. A map of each
    pod's class by pod object, kept to skip unchanged pods, held every pod deleted since the
    last refresh alive until the next one freed them all at once on the building thread:
    12,000 pod objects, 10-20 ms with the GIL held (issue 32's soak), for a saving of ~30 ms
    of paced work."""
    out: list[ClassKey] = []
    for claim in paced(claims, PODS_PER_PACE, pace):
        request = claim.request
        if request is not None:
            out.append(class_key(request.to_placement(), card_memory_mib=card_memory_mib))
    return out


@dataclass(frozen=True)
class ViewCopy:
    """What a refresh reads of the view, taken on the event loop: every pod's claim, every
    node, and the pods' usages by uid."""

    claims: Mapping[PodKey, PodClaim]  # ClusterState.pod_claims: each stored pod's claim
    nodes: Mapping[str, NodeInfo]
    usage_stores: tuple[Mapping[str, PodUsage], ...]  # ClusterState.usage_stores

    @classmethod
    def of(cls, view: ClusterState) -> ViewCopy:
        """Copies of the maps the view changes in place (the claims, nodes and usages
        themselves are values: replaced, never changed). Whole-dict copies only, made in C and
        making no object per entry: asking ``usages_on`` for each of 5,000 nodes here held the
        loop ~40 ms at every refresh, and lists of (key, value) pairs 9-18 ms (issue 32's
        soak); grouping by node is the job's (:meth:`usages`)."""
        return cls(view.pod_claims(), dict(view.nodes), view.usage_stores())

    def usages(self, pace: Callable[[], None] | None = None) -> dict[str, list[PodUsage]]:
        """Each node's pod usages, as ``usages_on`` gives them: a pod counts once, by the
        first store that holds it. ``pace`` is called every :data:`PODS_PER_PACE` pods."""
        seen: set[str] = set()
        by_node: dict[str, list[PodUsage]] = collections.defaultdict(list)
        for store in self.usage_stores:
            for uid, usage in paced(store.items(), PODS_PER_PACE, pace):
                if uid not in seen:
                    seen.add(uid)
                    by_node[usage.node].append(usage)
        return by_node


@dataclass(frozen=True)
class Refreshed:
    """A refresh's outcome: the workload found and, when it differs from the engine's, the
    engine built for it (``None``: unchanged, keep the engine)."""

    workload: TypicalWorkload
    engine: PlacementEngine | None
    seconds: float  # how long the job took (off the request path)


@dataclass
class RefreshJob:
    """One refresh in flight: the engine it reads rows from, when it started, and the rows the
    event loop rewrote in that engine since (the new engine takes them again)."""

    base: PlacementEngine  # the engine serving when it started
    started_at: float
    future: Future[Refreshed]
    rewritten: set[str] = field(default_factory=set)


class VerbsInFlight:
    """Counts the extender's verbs being served, so a refresh's build can step aside for them.

    With two threads runnable, the interpreter hands the GIL from one to the other: a decision
    made while a build ran got about half the process, and took 3-6 times its usual time
    (36-81 ms against a p99 of 13 at 5,000 nodes in issue 32's soak). The build is the one
    that can wait, so between its steps it waits until no verb is in flight (at most
    :data:`STEP_ASIDE_MAX_S`): a decision competes with one step at most. The count changes on
    the event loop only; the build thread reads it through the event."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = threading.Event()
        self._idle.set()

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """One verb is being served while the block runs (event loop only)."""
        self._count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._count -= 1
            if self._count == 0:
                self._idle.set()

    @property
    def idle(self) -> bool:
        """No verb is being served."""
        return self._idle.is_set()

    def step_aside(self) -> None:
        """Wait until no verb is in flight, or :data:`STEP_ASIDE_MAX_S`; in any case let the
        GIL go."""
        if self._idle.wait(STEP_ASIDE_MAX_S):
            time.sleep(0)


class ThreadPerJob(Executor):
    """Runs each job in a new daemon thread: a refresh is due once every few minutes, and a
    daemon thread needs no shutdown (a build cut short at exit is simply not used)."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to whoever reads the future
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=run, name="kubegpu-workload-refresh", daemon=True).start()
        return future


class Refresher:
    """Starts workload refreshes when due and hands back finished ones (not thread-safe: the
    scheduler calls it from the event loop only; the job itself runs elsewhere)."""

    def __init__(
        self,
        policy: PolicySpec,
        interval_s: float,
        executor: Executor | None = None,
    ) -> None:
        self.policy = policy
        self.interval_s = interval_s
        self.executor = executor if executor is not None else ThreadPerJob()
        self.verbs = VerbsInFlight()  # the server marks each verb; the build steps aside
        self.checked_at = 0.0  # when the engine's workload was last found (clock seconds)
        self.job: RefreshJob | None = None
        self._shapes: collections.OrderedDict[PodRequest, None] = collections.OrderedDict()

    def workload(
        self,
        claims: Iterable[PodClaim],
        nodes: Iterable[NodeInfo],
        pace: Callable[[], None] | None = None,
    ) -> TypicalWorkload:
        """The target workload of the pods of ``claims`` on ``nodes``
        (``kubegpu.placement.target``'s definition); ``pace`` as in :func:`pod_classes`."""
        # Shares are classed at their level on the cluster's most common card (memory too).
        card_memory = reference_card_memory(
            g.memory_mib
            for info in paced(nodes, ROWS_PER_YIELD, pace)
            if info.inventory is not None
            for g in info.inventory.gpus
        )
        return target_workload(self.policy, pod_classes(claims, card_memory, pace))

    def note_shape(self, pod: PodRequest) -> None:
        """Remember a shape prioritize scored, to warm a new engine's tables with."""
        shape = replace(pod, name="") if pod.name else pod
        self._shapes[shape] = None
        self._shapes.move_to_end(shape)
        if len(self._shapes) > SHAPES_KEPT:
            self._shapes.popitem(last=False)

    def retire(self, engine: PlacementEngine) -> None:
        """Take ``engine``, just replaced by a refreshed one, apart in the background,
        stepping aside for the verbs (:meth:`PlacementEngine.retire`): freed on the event
        loop, an engine that served for minutes held a decision 15-45 ms."""
        future = self.executor.submit(engine.retire, self.verbs.step_aside)
        future.add_done_callback(_log_failure)

    def note_rewrite(self, node: str) -> None:
        """The event loop rewrote ``node``'s row of the engine (call before writing it)."""
        if self.job is not None:
            self.job.rewritten.add(node)

    def due(self, now: float) -> bool:
        return self.job is None and now - self.checked_at > self.interval_s

    def start(
        self, base: PlacementEngine, workload: TypicalWorkload | None, view: ViewCopy, now: float
    ) -> None:
        """Check the workload of ``view`` against ``workload``, that of ``base`` (the engine
        serving), in the background, building a new engine if it changed."""
        shapes = list(self._shapes)
        future = self.executor.submit(self._refresh, workload, view, shapes)
        self.job = RefreshJob(base, now, future)

    def finished(self) -> tuple[RefreshJob, Refreshed] | None:
        """The job just finished and its outcome; ``None`` while none is (or when it failed:
        logged, and tried again an interval later)."""
        job = self.job
        if job is None or not job.future.done():
            return None
        self.job = None
        # Not back in time: a rebuild since then found the workload later.
        self.checked_at = max(self.checked_at, job.started_at)
        try:
            return job, job.future.result()
        except Exception:
            log.warning(
                "refreshing the target workload failed; the placement engine keeps the "
                "previous one until the next refresh",
                exc_info=True,
            )
            return None

    def _refresh(
        self, current: TypicalWorkload | None, view: ViewCopy, shapes: Sequence[PodRequest]
    ) -> Refreshed:
        """The job (in the background thread), yielding to the event loop."""
        with collector_paused(), gil_handed_back_soon():
            return self._build(current, view, shapes)

    def _build(
        self, current: TypicalWorkload | None, view: ViewCopy, shapes: Sequence[PodRequest]
    ) -> Refreshed:
        start = time.perf_counter()
        step_aside = self.verbs.step_aside
        step_aside()
        workload = self.workload(view.claims.values(), view.nodes.values(), step_aside)
        if workload == current:
            return Refreshed(workload, None, time.perf_counter() - start)
        step_aside()
        # The node states exactly as GpuScheduler._rebuild makes them, from the copy.
        states = []
        usages = view.usages(step_aside)
        for name, info in paced(view.nodes.items(), ROWS_PER_YIELD, step_aside):
            states.append(node_state(info, usages.get(name, ())))
        step_aside()
        engine = PlacementEngine(states, self.policy, workload=workload, pace=step_aside)
        warm(engine, shapes, step_aside)
        return Refreshed(workload, engine, time.perf_counter() - start)


def _log_failure(future: Future[None]) -> None:
    if future.exception() is not None:
        log.warning("retiring a replaced placement engine failed", exc_info=future.exception())


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic cyclic garbage collection while the block runs (then as before).

    A build makes some 100,000 objects that live until it ends (node states, the new engine).
    Measured at 5,000 nodes, the young collections they set off promoted them, and a full
    collection ran from the building thread at every refresh, 140-300 ms with the GIL held:
    the event loop's decisions waited as long. Paused, the temporaries die by reference count
    at the end of the build, unexamined. Process-wide, for the build's few seconds; nothing
    else in the extender turns the collector off.

    What is still alive at the end (the new engine, and what the loop made meanwhile) is then
    frozen, as the extender's heap is every minute anyway
    (:mod:`kubegpu.extender.collector`): the first young collection after the
    pause scanned all of it, 11-17 ms on whichever thread allocated next, most often the
    loop's inside a verb, and found nothing to collect (issue 32's soak at 5,000 nodes). The
    cost is that of the freeze: a cycle already garbage then is never collected."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            gc.enable()


@contextlib.contextmanager
def gil_handed_back_soon() -> Iterator[None]:
    """A short GIL switch interval while the block runs (then as before).

    The event loop's verbs run numpy over thousands of rows, and numpy lets go of the GIL for
    each such operation; with the building thread runnable, the loop then waited for the GIL
    to come back for up to the interpreter's switch interval (5 ms) every time: a 10 ms
    prioritize took 190 ms while a refresh ran. At 0.5 ms, up to 80 ms; at 0.1 ms, 36 ms.
    Process-wide, for the refresh's ~1 s (the building thread gets half the CPU while the loop
    is busy, all of it while the loop waits)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, LOOP_SWITCH_S))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def warm(
    engine: PlacementEngine,
    shapes: Sequence[PodRequest],
    step_aside: Callable[[], None] = lambda: time.sleep(0),
) -> None:
    """Score every node that takes each of ``shapes``, as prioritize would: what fills the
    policies' per-state tables that the first decisions on a new engine would otherwise
    compute. ``step_aside`` runs between two pieces of :data:`WARM_ROWS_PER_STEP` rows: a
    shape's first scoring on 5,000 nodes, its tables empty, takes 10-20 ms, which a decision
    sharing the GIL with it would wait half of."""
    for pod in shapes:
        step_aside()
        rows = engine.feasible_rows(pod)
        for start in range(0, rows.size, WARM_ROWS_PER_STEP):
            step_aside()
            ranked(engine, pod, rows[start : start + WARM_ROWS_PER_STEP])
