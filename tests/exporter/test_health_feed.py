"""The health feed: Xid counts, and health judged only by the node agent's own health monitor
(same policy, same recovery rule), fed from the fake backend's watchers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kubegpu.core.backend import HealthWatcher
from kubegpu.core.gpu import GpuUuid
from kubegpu.core.health import HealthCheckPolicy, HealthEvent, HealthEventKind
from kubegpu.core.health_feed import HealthFeed
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.inventory.health import HealthMonitor
from kubegpu.roles.health import judge_health
from kubegpu.testing.waiting import wait_until as poll_until

A, B = GpuUuid("GPU-a"), GpuUuid("GPU-b")
POLL_S = 0.02  # one health check; the agent's default is longer, the rule is the same


@pytest.fixture
def backend() -> Iterator[FakeGpuBackend]:
    backend = FakeGpuBackend.from_spec("4xT4")
    yield backend
    backend.close()


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    # What the monitor's threads have judged: looked at, as the feed's readers do.
    poll_until(condition, timeout_s=timeout_s, what=what, poll_s=0.005)


class CountedChecks:
    """The fake backend, counting each health check (one watcher wait, quiet or not) per GPU
    and announcing it, so a test waits for a number of checks rather than for time."""

    def __init__(self, backend: FakeGpuBackend) -> None:
        self.backend = backend
        self.checks: dict[GpuUuid, int] = {}
        self._changed = threading.Condition()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def watch_health(self, uuid: GpuUuid) -> HealthWatcher:
        watcher = self.backend.watch_health(uuid)
        counted = self

        class Counted:
            def wait(self, timeout_s: float) -> list[HealthEvent]:
                events = watcher.wait(timeout_s)
                with counted._changed:
                    counted.checks[uuid] = counted.checks.get(uuid, 0) + 1
                    counted._changed.notify_all()
                return events

            def close(self) -> None:
                watcher.close()

        return Counted()

    def wait_for_checks(self, uuid: GpuUuid, more: int, timeout_s: float = 20.0) -> None:
        with self._changed:
            want = self.checks.get(uuid, 0) + more
            reached = self._changed.wait_for(lambda: self.checks.get(uuid, 0) >= want, timeout_s)
        assert reached, f"{uuid}: {self.checks.get(uuid, 0)} health checks, wanted {want}"


def watching(
    backend: FakeGpuBackend | CountedChecks, policy: HealthCheckPolicy | None = None
) -> HealthFeed:
    feed = HealthFeed(policy=policy)
    judge_health(feed, backend, backend.snapshot(), node_name="node-a", poll_timeout_s=POLL_S)
    # start() opened every watcher before returning: events from here on are seen.
    assert all(s["watchers"] >= 1 for s in backend.status())
    return feed


def test_feed_watching_the_fake_backend_sees_injected_xids_and_tells_listeners(
    backend: FakeGpuBackend,
) -> None:
    uuids = [gpu.uuid for gpu in backend.snapshot().gpus]
    feed = watching(backend)
    notified: list[int] = []
    feed.add_listener(lambda: notified.append(1))
    try:
        backend.inject_xid(2, 79)
        wait_until(lambda: not feed.tally().healthy(uuids[2]), "the Xid never arrived")
        assert feed.healthy_map() == {u: u != uuids[2] for u in uuids}
        assert feed.tally().xid_counts == {(uuids[2], 79): 1}
        assert notified
    finally:
        feed.close()
    assert all(s["watchers"] == 0 for s in backend.status())  # close() closed every watcher


def test_the_device_plugins_policy_decides_which_xids_are_critical(
    backend: FakeGpuBackend,
) -> None:
    policy = HealthCheckPolicy(disabled_xids=frozenset({79}), enabled_xids=frozenset({13}))
    feed = watching(backend, policy)
    uuid = backend.snapshot().gpus[0].uuid
    try:
        backend.inject_xid(0, 79)
        wait_until(lambda: feed.tally().xid_counts.get((uuid, 79)) == 1, "Xid 79 not counted")
        assert feed.tally().healthy(uuid)  # disabled by the policy, still counted
        backend.inject_xid(0, 13)
        wait_until(lambda: not feed.tally().healthy(uuid), "Xid 13 not judged critical")
    finally:
        feed.close()


def test_an_xid_struck_gpu_comes_back_after_the_agents_quiet_checks_here_too(
    backend: FakeGpuBackend,
) -> None:
    # health.recoverAfterHealthyChecks: the agent's monitor reports the GPU healthy again after
    # that many quiet checks. The standalone exporter and the labeller must follow, or
    # kubegpu_gpu_healthy and kubegpu.io/gpu.healthy-count stay low for a GPU in service.
    policy = HealthCheckPolicy(recover_after_healthy_checks=5)
    uuid = backend.snapshot().gpus[1].uuid
    agent_said: list[bool] = []
    agent = HealthMonitor(
        backend,
        backend.snapshot(),
        policy,
        lambda u, healthy, _reason: agent_said.append(healthy) if u == uuid else None,
        poll_timeout_s=POLL_S,
    )
    agent.start()
    feed = watching(backend, policy)
    feed_said = [True]  # each change of the GPU's health, as the feed's listeners see it
    feed.add_listener(
        lambda: (
            feed_said.append(not feed_said[-1])
            if feed.tally().healthy(uuid) != feed_said[-1]
            else None
        )
    )
    try:
        backend.inject_xid(1, 95)  # an Xid a GPU reset clears (79 would wait for a reboot)
        wait_until(lambda: agent_said == [False, True], f"agent said {agent_said}")
        wait_until(lambda: feed_said == [True, False, True], f"feed said {feed_said}")
        assert feed.healthy_map()[uuid] is True
        assert feed.tally().xid_counts == {(uuid, 95): 1}
    finally:
        feed.close()
        agent.stop()


def test_a_lost_gpu_needs_recovery_not_quiet_checks_and_keeps_its_xid_count(
    backend: FakeGpuBackend,
) -> None:
    counted = CountedChecks(backend)
    feed = watching(counted, HealthCheckPolicy(recover_after_healthy_checks=1))
    uuid = backend.snapshot().gpus[3].uuid
    try:
        backend.inject_xid(3, 95)
        backend.lose(3)
        wait_until(lambda: not feed.tally().healthy(uuid), "loss not seen")
        counted.wait_for_checks(
            uuid, 20
        )  # many quiet checks: a lost GPU does not come back on them
        assert not feed.tally().healthy(uuid)
        backend.restore(3)
        wait_until(lambda: feed.tally().healthy(uuid), "recovery not seen")
        assert feed.tally().xid_counts == {(uuid, 95): 1}
    finally:
        feed.close()


def test_verdicts_come_from_the_judge_and_xids_are_only_counted() -> None:
    feed = HealthFeed([A, B])
    feed.count(HealthEvent(HealthEventKind.XID, A, xid=79))
    assert feed.healthy_map() == {A: True, B: True}  # counting is not judging
    feed.set_healthy(A, False)
    feed.set_healthy(B, False)
    feed.set_healthy(B, True)
    assert feed.healthy_map() == {A: False, B: True}
    assert feed.tally().xid_counts == {(A, 79): 1}


def test_counting_an_event_counts_its_xid_and_leaves_health_to_the_judge() -> None:
    feed = HealthFeed([A, B])
    for event in (
        HealthEvent(HealthEventKind.XID, A, xid=79),
        HealthEvent(HealthEventKind.XID, A, xid=79),
        HealthEvent(HealthEventKind.XID, B, xid=13),
        HealthEvent(HealthEventKind.LOST, B),
        HealthEvent(HealthEventKind.XID, None, xid=48),
        HealthEvent(HealthEventKind.XID, A, xid=None),
    ):
        feed.count(event)
    assert feed.healthy_map() == {A: True, B: True}
    assert feed.tally().xid_counts == {(A, 79): 2, (B, 13): 1, (A, 48): 1, (B, 48): 1}
