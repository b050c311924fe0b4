"""Health per MIG device (NVIDIA's device plugin after its fix for issue #1929): an Xid NVML
reports for one GPU instance marks the MIG devices it concerns, one on the whole card marks the
card (which every MIG device on it follows); restoring the card and quiet checks clear both."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.health import HealthCheckPolicy
from kubegpu.core.health_feed import HealthFeed
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.inventory.health import HealthMonitor
from kubegpu.testing.waiting import wait_until

WAIT_S = 10.0


@pytest.fixture
def backend() -> Iterator[FakeGpuBackend]:
    fake = FakeGpuBackend.from_spec("4xH100-80GB-MIG")
    yield fake
    fake.close()


@pytest.fixture
def record() -> HealthFeed:
    return HealthFeed()


def watch(
    backend: FakeGpuBackend, record: HealthFeed, policy: HealthCheckPolicy | None = None
) -> HealthMonitor:
    monitor = HealthMonitor(
        backend,
        backend.snapshot(),
        policy or HealthCheckPolicy(),
        record=record,
        poll_timeout_s=0.02,
    )
    monitor.start()
    return monitor


def wait_for(record: HealthFeed, unhealthy: set[str]) -> None:
    wait_until(
        lambda: set(record.unhealthy()) == unhealthy,
        timeout_s=WAIT_S,
        what=lambda: f"unhealthy {sorted(unhealthy)}, now {sorted(record.unhealthy())}",
    )


def test_an_xid_on_a_gpu_instance_marks_that_mig_device_only(
    backend: FakeGpuBackend, record: HealthFeed
) -> None:
    card = backend.snapshot().by_index(1)
    target = card.mig_devices[3]
    monitor = watch(backend, record)
    try:
        backend.inject_xid(1, 48, gpu_instance_id=target.gpu_instance_id)
        wait_for(record, {target.uuid})
        assert "MIG GPU instance" in record.unhealthy()[GpuUuid(target.uuid)]
        assert record.healthy(card.uuid)
    finally:
        monitor.stop()


def test_an_xid_on_the_whole_card_marks_the_card(
    backend: FakeGpuBackend, record: HealthFeed
) -> None:
    card = backend.snapshot().by_index(2)
    monitor = watch(backend, record)
    try:
        backend.inject_xid(2, 48)
        wait_for(record, {card.uuid})
    finally:
        monitor.stop()


def test_an_xid_on_an_instance_the_agent_does_not_know_marks_nothing(
    backend: FakeGpuBackend, record: HealthFeed, caplog: pytest.LogCaptureFixture
) -> None:
    monitor = watch(backend, record)
    # After the monitor's snapshot, as an admin would: 2g.20gb@4 and 1g.10gb@6 become three
    # 1g.10gb, the last a GPU instance the monitor never saw.
    backend.destroy_mig_device(0, 2)
    backend.destroy_mig_device(0, 3)
    for start in (4, 5, 6):
        backend.create_mig_device(0, "1g.10gb", start)
    unknown = max(m.gpu_instance_id for m in backend.snapshot().by_index(0).mig_devices)
    assert unknown == 4
    try:
        backend.inject_xid(0, 48, gpu_instance_id=unknown)
        wait_until(
            lambda: "names a MIG GPU instance the agent did not find" in caplog.text,
            timeout_s=WAIT_S,
            what="the warning",
        )
        assert record.unhealthy() == {}
    finally:
        monitor.stop()


def test_restoring_the_card_clears_its_mig_devices_too(
    backend: FakeGpuBackend, record: HealthFeed
) -> None:
    card = backend.snapshot().by_index(0)
    one, two = card.mig_devices[0], card.mig_devices[2]
    monitor = watch(backend, record)
    try:
        backend.inject_xid(0, 48, gpu_instance_id=one.gpu_instance_id)
        backend.inject_xid(0, 48, gpu_instance_id=two.gpu_instance_id)
        backend.inject_xid(0, 48)
        wait_for(record, {card.uuid, one.uuid, two.uuid})
        backend.restore(0)
        wait_for(record, set())
    finally:
        monitor.stop()


def test_quiet_checks_bring_a_mig_device_back_when_the_policy_allows(
    backend: FakeGpuBackend, record: HealthFeed
) -> None:
    target = backend.snapshot().by_index(1).mig_devices[0]
    monitor = watch(backend, record, HealthCheckPolicy(recover_after_healthy_checks=25))
    try:
        backend.inject_xid(1, 48, gpu_instance_id=target.gpu_instance_id)
        wait_until(
            lambda: GpuUuid(target.uuid) in record.unhealthy(),
            timeout_s=WAIT_S,
            what="the MIG device unhealthy",
        )
        wait_for(record, set())
    finally:
        monitor.stop()


def test_an_xid_needing_a_node_reboot_holds_the_mig_device_through_a_restore(
    backend: FakeGpuBackend, record: HealthFeed
) -> None:
    target = backend.snapshot().by_index(1).mig_devices[5]
    monitor = watch(backend, record)
    try:
        backend.inject_xid(1, 79, gpu_instance_id=target.gpu_instance_id)
        wait_for(record, {target.uuid})
        assert record.held_for_reboot(GpuUuid(target.uuid)) == 79
        backend.restore(1)
        backend.inject_xid(3, 48)  # something later to wait for
        wait_for(record, {target.uuid, backend.snapshot().by_index(3).uuid})
    finally:
        monitor.stop()
