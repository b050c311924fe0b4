"""The health feed is the one holder of GPU verdicts: the monitor judges into it, keeping no copy.

A copy in the monitor drifted from the record whenever the record outlived the monitor: the
node agent restarts its judge on a reload that changes the ``health`` block, and the new
monitor, starting from a copy that said "all healthy", never counted quiet checks for a GPU
the record still held unhealthy, so ``recoverAfterHealthyChecks`` turned on by that very reload
never brought it back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.health import HealthCheckPolicy
from kubegpu.core.health_feed import HealthFeed
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.roles.health import judge_health

WAIT_S = 10.0  # upper bound only; a verdict normally lands within a few health checks


@pytest.fixture
def backend() -> Iterator[FakeGpuBackend]:
    fake = FakeGpuBackend.from_spec("4xT4")
    yield fake
    fake.close()


class Flips:
    """Waits, on the test's thread, for the feed to hold a verdict."""

    def __init__(self, feed: HealthFeed) -> None:
        self.feed = feed
        self._cond = threading.Condition()
        feed.add_listener(self._heard)

    def _heard(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, verdict: tuple[GpuUuid, bool]) -> None:
        uuid, healthy = verdict
        with self._cond:
            held = self._cond.wait_for(
                lambda: (uuid not in self.feed.unhealthy()) == healthy, timeout=WAIT_S
            )
        assert held, f"{uuid} never judged {'healthy' if healthy else 'unhealthy'}"


def test_a_judge_restarted_on_the_same_record_recovers_what_the_last_one_judged(
    backend: FakeGpuBackend,
) -> None:
    inventory = backend.snapshot()
    uuid = inventory.gpus[1].uuid
    feed = HealthFeed(gpu.uuid for gpu in inventory.gpus)
    flips = Flips(feed)
    judge_health(feed, backend, inventory, poll_timeout_s=0.02)
    try:
        backend.inject_xid(1, 95)  # a GPU reset clears it: quiet checks may bring it back
        flips.wait_for((uuid, False))
    finally:
        feed.close()
    assert feed.unhealthy().keys() == {uuid}

    # The reload's new policy lets a GPU come back; the new judge reads the verdict it inherits.
    feed.policy = HealthCheckPolicy(recover_after_healthy_checks=2)
    judge_health(feed, backend, inventory, poll_timeout_s=0.02)
    try:
        flips.wait_for((uuid, True))
    finally:
        feed.close()
    assert feed.unhealthy() == {}


def test_a_verdict_flip_is_told_once_with_its_gpu_and_reason_until_unsubscribed() -> None:
    a, b = GpuUuid("GPU-a"), GpuUuid("GPU-b")
    feed = HealthFeed([a, b])
    heard: list[tuple[GpuUuid, bool, str]] = []
    unsubscribe = feed.subscribe(lambda uuid, healthy, why: heard.append((uuid, healthy, why)))
    assert feed.set_healthy(a, False, "Xid 79")
    assert not feed.set_healthy(a, False, "Xid 48")  # no flip: not told again
    unsubscribe()
    assert feed.set_healthy(a, True, "recovered")
    assert heard == [(a, False, "Xid 79")]
    assert feed.healthy(a) and feed.healthy(b)


def test_a_gpu_held_for_a_node_reboot_stays_held_by_a_restarted_judge_while_the_policy_says_so(
    backend: FakeGpuBackend,
) -> None:
    inventory = backend.snapshot()
    uuid = inventory.gpus[2].uuid
    feed = HealthFeed(gpu.uuid for gpu in inventory.gpus)
    flips = Flips(feed)
    judge_health(feed, backend, inventory, poll_timeout_s=0.02)
    try:
        backend.inject_xid(2, 79)
        flips.wait_for((uuid, False))
    finally:
        feed.close()
    assert feed.held_for_reboot(uuid) == 79

    # A reload that turns quiet-check recovery on: the record, not the old judge, knew why.
    feed.policy = HealthCheckPolicy(recover_after_healthy_checks=1)
    judge_health(feed, backend, inventory, poll_timeout_s=0.02)
    try:
        backend.inject_xid(3, 95)  # GPU 3 recovers after one quiet check; GPU 2 had many
        flips.wait_for((inventory.gpus[3].uuid, False))
        flips.wait_for((inventory.gpus[3].uuid, True))
        assert feed.unhealthy().keys() == {uuid}
    finally:
        feed.close()

    # A reload to NVIDIA's device plugin's rule, which holds no Xid for a reboot, lets it go.
    feed.policy = HealthCheckPolicy.from_nvidia_env(
        {}, recover_after_healthy_checks=1, xid_policy="nvidia-device-plugin"
    )
    judge_health(feed, backend, inventory, poll_timeout_s=0.02)
    try:
        flips.wait_for((uuid, True))
    finally:
        feed.close()
    assert feed.held_for_reboot(uuid) is None
