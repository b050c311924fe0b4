"""What the node exporter says is really in use, read from its ``/metrics`` text.

Only the handful of series inspect shows are kept, keyed by GPU UUID (and namespace/pod for the
per-pod ones), so a report can join them with the allocation annotations. Pure: text in, frozen
values out; fetching lives in :mod:`kubegpu.inspect.exporters`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

GPU_MEMORY_USED = "kubegpu_gpu_memory_used_bytes"
GPU_UTILIZATION = "kubegpu_gpu_utilization_ratio"
POD_MEMORY_USED = "kubegpu_pod_gpu_memory_used_bytes"
POD_OVER_SHARE = "kubegpu_pod_gpu_over_share"
# Which card the kubelet gave each container (PodResources, through the exporter): places
# whole-GPU pods that have no extender decision.
POD_ALLOCATED = "kubegpu_pod_gpu_allocated"
# Which MIG device (by its MIG UUID) the kubelet gave each container.
POD_MIG_ALLOCATED = "kubegpu_pod_mig_device_allocated"
_MIB = 2**20

PodCardKey = tuple[str, str, str]  # namespace, pod, GPU uuid


@dataclass(frozen=True)
class NodeUsage:
    """One node's measured usage; a card or pod the exporter did not report is absent."""

    gpu_memory_used_mib: Mapping[str, int] = field(default_factory=dict)
    gpu_utilization_ratio: Mapping[str, float] = field(default_factory=dict)
    pod_memory_used_mib: Mapping[PodCardKey, int] = field(default_factory=dict)
    pod_over_share: Mapping[PodCardKey, bool] = field(default_factory=dict)
    # (namespace, pod) -> UUIDs of the cards the node's kubelet says the pod's containers hold
    pod_cards: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    # MIG UUID -> (namespace, pod) of the pods whose containers the kubelet gave it
    mig_pods: Mapping[str, frozenset[tuple[str, str]]] = field(default_factory=dict)


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


_WANTED = (
    GPU_MEMORY_USED,
    GPU_UTILIZATION,
    POD_MEMORY_USED,
    POD_OVER_SHARE,
    POD_ALLOCATED,
    POD_MIG_ALLOCATED,
)
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _labels(raw: str, line: str) -> dict[str, str]:
    # Lenient on purpose (findall skips what it cannot read): a label we do not use that is
    # malformed should not cost the whole node its usage column.
    pairs = _LABEL.findall(raw)
    if raw.strip() and not pairs:
        raise UsageParseError(f"not a Prometheus metrics page (bad labels in {line[:80]!r})")
    labels: dict[str, str] = {}
    for key, value in pairs:
        if "\\" in value:
            value = re.sub(r"\\.", lambda m: _ESCAPES.get(m.group(0), m.group(0)), value)
        labels[key] = value
    return labels


def parse_exporter_metrics(text: str) -> NodeUsage:
    """The series inspect needs from one exporter's ``/metrics`` page (Prometheus text
    exposition 0.0.4). Only lines of the six wanted metrics are parsed: a page from a node
    with many pods is mostly other series, and a full parse of every page of a large cluster
    would cost more than fetching them."""
    gpu_used: dict[str, int] = {}
    gpu_util: dict[str, float] = {}
    pod_used: dict[PodCardKey, int] = {}
    pod_over: dict[PodCardKey, bool] = {}
    pod_cards: dict[tuple[str, str], set[str]] = {}
    mig_pods: dict[str, set[tuple[str, str]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if not line.startswith(_WANTED):
            continue
        match = _SAMPLE.fullmatch(line)
        if match is None:
            raise UsageParseError(f"not a Prometheus metrics page (line {line[:80]!r})")
        name, raw_labels, raw_value = match.groups()
        if name not in _WANTED:
            continue  # a longer name sharing the prefix (e.g. ..._bytes_total)
        try:
            value = float(raw_value)
        except ValueError:
            raise UsageParseError(f"not a Prometheus metrics page (value {raw_value!r})") from None
        labels = _labels(raw_labels or "", line)
        uuid = labels.get("uuid")
        if not uuid or value != value:  # no card, or NaN: nothing to show
            continue
        if name == GPU_MEMORY_USED:
            gpu_used[uuid] = int(value) // _MIB
        elif name == GPU_UTILIZATION:
            gpu_util[uuid] = value
        elif name == POD_ALLOCATED:
            if value > 0:
                pod = (labels.get("namespace", ""), labels.get("pod", ""))
                pod_cards.setdefault(pod, set()).add(uuid)
        elif name == POD_MIG_ALLOCATED:
            mig_uuid = labels.get("mig_uuid")
            if value > 0 and mig_uuid:
                pod = (labels.get("namespace", ""), labels.get("pod", ""))
                mig_pods.setdefault(mig_uuid, set()).add(pod)
        else:
            key = (labels.get("namespace", ""), labels.get("pod", ""), uuid)
            if name == POD_MEMORY_USED:
                # Several containers of one pod on one card add up.
                pod_used[key] = pod_used.get(key, 0) + int(value) // _MIB
            else:
                pod_over[key] = pod_over.get(key, False) or value > 0
    return NodeUsage(
        gpu_used,
        gpu_util,
        pod_used,
        pod_over,
        {pod: frozenset(cards) for pod, cards in pod_cards.items()},
        {mig: frozenset(pods) for mig, pods in mig_pods.items()},
    )
