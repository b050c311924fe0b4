"""Inspect reads what the real exporter serves: its collector's text page, parsed by
:func:`parse_exporter_metrics`, gives the values the exporter's own tests assert (the scenario
of ``tests/exporter/conftest.py``: a 4xT4 node, two pods sharing GPU 1, one over its share)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from kubegpu.exporter.collector import GpuCollector
from kubegpu.inspect.usage import parse_exporter_metrics
from tests.exporter.conftest import GIB, INFER_A, INFER_B, MIB, TRAINER, Node, node

__all__ = ["node"]  # the exporter scenario's fixture, used below


def test_the_exporters_page_yields_card_and_pod_usage(node: Node) -> None:
    refresher = node.refresher()
    assert refresher.refresh_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(refresher, health=node.health.tally, clock=node.clock))
    usage = parse_exporter_metrics(generate_latest(registry).decode())
    gpu0, gpu1 = str(node.uuids[0]), str(node.uuids[1])
    assert usage.gpu_memory_used_mib[gpu0] == 6 * GIB // MIB
    assert usage.gpu_utilization_ratio[gpu0] == 0.75
    assert usage.pod_memory_used_mib[(INFER_A.namespace, INFER_A.name, gpu1)] == 3 * GIB // MIB
    assert usage.pod_memory_used_mib[(INFER_B.namespace, INFER_B.name, gpu1)] == 5 * GIB // MIB
    assert usage.pod_over_share[(INFER_B.namespace, INFER_B.name, gpu1)] is True
    assert usage.pod_over_share[(INFER_A.namespace, INFER_A.name, gpu1)] is False
    # A whole-GPU pod has usage but no share verdict.
    assert (TRAINER.namespace, TRAINER.name, gpu0) not in usage.pod_over_share
    # Which cards the kubelet gave each pod (PodResources): what places pods with no decision.
    assert usage.pod_cards[(TRAINER.namespace, TRAINER.name)] == {gpu0}
    assert usage.pod_cards[(INFER_B.namespace, INFER_B.name)] == {gpu1}
