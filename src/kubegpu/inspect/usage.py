"""What the node exporter says is really in use, read from its ``/metrics`` text.

Only the handful of series inspect shows are kept, keyed by GPU UUID (and namespace/pod for the
per-pod ones), so a report can join them with the allocation annotations. Pure: text in, frozen
values out; fetching lives in :mod:`kubegpu.inspect.exporters`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

GPU_MEMORY_USED = "kubegpu_gpu_memory_used_bytes"
GPU_UTILIZATION = "kubegpu_gpu_utilization_ratio"
POD_MEMORY_USED = "kubegpu_pod_gpu_memory_used_bytes"
POD_OVER_SHARE = "kubegpu_pod_gpu_over_share"
_MIB = 2**20

PodCardKey = tuple[str, str, str]  # namespace, pod, GPU uuid


@dataclass(frozen=True)
class NodeUsage:
    """One node's measured usage; a card or pod the exporter did not report is absent."""

    gpu_memory_used_mib: Mapping[str, int] = field(default_factory=dict)
    gpu_utilization_ratio: Mapping[str, float] = field(default_factory=dict)
    pod_memory_used_mib: Mapping[PodCardKey, int] = field(default_factory=dict)
    pod_over_share: Mapping[PodCardKey, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class UsageResult:
    """The outcome of asking one node's exporter: ``usage`` or, when it is ``None``, ``error``
    (unreachable, timed out, not a metrics page...)."""

    node: str
    url: str
    usage: NodeUsage | None = None
    error: str = ""


class UsageParseError(ValueError):
    """The page is not Prometheus text exposition."""


def parse_exporter_metrics(text: str) -> NodeUsage:
    """The series inspect needs from one exporter's ``/metrics`` page."""
    gpu_used: dict[str, int] = {}
    gpu_util: dict[str, float] = {}
    pod_used: dict[PodCardKey, int] = {}
    pod_over: dict[PodCardKey, bool] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise UsageParseError(f"not a Prometheus metrics page ({exc})") from None
    for family in families:
        for sample in family.samples:
            labels = sample.labels
            uuid = labels.get("uuid")
            if not uuid or sample.value != sample.value:  # NaN: nothing to show
                continue
            if sample.name == GPU_MEMORY_USED:
                gpu_used[uuid] = int(sample.value) // _MIB
            elif sample.name == GPU_UTILIZATION:
                gpu_util[uuid] = float(sample.value)
            elif sample.name in (POD_MEMORY_USED, POD_OVER_SHARE):
                key = (labels.get("namespace", ""), labels.get("pod", ""), uuid)
                if sample.name == POD_MEMORY_USED:
                    # Several containers of one pod on one card add up.
                    pod_used[key] = pod_used.get(key, 0) + int(sample.value) // _MIB
                else:
                    pod_over[key] = pod_over.get(key, False) or sample.value > 0
    return NodeUsage(gpu_used, gpu_util, pod_used, pod_over)
