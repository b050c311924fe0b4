"""The target workload is refreshed off the request path (issue 32).

A verb never rebuilds the engine for a stale workload: an unchanged workload only restarts the
timer, a changed one is built by the refresh's executor and swapped in at the start of a later
call, with every reservation and bind made meanwhile written into it. The clock is a fake one;
the executor is either a held one (jobs run when the test says, in a thread of their own) or
the default, a daemon thread per refresh.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar, cast

import pytest

from kubegpu.extender import refresh
from kubegpu.extender import scheduler as scheduler_module
from kubegpu.extender.scheduler import GpuScheduler
from kubegpu.kube.view import ClusterView
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.model import NodeState
from kubegpu.sharing.accounting import node_state
from kubegpu.sharing.claim import read_claim
from kubegpu.sharing.resources import GpuRequest
from tests.extender.cluster import gpu_node, shared_pod, whole_pod

P = ParamSpec("P")
T = TypeVar("T")
REFRESH_S = 300.0
NODES = [f"node-{i}" for i in range(6)]


class HeldExecutor(Executor):
    """Keeps each job until :meth:`run` runs it, in a thread of its own."""

    def __init__(self) -> None:
        self.jobs: list[Callable[[], None]] = []

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()

        def job() -> None:
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

        self.jobs.append(job)
        return future

    def run(self) -> None:
        jobs, self.jobs = self.jobs, []
        for job in jobs:
            thread = threading.Thread(target=job)
            thread.start()
            thread.join()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def pod(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    spec["metadata"]["uid"] = f"uid-{name}"
    return spec


def cluster(
    executor: Executor | None = None,
) -> tuple[GpuScheduler, ClusterView, Clock]:
    view = ClusterView(cast(Any, None))
    for name in NODES:
        view.apply_node(gpu_node(name, cards=4))
    for i in range(4):
        view.apply_pod(pod(f"small-{i}", shared_pod(f"small-{i}", 8192, 200)))
    clock = Clock()
    scheduler = GpuScheduler(
        view, "kubegpu", workload_refresh_s=REFRESH_S, clock=clock, executor=executor
    )
    scheduler.engine()
    assert scheduler.rebuilds == 1
    return scheduler, view, clock


def request_of(spec: dict[str, Any], view: ClusterView) -> GpuRequest:
    request = read_claim(spec, view.names).request
    assert request is not None
    return request


def change_the_workload(view: ClusterView) -> None:
    """Whole-card pods arrive: a class the workload did not have."""
    for i in range(6):
        view.apply_pod(pod(f"whole-{i}", whole_pod(f"whole-{i}", 2)))


def fresh_states(view: ClusterView) -> list[NodeState]:
    return [node_state(info, view.usages_on(name)) for name, info in view.nodes.items()]


def assert_matches_a_rebuild(scheduler: GpuScheduler, view: ClusterView) -> None:
    """The serving engine holds what an engine built from the view now would."""
    engine = scheduler.engine()
    rebuilt = PlacementEngine(fresh_states(view), engine.policy, scheduler.current_workload())
    assert engine.names == rebuilt.names
    assert [engine.node_state(n) for n in engine.names] == [
        rebuilt.node_state(n) for n in rebuilt.names
    ]


def test_a_stale_but_unchanged_workload_rebuilds_nothing() -> None:
    held = HeldExecutor()
    scheduler, view, clock = cluster(held)
    engine = scheduler.engine()
    names = scheduler.row_names
    clock.now += REFRESH_S + 1
    scheduler.filter(request_of(shared_pod("p", 4096, 100), view), NODES)
    assert len(held.jobs) == 1  # the check went to the executor
    held.run()
    clock.now += 1
    scheduler.engine()
    assert scheduler.engine() is engine
    assert scheduler.row_names is names
    assert (scheduler.rebuilds, scheduler.refreshes) == (1, 0)
    # And the timer restarted: the next check is an interval later.
    clock.now += REFRESH_S - 5
    scheduler.engine()
    assert held.jobs == []
    clock.now += 10
    scheduler.engine()
    assert len(held.jobs) == 1


def test_a_changed_workload_is_built_off_the_verb_and_keeps_the_binds_made_meanwhile() -> None:
    held = HeldExecutor()
    scheduler, view, clock = cluster(held)
    old = scheduler.engine()
    old_workload = scheduler.current_workload()
    change_the_workload(view)
    clock.now += REFRESH_S + 1
    # The verb that finds the workload stale answers from the engine it has.
    big = whole_pod("big", 4)
    outcome = scheduler.filter(request_of(big, view), NODES)
    assert outcome.passed == tuple(NODES)
    assert scheduler.engine() is old
    assert len(held.jobs) == 1
    assert scheduler.rebuilds == 1
    # While the replacement builds: a bind's reservation, taken into the serving engine...
    scheduler.decide(pod("big", big), request_of(big, view), "node-2")
    assert all(g.free_milli == 0 for g in old.node_state("node-2").gpus)
    held.run()
    # ...and, once it is built, a pod the watch reports bound (not yet in any engine).
    bound = pod("bound", whole_pod("bound", 4))
    bound["spec"]["nodeName"] = "node-4"
    view.apply_pod(bound)
    clock.now += 1
    # The next call swaps the new engine in, with both in it.
    engine = scheduler.engine()
    assert engine is not old
    assert (scheduler.rebuilds, scheduler.refreshes) == (1, 1)
    assert scheduler.current_workload() != old_workload
    for name in ("node-2", "node-4"):
        assert all(g.free_milli == 0 for g in engine.node_state(name).gpus), name
    assert_matches_a_rebuild(scheduler, view)
    assert scheduler.filter(request_of(whole_pod("next", 4), view), ["node-2"]).passed == ()


def test_a_refreshed_engine_takes_the_rows_back_a_few_per_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No call writes a whole refresh's worth of rows: the new engine takes back
    CATCH_UP_ROWS per call, rows rewritten meanwhile included, and serves only once it holds
    them all."""
    monkeypatch.setattr(scheduler_module, "CATCH_UP_ROWS", 1)
    held = HeldExecutor()
    scheduler, view, clock = cluster(held)
    old = scheduler.engine()
    change_the_workload(view)
    clock.now += REFRESH_S + 1
    scheduler.engine()  # starts the refresh
    for name in NODES[:3]:  # three rows the serving engine takes while it builds
        spec = pod(f"w-{name}", whole_pod(f"w-{name}", 4))
        scheduler.decide(spec, request_of(spec, view), name)
    held.run()
    assert scheduler.engine() is old  # node-0 taken back
    bound = pod("bound", whole_pod("bound", 4))  # a fourth row, meanwhile: the watch's
    bound["spec"]["nodeName"] = NODES[3]
    view.apply_pod(bound)
    # node-1 (and node-3 written into the serving engine), node-2, then node-3 and the swap
    assert [scheduler.engine() is old for _ in range(3)] == [True, True, False]
    engine = scheduler.engine()
    assert (scheduler.rebuilds, scheduler.refreshes) == (1, 1)
    for name in NODES[:4]:
        assert all(g.free_milli == 0 for g in engine.node_state(name).gpus), name
    assert_matches_a_rebuild(scheduler, view)


def test_the_replaced_engine_is_taken_apart_off_the_loop() -> None:
    """At the swap, the engine that served is handed to the executor, which retires it
    stepping aside for the verbs: not freed inside the call that swaps."""
    held = HeldExecutor()
    scheduler, view, clock = cluster(held)
    old = scheduler.engine()
    change_the_workload(view)
    clock.now += REFRESH_S + 1
    scheduler.engine()
    held.run()
    assert scheduler.engine() is not old and scheduler.refreshes == 1
    assert hasattr(old, "node_scorer")  # still whole: its retirement is the executor's job
    assert len(held.jobs) == 1
    held.run()
    assert not hasattr(old, "node_scorer")
    assert old.state_keys == []


def test_a_build_leaves_what_is_alive_frozen() -> None:
    """Frozen, what was made while the collector was paused is not scanned by the first
    young collection after it (on whichever thread allocates next)."""
    gc.collect()
    frozen = gc.get_freeze_count()
    try:
        with refresh.collector_paused():
            made = [[i] for i in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen + len(made)
        assert gc.get_count()[0] < len(made)
    finally:
        gc.unfreeze()


def test_the_default_refresh_runs_in_its_own_thread_while_verbs_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduler, view, clock = cluster()  # the default executor: a daemon thread per refresh
    release = threading.Event()
    built_on: list[threading.Thread] = []
    real = PlacementEngine

    def slow_engine(*args: Any, **kwargs: Any) -> PlacementEngine:
        built_on.append(threading.current_thread())
        assert release.wait(10), "the test never released the build"
        return real(*args, **kwargs)

    monkeypatch.setattr(refresh, "PlacementEngine", slow_engine)
    old = scheduler.engine()
    change_the_workload(view)
    clock.now += REFRESH_S + 1
    scheduler.engine()  # starts the refresh
    try:
        deadline = time.monotonic() + 10
        while not built_on:  # the build reaches the engine in its own thread
            assert time.monotonic() < deadline, "the build never reached the engine"
            time.sleep(0.001)
        assert built_on[0] is not threading.current_thread()
        # Verbs are answered while the build is held, from the old engine.
        for name in NODES[:3]:
            spec = pod(f"w-{name}", whole_pod(f"w-{name}", 4))
            scheduler.decide(spec, request_of(spec, view), name)
            assert scheduler.engine() is old
    finally:
        release.set()
    engine = wait_for_swap(scheduler, old)
    assert (scheduler.rebuilds, scheduler.refreshes) == (1, 1)
    for name in NODES[:3]:
        assert all(g.free_milli == 0 for g in engine.node_state(name).gpus)
    assert_matches_a_rebuild(scheduler, view)


def test_a_refresh_builds_only_while_no_verb_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """The build steps aside for the verbs in flight (refresh.VerbsInFlight): started by a
    verb, it reaches the engine only once that verb is answered."""
    monkeypatch.setattr(refresh, "STEP_ASIDE_MAX_S", 30.0)  # no step taken for waiting long
    scheduler, view, clock = cluster()  # the default executor: a daemon thread per refresh
    built = threading.Event()
    real = PlacementEngine

    def observed(*args: Any, **kwargs: Any) -> PlacementEngine:
        built.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(refresh, "PlacementEngine", observed)
    old = scheduler.engine()
    change_the_workload(view)
    clock.now += REFRESH_S + 1
    with scheduler.serving():
        assert not scheduler._refresher.verbs.idle
        assert scheduler.engine() is old  # starts the refresh, as the verb's first call
        with scheduler.serving():  # a second verb, answered first
            pass
        assert not built.wait(0.5), "the build ran while a verb was being served"
    assert scheduler._refresher.verbs.idle
    assert built.wait(10), "the build never ran once the verb was answered"
    wait_for_swap(scheduler, old)
    assert scheduler.refreshes == 1
    assert_matches_a_rebuild(scheduler, view)


def test_waiting_for_the_verbs_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under verbs that never let up, the build still moves, one step per wait."""
    monkeypatch.setattr(refresh, "STEP_ASIDE_MAX_S", 0.001)
    scheduler, view, clock = cluster()
    old = scheduler.engine()
    change_the_workload(view)
    clock.now += REFRESH_S + 1
    with scheduler.serving():
        scheduler.engine()
        assert scheduler._refresher.job is not None
        assert scheduler._refresher.job.future.result(timeout=10).engine is not None
    assert wait_for_swap(scheduler, old) is not old


def wait_for_swap(scheduler: GpuScheduler, old: PlacementEngine) -> PlacementEngine:
    deadline = time.monotonic() + 10
    while (engine := scheduler.engine()) is old:
        assert time.monotonic() < deadline, "the refreshed engine never came"
        time.sleep(0.01)
    return engine


def test_a_refresh_finishing_after_a_rebuild_is_dropped() -> None:
    held = HeldExecutor()
    scheduler, view, clock = cluster(held)
    change_the_workload(view)
    clock.now += REFRESH_S + 1
    scheduler.engine()
    view.apply_node(gpu_node("node-new", cards=2))  # a new node: rebuilt on the path
    rebuilt = scheduler.engine()
    assert scheduler.rebuilds == 2
    held.run()
    assert scheduler.engine() is rebuilt
    assert scheduler.refreshes == 0
    assert_matches_a_rebuild(scheduler, view)


def test_a_failed_refresh_keeps_the_engine_and_is_tried_again_an_interval_later(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    held = HeldExecutor()
    scheduler, view, clock = cluster(held)
    old = scheduler.engine()

    def broken(*args: Any, **kwargs: Any) -> PlacementEngine:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(refresh, "PlacementEngine", broken)
    change_the_workload(view)
    clock.now += REFRESH_S + 1
    scheduler.engine()
    held.run()
    with caplog.at_level(logging.WARNING, logger="kubegpu.extender.refresh"):
        assert scheduler.engine() is old
    assert "refreshing the target workload failed" in caplog.text
    assert held.jobs == []
    clock.now += REFRESH_S + 1
    scheduler.engine()
    assert len(held.jobs) == 1


class Followed(dict[str, Any]):
    """A part of a pod spec a weak reference can follow (a plain dict cannot have one)."""


def test_a_refresh_keeps_no_deleted_pod_alive() -> None:
    """Nothing of a refresh outlives it holding pods: once the view drops a pod, the pod is
    freed then, one at a time, not by the next refresh's thread with every other pod deleted
    in five minutes (refresh.pod_classes says what that cost)."""
    held = HeldExecutor()
    scheduler, view, clock = cluster(held)
    spec = pod("gone", whole_pod("gone", 2))  # a new class: the engine is built
    spec["spec"] = Followed(spec["spec"])  # the view stores a copy of the top level only
    view.apply_pod(spec)
    followed = weakref.ref(spec["spec"])
    clock.now += REFRESH_S + 1
    scheduler.engine()
    held.run()
    assert scheduler.engine() is not None and scheduler.refreshes == 1
    view.apply_pod(spec, deleted=True)
    del spec
    gc.collect()
    assert followed() is None


def test_a_refresh_classes_pods_by_the_claims_the_view_parsed() -> None:
    """The refresh's copy carries the view's claims, one per pod, and the engine it builds
    matches one rebuilt from the view."""
    held = HeldExecutor()
    scheduler, view, clock = cluster(held)
    old = scheduler.engine()
    change_the_workload(view)  # new pod objects
    copy = refresh.ViewCopy.of(view)
    assert copy.claims.keys() == view.pod_json.keys()
    assert [c.key for c in copy.claims.values()] == [f"{ns}/{n}" for ns, n in view.pod_json]
    clock.now += REFRESH_S + 1
    scheduler.engine()
    held.run()
    assert scheduler.engine() is not old and scheduler.refreshes == 1
    assert_matches_a_rebuild(scheduler, view)


def test_a_refresh_builds_with_the_collector_paused_and_a_short_gil_switch_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What keeps the loop's verbs quick while a refresh builds (refresh.py says why), and
    both are restored once it is done."""
    held = HeldExecutor()
    scheduler, view, clock = cluster(held)
    seen: list[tuple[bool, float]] = []
    real = PlacementEngine

    def observed(*args: Any, **kwargs: Any) -> PlacementEngine:
        seen.append((gc.isenabled(), sys.getswitchinterval()))
        return real(*args, **kwargs)

    monkeypatch.setattr(refresh, "PlacementEngine", observed)
    interval = sys.getswitchinterval()
    assert gc.isenabled()
    change_the_workload(view)
    clock.now += REFRESH_S + 1
    scheduler.engine()
    held.run()
    assert [enabled for enabled, _ in seen] == [False]
    assert seen[0][1] == pytest.approx(refresh.LOOP_SWITCH_S)
    assert gc.isenabled()
    assert sys.getswitchinterval() == interval
    assert scheduler.engine() is not None and scheduler.refreshes == 1


def test_the_view_copy_groups_each_pod_where_usages_on_counts_it() -> None:
    """The refresh's copy is four whole-map copies, grouped by node in its thread: a pod
    counts once, by the first of reservation, observed, tentative, nominated, as in the
    view."""
    _, view, _ = cluster()
    running = pod("running", whole_pod("running", 1))
    running["spec"]["nodeName"] = NODES[0]
    view.apply_pod(running)
    [observed] = view.usages_on(NODES[0])
    # Its bind to another node in flight: the reservation wins over what the API server says.
    view.reserve(dataclasses.replace(observed, node=NODES[1]))
    expected = dataclasses.replace(observed, uid="uid-tentative", key="default/tentative")
    view.hold_tentative(expected)  # a scored pod that holds nothing else
    nominated = dataclasses.replace(observed, uid="uid-nominated", key="default/nominated")
    view.hold_nominated(dataclasses.replace(nominated, node=NODES[1]))
    view.hold_tentative(nominated)  # the tentative one wins over its nomination
    grouped = refresh.ViewCopy.of(view).usages()
    for name in view.nodes:
        assert sorted(grouped.get(name, []), key=repr) == sorted(view.usages_on(name), key=repr)
    # running (reserved on node-1), tentative, nominated (by its tentative one), once each;
    # the cluster's undecided shares hold nothing
    assert sum(len(u) for u in grouped.values()) == 3
    assert [u.key for u in grouped[NODES[1]]] == ["default/running"]
