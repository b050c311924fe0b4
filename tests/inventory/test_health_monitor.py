"""The health monitor over the fake backend: which events flip a GPU, and when it comes back."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator

import pytest

from kubegpu.core.backend import HealthWatcher
from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.core.health import (
    CATALOG_IGNORED_XIDS,
    HealthCheckPolicy,
    HealthEvent,
    HealthEventKind,
)
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.inventory.health import HealthMonitor, describe_ignored_xids, describe_reboot_xids
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.testing.waiting import wait_until

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


def xids(codes: set[int] | frozenset[int]) -> str:
    return f"Xids {sorted(codes)}"


IGNORED_CASES = [
    pytest.param({}, xids(CATALOG_IGNORED_XIDS), id="default: the catalog's passing Xids"),
    pytest.param(
        {"DP_ENABLE_HEALTHCHECKS": "13"},
        xids(CATALOG_IGNORED_XIDS - {13}),
        id="enable=13 takes 13 out of the ignored set",
    ),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "79", "DP_ENABLE_HEALTHCHECKS": "13,31"},
        xids((CATALOG_IGNORED_XIDS | {79}) - {13, 31}),
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
        {"DP_ENABLE_HEALTHCHECKS": ",".join(map(str, sorted(CATALOG_IGNORED_XIDS)))},
        "no Xid (every Xid is critical)",
        id="every passing Xid enabled",
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
    passed = {code for code in range(1, 400) if not policy.is_xid_critical(code)}
    listed = {int(n) for n in re.findall(r"\d+", described)}
    if described.startswith("every Xid except"):
        assert passed == set(range(1, 400)) - listed
    else:
        assert passed == listed


@pytest.mark.parametrize(
    ("policy", "text"),
    [
        pytest.param(
            HealthCheckPolicy(), "; Xids [54, 79, 151] wait for a node reboot", id="catalog"
        ),
        pytest.param(
            HealthCheckPolicy.from_nvidia_env({"DP_DISABLE_HEALTHCHECKS": "79"}),
            "; Xids [54, 151] wait for a node reboot",
            id="79 ignored: it waits for nothing",
        ),
        pytest.param(
            HealthCheckPolicy.from_nvidia_env({}, xid_policy="nvidia-device-plugin"),
            "",
            id="device plugin: none",
        ),
    ],
)
def test_the_xids_that_wait_for_a_reboot_are_described_as_the_policy_applies_them(
    policy: HealthCheckPolicy, text: str
) -> None:
    assert describe_reboot_xids(policy) == text


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
    assert (
        f"node n1: watching 4 GPUs; ignoring {xids(CATALOG_IGNORED_XIDS - {13})}; "
        "Xids [54, 79, 151] wait for a node reboot"
    ) in caplog.messages


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
        backend.inject_xid(0, 95)
        calls = recorder.wait_for(2)
        assert calls == [
            (uuid, False, "Xid 95 (uncontained ECC error)"),
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
        backend.inject_xid(1, 95)
        calls = recorder.wait_for(3)
    assert [(call[0], call[1]) for call in calls[:3]] == [
        (uuid, False),
        (backend.snapshot().gpus[1].uuid, False),
        (backend.snapshot().gpus[1].uuid, True),
    ]
    assert all(call[0] != uuid or not call[1] for call in recorder.calls)


# One Xid of each class of NVIDIA's catalog (docs/xid-policy.md), judged on the fake backend.


@pytest.mark.parametrize(
    "xid",
    [
        pytest.param(94, id="application: contained ECC error"),
        pytest.param(13, id="application: graphics engine exception"),
        pytest.param(63, id="no action: row remapping event"),
        pytest.param(45, id="no action: preemptive cleanup"),
    ],
)
def test_an_xid_that_needs_no_more_than_an_application_restart_keeps_the_gpu_healthy(
    backend: FakeGpuBackend, xid: int
) -> None:
    recorder = Recorder()
    uuid = backend.snapshot().gpus[1].uuid
    with monitor_for(backend, HealthCheckPolicy(), recorder):
        # The GPU's events are judged in order: the Xid 95 after it is the first verdict only
        # if the one before it changed nothing.
        backend.inject_xid(1, xid)
        backend.inject_xid(1, 95)
        assert recorder.wait_for(1) == [(uuid, False, "Xid 95 (uncontained ECC error)")]


@pytest.mark.parametrize(
    ("env", "xid"),
    [
        pytest.param({}, 95, id="gpu reset: uncontained ECC error"),
        pytest.param({}, 109, id="gpu reset: context switch timeout"),
        pytest.param({}, 48, id="gpu reset: double-bit ECC, by its workflow"),
        pytest.param({}, 4242, id="an Xid the catalog lacks: critical, as before"),
        pytest.param({"DP_ENABLE_HEALTHCHECKS": "94"}, 94, id="an application Xid made critical"),
    ],
)
def test_an_xid_that_needs_a_gpu_reset_holds_until_the_gpu_is_restored(
    backend: FakeGpuBackend, env: dict[str, str], xid: int
) -> None:
    recorder = Recorder()
    uuid = backend.snapshot().gpus[2].uuid
    with monitor_for(backend, HealthCheckPolicy.from_nvidia_env(env), recorder) as monitor:
        backend.inject_xid(2, xid)
        assert recorder.wait_for(1)[0][:2] == (uuid, False)
        backend.restore(2)  # the fake's reset: its watchers hear the GPU is back
        assert recorder.wait_for(2)[1] == (uuid, True, "GPU answers again: restored")
        assert monitor.health()[uuid] is True


def wait_for_log(caplog: pytest.LogCaptureFixture, text: str) -> None:
    wait_until(lambda: any(text in m for m in caplog.messages), timeout_s=WAIT_S, what=text)


@pytest.mark.parametrize(
    "xid",
    [
        pytest.param(79, id="RESTART_BM: fallen off the bus"),
        pytest.param(151, id="RESTART_VM: key rotation error"),
        pytest.param(54, id="CHECK_MECHANICALS: auxiliary power"),
    ],
)
def test_an_xid_that_needs_a_node_reboot_survives_restore_and_quiet_checks(
    backend: FakeGpuBackend, caplog: pytest.LogCaptureFixture, xid: int
) -> None:
    caplog.set_level(logging.INFO, logger="kubegpu.inventory.health")
    recorder = Recorder()
    gpus = backend.snapshot().gpus
    policy = HealthCheckPolicy(recover_after_healthy_checks=1)
    with monitor_for(backend, policy, recorder) as monitor:
        backend.inject_xid(0, xid)
        backend.lose(0)  # as NVML reports a GPU that fell off the bus
        assert recorder.wait_for(1)[0][:2] == (gpus[0].uuid, False)
        backend.restore(0)
        wait_for_log(caplog, f"GPU 0 ({gpus[0].uuid}) answers again but stays unhealthy")
        # Another GPU's reset-class Xid recovers after one quiet check; GPU 0 had many by then.
        backend.inject_xid(1, 95)
        calls = recorder.wait_for(3)
        assert monitor.health()[gpus[0].uuid] is False
    assert [call[:2] for call in calls] == [
        (gpus[0].uuid, False),
        (gpus[1].uuid, False),
        (gpus[1].uuid, True),
    ]
    assert all(call[0] != gpus[0].uuid or not call[1] for call in recorder.calls)
    assert "needs a node reboot" in caplog.text


def test_the_device_plugin_policy_lets_xid_79_recover_like_any_other(
    backend: FakeGpuBackend,
) -> None:
    recorder = Recorder()
    uuid = backend.snapshot().gpus[3].uuid
    policy = HealthCheckPolicy.from_nvidia_env({}, xid_policy="nvidia-device-plugin")
    with monitor_for(backend, policy, recorder):
        backend.inject_xid(3, 79)
        recorder.wait_for(1)
        backend.restore(3)
        assert recorder.wait_for(2)[1] == (uuid, True, "GPU answers again: restored")


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
