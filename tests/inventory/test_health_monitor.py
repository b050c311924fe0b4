"""The health monitor over the fake backend: which events flip a GPU, and when it comes back."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator

import pytest

from kubegpu.core.backend import HealthWatcher
from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.core.health import HealthCheckPolicy, HealthEvent, HealthEventKind
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.inventory.health import HealthMonitor, describe_ignored_xids
from kubegpu.inventory.spec import resolve_fake_spec

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
    with monitor_for(backend, HealthCheckPolicy(), recorder):
        # Each GPU's events are handled in order by its own thread, so the Xid 79 that follows
        # proves the Xid 13 before it was seen: had 13 counted, the reason would name it.
        for index in range(4):
            backend.inject_xid(index, 13)
            backend.inject_xid(index, 79)
        calls = recorder.wait_for(4)
    assert sorted(calls) == sorted(
        (gpu.uuid, False, "Xid 79 (GPU has fallen off the bus)") for gpu in backend.snapshot()
    )


def test_an_xid_disabled_by_env_changes_nothing(backend: FakeGpuBackend) -> None:
    recorder = Recorder()
    policy = HealthCheckPolicy.from_nvidia_env({"DP_DISABLE_HEALTHCHECKS": "79"})
    uuid = backend.snapshot().gpus[0].uuid
    with monitor_for(backend, policy, recorder):
        backend.inject_xid(0, 79)
        backend.inject_xid(0, 48)
        assert recorder.wait_for(1) == [(uuid, False, "Xid 48 (double-bit ECC error)")]


IGNORED_CASES = [
    pytest.param({}, "Xids [13, 31, 43, 45, 68, 109]", id="default: the application Xids"),
    pytest.param(
        {"DP_ENABLE_HEALTHCHECKS": "13"},
        "Xids [31, 43, 45, 68, 109]",
        id="enable=13 takes 13 out of the ignored set",
    ),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "79", "DP_ENABLE_HEALTHCHECKS": "13,31"},
        "Xids [43, 45, 68, 79, 109]",
        id="disable adds, enable removes",
    ),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79,48"},
        "every Xid except [48, 79]",
        id="allow-list",
    ),
    pytest.param(
        {"DP_ENABLE_HEALTHCHECKS": "all"}, "no Xid (every Xid is critical)", id="enable=all"
    ),
    pytest.param(
        {"DP_ENABLE_HEALTHCHECKS": "13,31,43,45,68,109"},
        "no Xid (every Xid is critical)",
        id="every application Xid enabled",
    ),
]


@pytest.mark.parametrize(("env", "text"), IGNORED_CASES)
def test_the_ignored_xids_are_described_as_the_policy_applies_them(
    env: dict[str, str], text: str
) -> None:
    policy = HealthCheckPolicy.from_nvidia_env(env)
    described = describe_ignored_xids(policy)
    assert described == text
    # The description is the policy's own verdict, not the lists it was built from.
    passed = {code for code in range(1, 200) if not policy.is_xid_critical(code)}
    listed = {int(n) for n in re.findall(r"\d+", described)}
    if described.startswith("every Xid except"):
        assert passed == set(range(1, 200)) - listed
    else:
        assert passed == listed


def test_start_logs_the_effective_ignored_xids(
    backend: FakeGpuBackend, caplog: pytest.LogCaptureFixture
) -> None:
    policy = HealthCheckPolicy.from_nvidia_env({"DP_ENABLE_HEALTHCHECKS": "13"})
    caplog.set_level(logging.INFO, logger="kubegpu.inventory.health")
    monitor = HealthMonitor(
        backend, backend.snapshot(), policy, Recorder(), poll_timeout_s=0.02, node_name="n1"
    )
    with monitor:
        pass
    assert "node n1: watching 4 GPUs; ignoring Xids [31, 43, 45, 68, 109]" in caplog.messages


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


def test_every_event_read_is_passed_on_naming_its_gpu_judged_or_not(
    backend: FakeGpuBackend,
) -> None:
    recorder = Recorder()
    seen: list[HealthEvent] = []
    done = threading.Event()

    def on_event(event: HealthEvent) -> None:
        seen.append(event)
        if event.xid == 79:
            done.set()

    gpus = backend.snapshot().gpus
    monitor = HealthMonitor(
        backend, backend.snapshot(), HealthCheckPolicy(), recorder, poll_timeout_s=0.02,
        on_event=on_event,
    )  # fmt: skip
    with monitor:
        backend.inject_xid(1, 13)  # ignored by the policy, still passed on
        backend.inject_xid(1, 79)
        assert done.wait(WAIT_S)
    assert [(e.kind, e.uuid, e.xid) for e in seen] == [
        (HealthEventKind.XID, gpus[1].uuid, 13),
        (HealthEventKind.XID, gpus[1].uuid, 79),
    ]
    assert recorder.calls == [(gpus[1].uuid, False, "Xid 79 (GPU has fallen off the bus)")]


class NamelessXidBackend:
    """A backend whose watchers each report one Xid 48 naming no GPU (as a driver event about
    the whole node would arrive on every GPU's event set)."""

    name = "nameless"

    def __init__(self) -> None:
        self.inventory = resolve_fake_spec("4xT4").inventory

    def snapshot(self) -> NodeInventory:
        return self.inventory

    def watch_health(self, uuid: GpuUuid) -> HealthWatcher:
        pending = [HealthEvent(HealthEventKind.XID, None, xid=48)]
        closed = threading.Event()

        class Watcher:
            def wait(self, timeout_s: float) -> list[HealthEvent]:
                if pending:
                    return [pending.pop()]
                closed.wait(timeout_s)  # NVML's blocking wait, cut short by close
                return []

            def close(self) -> None:
                closed.set()

        return Watcher()

    def close(self) -> None:
        pass


def test_an_event_naming_no_gpu_is_passed_on_once_per_watcher_as_its_gpu() -> None:
    backend = NamelessXidBackend()
    events: list[HealthEvent] = []
    lock = threading.Lock()

    all_four = threading.Event()

    def on_event(event: HealthEvent) -> None:
        with lock:
            events.append(event)
            if len(events) >= 4:
                all_four.set()

    monitor = HealthMonitor(
        backend, backend.inventory, HealthCheckPolicy(), Recorder(), poll_timeout_s=0.02,
        on_event=on_event,
    )  # fmt: skip
    with monitor:
        assert all_four.wait(WAIT_S), events
    assert sorted((e.uuid, e.xid) for e in events) == sorted(
        (gpu.uuid, 48) for gpu in backend.inventory.gpus
    )
