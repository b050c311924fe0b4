"""The health monitor over the fake backend: which events flip a GPU, and when it comes back."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.health import HealthCheckPolicy
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.inventory.health import HealthMonitor

WAIT_S = 10.0  # generous upper bound; the callbacks normally arrive within one poll


class Recorder:
    """Collects callbacks and lets a test wait for the n-th one."""

    def __init__(self) -> None:
        self.calls: list[tuple[GpuUuid, bool, str]] = []
        self._cond = threading.Condition()

    def __call__(self, uuid: GpuUuid, healthy: bool, reason: str) -> None:
        with self._cond:
            self.calls.append((uuid, healthy, reason))
            self._cond.notify_all()

    def wait_for(self, count: int) -> list[tuple[GpuUuid, bool, str]]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.calls) >= count, timeout=WAIT_S), self.calls
            return list(self.calls)


@pytest.fixture
def backend() -> Iterator[FakeGpuBackend]:
    fake = FakeGpuBackend.from_spec("4xT4")
    yield fake
    fake.close()


def monitor_for(
    backend: FakeGpuBackend, policy: HealthCheckPolicy, recorder: Recorder
) -> HealthMonitor:
    return HealthMonitor(backend, backend.snapshot(), policy, recorder, poll_timeout_s=0.02)


def test_xid_79_marks_the_gpu_unhealthy(backend: FakeGpuBackend) -> None:
    recorder = Recorder()
    uuid = backend.snapshot().gpus[2].uuid
    with monitor_for(backend, HealthCheckPolicy(), recorder) as monitor:
        backend.inject_xid(2, 79)
        assert recorder.wait_for(1) == [(uuid, False, "Xid 79 (GPU has fallen off the bus)")]
        assert monitor.health()[uuid] is False
        assert sum(monitor.health().values()) == 3


def test_application_xid_13_changes_nothing(backend: FakeGpuBackend) -> None:
    recorder = Recorder()
    with monitor_for(backend, HealthCheckPolicy(), recorder) as monitor:
        backend.inject_xid(0, 13)
        # A critical Xid on another GPU afterwards proves the 13 was processed and ignored:
        # the fake delivers in order and each GPU has its own thread, so wait on GPU 0 too.
        backend.inject_xid(0, 48)
        calls = recorder.wait_for(1)
        assert calls == [(backend.snapshot().gpus[0].uuid, False, "Xid 48 (double-bit ECC error)")]
        assert monitor.health()[backend.snapshot().gpus[0].uuid] is False


def test_xid_13_alone_leaves_every_gpu_healthy(backend: FakeGpuBackend) -> None:
    recorder = Recorder()
    with monitor_for(backend, HealthCheckPolicy(), recorder) as monitor:
        for index in range(4):
            backend.inject_xid(index, 13)
        # Wait until every watcher drained its queue: a later critical event on a sentinel GPU
        # is processed after the Xid 13 on that same GPU.
        backend.inject_xid(3, 94)
        recorder.wait_for(1)
        health = monitor.health()
    assert [health[gpu.uuid] for gpu in backend.snapshot()] == [True, True, True, False]
    assert len(recorder.calls) == 1


def test_a_lost_gpu_is_unhealthy_until_restored(backend: FakeGpuBackend) -> None:
    recorder = Recorder()
    uuid = backend.snapshot().gpus[1].uuid
    with monitor_for(backend, HealthCheckPolicy(), recorder) as monitor:
        backend.lose(1)
        assert recorder.wait_for(1)[0][:2] == (uuid, False)
        backend.restore(1)
        calls = recorder.wait_for(2)
        assert calls[1] == (uuid, True, "GPU answers again: restored")
        assert monitor.health()[uuid] is True


def test_disabled_policy_watches_nothing(backend: FakeGpuBackend) -> None:
    recorder = Recorder()
    policy = HealthCheckPolicy.from_nvidia_env({"DP_DISABLE_HEALTHCHECKS": "all"})
    with monitor_for(backend, policy, recorder) as monitor:
        backend.inject_xid(0, 79)
        backend.lose(1)
        assert all(status["watchers"] == 0 for status in backend.status())
        assert all(monitor.health().values())
    assert recorder.calls == []


def test_gpu_recovers_after_n_quiet_checks_when_the_policy_allows(
    backend: FakeGpuBackend,
) -> None:
    recorder = Recorder()
    uuid = backend.snapshot().gpus[0].uuid
    policy = HealthCheckPolicy(recover_after_healthy_checks=3)
    with monitor_for(backend, policy, recorder) as monitor:
        backend.inject_xid(0, 79)
        calls = recorder.wait_for(2)
        assert calls == [
            (uuid, False, "Xid 79 (GPU has fallen off the bus)"),
            (uuid, True, "no critical event in 3 consecutive health checks"),
        ]
        assert monitor.health()[uuid] is True


def test_a_lost_gpu_does_not_recover_from_quiet_checks(backend: FakeGpuBackend) -> None:
    recorder = Recorder()
    uuid = backend.snapshot().gpus[0].uuid
    policy = HealthCheckPolicy(recover_after_healthy_checks=1)
    with monitor_for(backend, policy, recorder):
        backend.lose(0)
        recorder.wait_for(1)
        # A second GPU's Xid recovers after one quiet check; by then GPU 0 has had many.
        backend.inject_xid(1, 79)
        calls = recorder.wait_for(3)
    assert [(call[0], call[1]) for call in calls[:3]] == [
        (uuid, False),
        (backend.snapshot().gpus[1].uuid, False),
        (backend.snapshot().gpus[1].uuid, True),
    ]
    assert all(call[0] != uuid or not call[1] for call in recorder.calls)


def test_a_failing_callback_does_not_stop_monitoring(backend: FakeGpuBackend) -> None:
    recorder = Recorder()
    failed = threading.Event()

    def flaky(uuid: GpuUuid, healthy: bool, reason: str) -> None:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("consumer bug")
        recorder(uuid, healthy, reason)

    gpus = backend.snapshot().gpus
    monitor = HealthMonitor(
        backend, backend.snapshot(), HealthCheckPolicy(), flaky, poll_timeout_s=0.02
    )
    monitor.start()
    try:
        backend.inject_xid(0, 79)
        assert failed.wait(WAIT_S)
        backend.inject_xid(1, 79)
        assert recorder.wait_for(1) == [
            (gpus[1].uuid, False, "Xid 79 (GPU has fallen off the bus)")
        ]
        # The state changed even though telling the consumer failed.
        assert monitor.health()[gpus[0].uuid] is False
    finally:
        monitor.stop()


def test_stop_closes_every_watcher(backend: FakeGpuBackend) -> None:
    monitor = monitor_for(backend, HealthCheckPolicy(), Recorder())
    monitor.start()
    assert [status["watchers"] for status in backend.status()] == [1, 1, 1, 1]
    monitor.stop()
    assert [status["watchers"] for status in backend.status()] == [0, 0, 0, 0]
