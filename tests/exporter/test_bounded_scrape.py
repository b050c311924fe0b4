"""A scrape never waits for NVML: while the (fake) driver hangs, scrapes still answer from the
last snapshot and its age rises."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry

from kubegpu.exporter.collector import GpuCollector
from tests.exporter.conftest import Node

AGE = "kubegpu_exporter_snapshot_age_seconds"
FAILURES = "kubegpu_exporter_refresh_failures_total"


def test_scrape_returns_while_nvml_hangs_and_staleness_rises(node: Node) -> None:
    refresher = node.refresher(read_timeout_s=0.05)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(refresher, health=node.health.tally, clock=node.clock))
    assert refresher.refresh_once()
    taken_at = node.clock.now
    assert registry.get_sample_value(AGE) == 0

    node.metrics.hang()
    try:
        node.clock.now += 30
        assert not refresher.refresh_once()  # gave up waiting on NVML
        assert registry.get_sample_value(FAILURES, {"stage": "nvml_timeout"}) == 1

        node.clock.now += 30
        # The previous read is still stuck: no second read is piled on top of it.
        assert not refresher.refresh_once()
        assert registry.get_sample_value(FAILURES, {"stage": "nvml_busy"}) == 1

        # The scrape answers from the last snapshot, and says how old it is.
        assert registry.get_sample_value(AGE) == 60
        assert registry.get_sample_value("kubegpu_exporter_last_refresh_timestamp_seconds") == (
            taken_at
        )
        g0 = {"node": "node-a", "gpu": "0", "uuid": node.uuids[0], "model": "Tesla T4"}
        assert registry.get_sample_value("kubegpu_gpu_utilization_ratio", g0) == 0.75
    finally:
        node.metrics.release()

    # Once NVML answers again the next refresh publishes a fresh snapshot.
    reads = node.metrics.reads
    assert refresher.refresh_once()
    assert node.metrics.reads > reads
    assert registry.get_sample_value(AGE) == 0


def test_scrape_from_another_thread_completes_while_the_refresher_is_blocked(node: Node) -> None:
    refresher = node.refresher(read_timeout_s=30.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(refresher, health=node.health.tally, clock=node.clock))
    assert refresher.refresh_once()
    node.metrics.hang()
    blocked = threading.Thread(target=refresher.refresh_once, daemon=True)
    blocked.start()
    try:
        node.clock.now += 5
        # The refresher thread is waiting on NVML (and holds its refresh lock); collecting
        # must not need either.
        assert blocked.is_alive()
        assert registry.get_sample_value(AGE) == 5
    finally:
        node.metrics.release()
        blocked.join(10)
    assert not blocked.is_alive()
