"""Health and Xid tallies, folded purely and fed from the fake backend's watchers."""

from __future__ import annotations

import time

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.health import HealthCheckPolicy, HealthEvent, HealthEventKind
from kubegpu.core.metrics import HealthTally, tally_event
from kubegpu.exporter.health import HealthFeed
from kubegpu.inventory.fake import FakeGpuBackend

A, B = GpuUuid("GPU-a"), GpuUuid("GPU-b")


def test_an_event_without_a_gpu_applies_to_every_gpu() -> None:
    tally = tally_event(HealthTally(), HealthEvent(HealthEventKind.XID, None, xid=48), [A, B])
    assert not tally.healthy(A) and not tally.healthy(B)
    assert tally.xid_counts == {(A, 48): 1, (B, 48): 1}


def test_lost_then_recovered_gpu_is_healthy_again_and_keeps_its_xid_count() -> None:
    tally = HealthTally()
    for event in (
        HealthEvent(HealthEventKind.XID, A, xid=79),
        HealthEvent(HealthEventKind.LOST, A),
    ):
        tally = tally_event(tally, event, [A, B])
    assert not tally.healthy(A) and tally.healthy(B)
    tally = tally_event(tally, HealthEvent(HealthEventKind.RECOVERED, A), [A, B])
    assert tally.healthy(A)
    assert tally.xid_counts == {(A, 79): 1}


def test_feed_watching_the_fake_backend_sees_injected_xids_and_tells_listeners() -> None:
    backend = FakeGpuBackend.from_spec("4xT4")
    uuids = [gpu.uuid for gpu in backend.snapshot().gpus]
    feed = HealthFeed()
    notified: list[int] = []
    feed.add_listener(lambda: notified.append(1))
    feed.watch(backend, uuids, poll_s=0.05)
    try:
        # A watcher sees only events after it is open; wait until all are.
        deadline = time.monotonic() + 20
        while any(s["watchers"] == 0 for s in backend.status()):
            assert time.monotonic() < deadline, "watchers never opened"
            time.sleep(0.01)
        backend.inject_xid(2, 79)
        while feed.tally().healthy(uuids[2]):
            assert time.monotonic() < deadline, "the Xid never arrived"
            time.sleep(0.01)
        assert feed.healthy_map() == {u: u != uuids[2] for u in uuids}
        assert feed.tally().xid_counts == {(uuids[2], 79): 1}
        assert notified
    finally:
        feed.close()
        backend.close()


def test_the_device_plugins_policy_decides_which_xids_are_critical() -> None:
    policy = HealthCheckPolicy(disabled_xids=frozenset({79}), enabled_xids=frozenset({13}))
    tally = tally_event(HealthTally(), HealthEvent(HealthEventKind.XID, A, xid=79), [A], policy)
    assert tally.healthy(A)  # disabled by the policy, still counted
    assert tally.xid_counts == {(A, 79): 1}
    tally = tally_event(tally, HealthEvent(HealthEventKind.XID, A, xid=13), [A], policy)
    assert not tally.healthy(A)  # an application Xid the admin made critical


def test_an_authoritative_verdict_overrides_the_fold() -> None:
    feed = HealthFeed([A, B])
    feed.record(HealthEvent(HealthEventKind.XID, A, xid=79))
    assert feed.healthy_map() == {A: False, B: True}
    feed.set_healthy(A, True)  # the agent's monitor saw it recover after healthy checks
    feed.set_healthy(B, False)
    assert feed.healthy_map() == {A: True, B: False}
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
