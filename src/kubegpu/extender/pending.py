"""Pods waiting for a GPU, as the extender's cluster view sees them: the metric
``kubegpu_extender_pending_gpu_pods``.

Why the extender: it is the one role that already watches every pod of the cluster, and a GPU
pod that waits while cards sit idle (shares scattered over cards so that none fits, or a rule
that keeps pods off the free cards) is the signal admins act on. The node exporter sees only
its own node. Counting is pure (:func:`waiting_for`); the collector only reads the view.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kubegpu.sharing.claim import read_claim
from kubegpu.sharing.podstate import TERMINAL_PHASES
from kubegpu.sharing.resources import ResourceNames

WHOLE = "whole"
SHARED = "shared"


def waiting_for(pod: Mapping[str, Any], names: ResourceNames) -> str | None:
    """``"whole"`` or ``"shared"`` when the pod is not yet bound to a node (and not finished or
    being deleted) and asks for whole GPUs or a GPU share; ``None`` otherwise. A pod whose
    requests cannot be read is not counted: the extender refuses it with its reason instead."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping) or spec.get("nodeName"):
        return None
    meta = pod.get("metadata")
    if isinstance(meta, Mapping) and meta.get("deletionTimestamp"):
        return None
    status = pod.get("status")
    if isinstance(status, Mapping) and status.get("phase") in TERMINAL_PHASES:
        return None
    totals = read_claim(pod, names).totals
    if totals is None:
        return None
    if totals.whole_gpus:
        return WHOLE
    if totals.compute_milli or totals.gpu_memory_mib or totals.share_slots:
        return SHARED
    return None


def count_waiting(pods: Iterable[Mapping[str, Any]], names: ResourceNames) -> dict[str, int]:
    counts = {WHOLE: 0, SHARED: 0}
    for pod in pods:
        kind = waiting_for(pod, names)
        if kind is not None:
            counts[kind] += 1
    return counts


class PendingGpuPods(Collector):
    """Samples only once the view has listed the pods: before that a 0 would be a guess."""

    def __init__(
        self,
        pods: Callable[[], Iterable[Mapping[str, Any]]],
        names: ResourceNames,
        synced: Callable[[], bool],
    ) -> None:
        self.pods = pods
        self.names = names
        self.synced = synced

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # registering must not read the view

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "kubegpu_extender_pending_gpu_pods",
            "Pods not yet bound to a node that ask for whole GPUs or a GPU share, by kind.",
            labels=["kind"],
        )
        if self.synced():
            for kind, count in sorted(count_waiting(self.pods(), self.names).items()):
                family.add_metric([kind], count)
        yield family
