"""Sample values of the exporter's metrics for the scenario in ``conftest.py``.

Values are read with ``registry.get_sample_value`` (never by parsing text), and every expected
number is derived from the scenario's inputs.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kubegpu.core.health import HealthEvent, HealthEventKind
from kubegpu.core.metrics import PodGpuShare, PodKey
from kubegpu.exporter.collector import GpuCollector
from kubegpu.exporter.refresher import Refresher
from tests.exporter.conftest import GIB, INFER_A, INFER_B, JOB, MIB, TRAINER, Node


def registry_for(node: Node, refresher: Refresher) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(refresher, health=node.health.tally, clock=node.clock))
    return registry


def gpu_labels(node: Node, index: int) -> dict[str, str]:
    gpu = node.inventory.by_index(index)
    return {"node": "node-a", "gpu": str(index), "uuid": gpu.uuid, "model": gpu.product_name}


def pod_labels(node: Node, pod: PodKey, index: int) -> dict[str, str]:
    return {"namespace": pod.namespace, "pod": pod.name, **gpu_labels(node, index)}


def scraped(node: Node) -> CollectorRegistry:
    refresher = node.refresher()
    assert refresher.refresh_once()
    return registry_for(node, refresher)


def test_gpu_metrics_carry_the_readings_in_base_units(node: Node) -> None:
    registry = scraped(node)
    g0 = gpu_labels(node, 0)
    assert registry.get_sample_value("kubegpu_gpu_utilization_ratio", g0) == 0.75
    assert registry.get_sample_value("kubegpu_gpu_temperature_celsius", g0) == 61.0
    assert registry.get_sample_value("kubegpu_gpu_power_watts", g0) == 70.5
    assert registry.get_sample_value("kubegpu_gpu_memory_used_bytes", g0) == 6 * GIB
    assert (
        registry.get_sample_value("kubegpu_gpu_memory_total_bytes", g0)
        == node.inventory.by_index(0).memory_total_mib * MIB
    )
    assert registry.get_sample_value("kubegpu_gpu_sm_clock_hertz", g0) == 1.41e9
    assert registry.get_sample_value("kubegpu_gpu_memory_clock_hertz", g0) == 5.001e9
    assert registry.get_sample_value("kubegpu_gpu_graphics_clock_hertz", g0) == 1.59e9
    for kind in ("corrected", "uncorrected"):
        labels = {**g0, "type": kind}
        assert registry.get_sample_value("kubegpu_gpu_ecc_errors_total", labels) == 0
    assert registry.get_sample_value("kubegpu_gpu_healthy", g0) == 1


def test_unsupported_readings_are_absent_not_zero(node: Node) -> None:
    registry = scraped(node)
    g2 = gpu_labels(node, 2)
    assert registry.get_sample_value("kubegpu_gpu_sm_clock_hertz", g2) is None
    assert registry.get_sample_value("kubegpu_gpu_memory_clock_hertz", g2) is None
    assert registry.get_sample_value("kubegpu_gpu_graphics_clock_hertz", g2) == 1.41e9
    assert registry.get_sample_value("kubegpu_gpu_power_watts", g2) is None
    assert registry.get_sample_value("kubegpu_gpu_temperature_celsius", g2) == 35.0


def test_ecc_counters_follow_the_driver(node: Node) -> None:
    node.metrics.set(node.uuids[3], ecc_corrected_total=7, ecc_uncorrected_total=2)
    registry = scraped(node)
    g3 = gpu_labels(node, 3)
    assert (
        registry.get_sample_value("kubegpu_gpu_ecc_errors_total", {**g3, "type": "corrected"}) == 7
    )
    assert (
        registry.get_sample_value("kubegpu_gpu_ecc_errors_total", {**g3, "type": "uncorrected"})
        == 2
    )


def test_xids_are_counted_by_code_and_health_follows_the_judges_verdicts(node: Node) -> None:
    registry = scraped(node)
    uuid = node.uuids[2]
    node.health.count(HealthEvent(HealthEventKind.XID, uuid, xid=13))
    node.health.count(HealthEvent(HealthEventKind.XID, uuid, xid=13))
    g2 = gpu_labels(node, 2)
    assert registry.get_sample_value("kubegpu_gpu_xid_errors_total", {**g2, "xid": "13"}) == 2
    assert registry.get_sample_value("kubegpu_gpu_healthy", g2) == 1
    node.health.count(HealthEvent(HealthEventKind.XID, uuid, xid=79))
    node.health.set_healthy(uuid, False)  # the health monitor's verdict on Xid 79
    assert registry.get_sample_value("kubegpu_gpu_xid_errors_total", {**g2, "xid": "79"}) == 1
    assert registry.get_sample_value("kubegpu_gpu_healthy", g2) == 0
    assert registry.get_sample_value("kubegpu_gpu_healthy", gpu_labels(node, 1)) == 1
    node.health.set_healthy(uuid, True)
    assert registry.get_sample_value("kubegpu_gpu_healthy", g2) == 1


def test_each_container_is_reported_with_the_gpus_it_holds(node: Node) -> None:
    registry = scraped(node)
    name = "kubegpu_pod_gpu_allocated"
    trainer = {**pod_labels(node, TRAINER, 0), "container": "main"}
    assert registry.get_sample_value(name, trainer) == 1
    for pod in (INFER_A, INFER_B):
        assert (
            registry.get_sample_value(name, {**pod_labels(node, pod, 1), "container": "server"})
            == 1
        )
    assert registry.get_sample_value(name, {**pod_labels(node, JOB, 3), "container": "worker"}) == 1
    # Holders of GPU 1 are exactly the two inference pods.
    holders = [
        s
        for family in registry.collect()
        if family.name == name
        for s in family.samples
        if s.labels["gpu"] == "1"
    ]
    assert sorted(s.labels["pod"] for s in holders) == ["infer-a", "infer-b"]


def test_a_share_slot_without_the_extenders_decision_is_a_share_mismatch(node: Node) -> None:
    registry = scraped(node)
    name = "kubegpu_pod_gpu_share_mismatch"
    # batch/job holds a slot of GPU 3 and no share; web/infer-a's slot matches its share;
    # web/infer-b holds a time-slicing replica, which carries no decision to compare.
    assert registry.get_sample_value(name, pod_labels(node, JOB, 3)) == 1
    assert registry.get_sample_value(name, pod_labels(node, INFER_A, 1)) == 0
    assert registry.get_sample_value(name, pod_labels(node, INFER_B, 1)) is None
    node.shares.current[JOB] = [PodGpuShare(node.uuids[3], memory_bytes=GIB, compute_ratio=0.1)]
    assert registry_for(node, refreshed(node)).get_sample_value(name, pod_labels(node, JOB, 3)) == 0


def test_no_share_mismatch_is_reported_when_the_shares_are_unknown(node: Node) -> None:
    # Without a share lookup every slot would look undecided: nothing is said instead.
    registry = registry_for(node, refreshed(node, shares=None))
    family = next(f for f in registry.collect() if f.name == "kubegpu_pod_gpu_share_mismatch")
    assert family.samples == []


def refreshed(node: Node, **kwargs: object) -> Refresher:
    refresher = node.refresher(**kwargs)
    assert refresher.refresh_once()
    return refresher


def test_allocation_counts_whole_gpus_fully_and_shared_gpus_by_share(node: Node) -> None:
    registry = scraped(node)
    mem, compute = "kubegpu_gpu_allocated_memory_bytes", "kubegpu_gpu_allocated_compute_ratio"
    total0 = node.inventory.by_index(0).memory_total_mib * MIB
    assert registry.get_sample_value(mem, gpu_labels(node, 0)) == total0
    assert registry.get_sample_value(compute, gpu_labels(node, 0)) == 1.0
    assert registry.get_sample_value(mem, gpu_labels(node, 1)) == 8 * GIB
    assert registry.get_sample_value(compute, gpu_labels(node, 1)) == 0.75
    assert registry.get_sample_value(mem, gpu_labels(node, 2)) == 0
    # GPU 3's only holder has a replica but no share: the sum would be a guess, so it is absent.
    assert registry.get_sample_value(mem, gpu_labels(node, 3)) is None


def test_shared_gpu_reports_each_pods_memory_and_flags_the_one_over_its_share(
    node: Node,
) -> None:
    registry = scraped(node)
    used, over = "kubegpu_pod_gpu_memory_used_bytes", "kubegpu_pod_gpu_over_share"
    assert registry.get_sample_value(used, pod_labels(node, INFER_A, 1)) == 3 * GIB
    assert registry.get_sample_value(used, pod_labels(node, INFER_B, 1)) == 5 * GIB
    assert registry.get_sample_value(over, pod_labels(node, INFER_A, 1)) == 0
    assert registry.get_sample_value(over, pod_labels(node, INFER_B, 1)) == 1
    share = "kubegpu_pod_gpu_memory_share_bytes"
    assert registry.get_sample_value(share, pod_labels(node, INFER_B, 1)) == 4 * GIB
    # The whole-GPU pod has usage but no share, so no over-share verdict.
    assert registry.get_sample_value(used, pod_labels(node, TRAINER, 0)) == 6 * GIB
    assert registry.get_sample_value(over, pod_labels(node, TRAINER, 0)) is None
    # The host process is not pinned on any pod.
    unattributed = "kubegpu_gpu_unattributed_memory_used_bytes"
    assert registry.get_sample_value(unattributed, gpu_labels(node, 1)) == 512 * MIB
    assert registry.get_sample_value(unattributed, gpu_labels(node, 0)) == 0


def test_over_share_clears_when_the_pod_frees_memory(node: Node) -> None:
    refresher = node.refresher()
    registry = registry_for(node, refresher)
    assert refresher.refresh_once()
    labels = pod_labels(node, INFER_B, 1)
    assert registry.get_sample_value("kubegpu_pod_gpu_over_share", labels) == 1
    node.metrics.set_processes(node.uuids[1], {101: 3 * GIB, 201: 1 * GIB, 202: 2 * GIB})
    assert refresher.refresh_once()
    assert registry.get_sample_value("kubegpu_pod_gpu_memory_used_bytes", labels) == 3 * GIB
    assert registry.get_sample_value("kubegpu_pod_gpu_over_share", labels) == 0


def test_pod_metrics_are_absent_when_the_kubelet_cannot_be_read(node: Node) -> None:
    class Broken:
        def list_assignments(self) -> tuple[()]:
            raise ConnectionError("kubelet.sock: connection refused")

        def close(self) -> None:
            pass

    refresher = node.refresher(pod_resources=Broken())
    registry = registry_for(node, refresher)
    assert refresher.refresh_once()
    assert registry.get_sample_value("kubegpu_gpu_utilization_ratio", gpu_labels(node, 0)) == 0.75
    trainer = {**pod_labels(node, TRAINER, 0), "container": "main"}
    assert registry.get_sample_value("kubegpu_pod_gpu_allocated", trainer) is None
    assert (
        registry.get_sample_value("kubegpu_gpu_allocated_memory_bytes", gpu_labels(node, 0)) is None
    )
    assert (
        registry.get_sample_value(
            "kubegpu_exporter_refresh_failures_total", {"stage": "pod_resources"}
        )
        == 1
    )


def test_without_a_pod_directory_process_memory_counts_as_unattributed(node: Node) -> None:
    refresher = node.refresher(pod_directory=None)
    registry = registry_for(node, refresher)
    assert refresher.refresh_once()
    assert (
        registry.get_sample_value("kubegpu_gpu_unattributed_memory_used_bytes", gpu_labels(node, 1))
        == 8 * GIB + 512 * MIB
    )
    assert (
        registry.get_sample_value("kubegpu_pod_gpu_memory_used_bytes", pod_labels(node, INFER_B, 1))
        is None
    )


def test_an_idle_pod_with_a_share_reads_zero_use_and_not_over(node: Node) -> None:
    idle = PodKey("web", "idle")
    node.shares.current[idle] = [PodGpuShare(node.uuids[2], memory_bytes=2 * GIB)]
    registry = scraped(node)
    labels = pod_labels(node, idle, 2)
    assert registry.get_sample_value("kubegpu_pod_gpu_memory_used_bytes", labels) == 0
    assert registry.get_sample_value("kubegpu_pod_gpu_over_share", labels) == 0
    assert (
        registry.get_sample_value("kubegpu_gpu_allocated_memory_bytes", gpu_labels(node, 2))
        == 2 * GIB
    )
