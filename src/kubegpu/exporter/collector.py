"""Prometheus samples from the latest exporter snapshot: conversion only, no reads.

``collect()`` touches nothing but in-memory values (the refresher's last snapshot and the
health tally), so a scrape takes the same short time whether NVML answers or hangs. Metric
names follow Prometheus conventions: base units (bytes, seconds, hertz, watts, ratios 0..1),
``_total`` on counters. Every per-GPU series carries ``node``, ``gpu`` (index), ``uuid`` and
``model``; per-pod series add ``namespace`` and ``pod`` (and ``container`` where known).
A value the driver did not report is left out, never exported as 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kubegpu.core.gpu import GpuDevice, GpuUuid, MigDevice
from kubegpu.core.metrics import HealthTally, PodKey, share_mismatches
from kubegpu.exporter.refresher import ExporterSnapshot

GPU_LABELS = ["node", "gpu", "uuid", "model"]
POD_LABELS = ["namespace", "pod", *GPU_LABELS]
CONTAINER_LABELS = ["namespace", "pod", "container", *GPU_LABELS]


class SnapshotSource(Protocol):
    started_at: float

    def latest(self) -> ExporterSnapshot | None: ...

    def failures(self) -> dict[str, int]: ...


class GpuCollector(Collector):
    def __init__(
        self,
        snapshots: SnapshotSource,
        health: Callable[[], HealthTally] = HealthTally,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.snapshots = snapshots
        self.health = health
        self.clock = clock

    def describe(self) -> list[GaugeMetricFamily]:
        # Registering must not trigger a collect (the registry would otherwise call collect()).
        return []

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snapshot = self.snapshots.latest()
        yield from self._exporter_metrics(snapshot)
        if snapshot is not None:
            yield from self._gpu_metrics(snapshot)
            yield from self._pod_metrics(snapshot)
            yield from _mig_metrics(snapshot)

    def _exporter_metrics(
        self, snapshot: ExporterSnapshot | None
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = self.clock()
        since = self.snapshots.started_at if snapshot is None else snapshot.taken_at
        age = GaugeMetricFamily(
            "kubegpu_exporter_snapshot_age_seconds",
            "Seconds since the served GPU snapshot was read (since start when none was yet); "
            "rises while NVML hangs.",
        )
        age.add_metric([], max(0.0, now - since))
        yield age
        if snapshot is not None:
            last = GaugeMetricFamily(
                "kubegpu_exporter_last_refresh_timestamp_seconds",
                "Unix time of the last complete refresh.",
            )
            last.add_metric([], snapshot.taken_at)
            yield last
            duration = GaugeMetricFamily(
                "kubegpu_exporter_refresh_duration_seconds",
                "How long the last complete refresh took.",
            )
            duration.add_metric([], snapshot.duration_seconds)
            yield duration
        failures = CounterMetricFamily(
            "kubegpu_exporter_refresh_failures",
            "Refreshes (or parts of one) that failed, by stage.",
            labels=["stage"],
        )
        for stage, count in sorted(self.snapshots.failures().items()):
            failures.add_metric([stage], count)
        yield failures

    def _gpu_metrics(
        self, snapshot: ExporterSnapshot
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gpus = {gpu.uuid: gpu for gpu in snapshot.inventory.gpus}

        def labels(uuid: GpuUuid) -> list[str]:
            return _gpu_labels(snapshot.node, gpus[uuid])

        def gauge(
            name: str, doc: str, read: Callable[[GpuUuid], float | None]
        ) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=GPU_LABELS)
            for uuid in gpus:
                value = read(uuid)
                if value is not None and not math.isnan(value):
                    family.add_metric(labels(uuid), value)
            return family

        m = snapshot.metrics

        def field(name: str) -> Callable[[GpuUuid], float | None]:
            return lambda uuid: getattr(m[uuid], name) if uuid in m else None

        info = GaugeMetricFamily(
            "kubegpu_gpu_info",
            "Static facts about each GPU (value always 1).",
            labels=[*GPU_LABELS, "pci_bus_id", "driver_version"],
        )
        for uuid, gpu in gpus.items():
            info.add_metric(
                [*labels(uuid), gpu.pci_bus_id, snapshot.inventory.driver_version or ""], 1
            )
        yield info
        yield gauge(
            "kubegpu_gpu_utilization_ratio",
            "Fraction of the last sample period a kernel was running (0..1).",
            field("utilization_ratio"),
        )
        yield gauge(
            "kubegpu_gpu_memory_used_bytes", "GPU memory in use.", field("memory_used_bytes")
        )
        yield gauge(
            "kubegpu_gpu_memory_total_bytes",
            "GPU memory in total.",
            lambda uuid: (
                m[uuid].memory_total_bytes
                if uuid in m and m[uuid].memory_total_bytes is not None
                else gpus[uuid].memory_total_mib * 1024 * 1024
            ),
        )
        yield gauge(
            "kubegpu_gpu_temperature_celsius", "GPU core temperature.", field("temperature_celsius")
        )
        yield gauge("kubegpu_gpu_power_watts", "Power draw.", field("power_watts"))
        yield gauge("kubegpu_gpu_sm_clock_hertz", "Current SM clock.", field("sm_clock_hertz"))
        yield gauge(
            "kubegpu_gpu_memory_clock_hertz",
            "Current memory clock.",
            field("memory_clock_hertz"),
        )
        yield gauge(
            "kubegpu_gpu_graphics_clock_hertz",
            "Current graphics clock.",
            field("graphics_clock_hertz"),
        )

        ecc = CounterMetricFamily(
            "kubegpu_gpu_ecc_errors",
            "ECC memory errors since the driver loaded (volatile counters), by type.",
            labels=[*GPU_LABELS, "type"],
        )
        for uuid in gpus:
            if uuid not in m:
                continue
            for kind, value in (
                ("corrected", m[uuid].ecc_corrected_total),
                ("uncorrected", m[uuid].ecc_uncorrected_total),
            ):
                if value is not None:
                    ecc.add_metric([*labels(uuid), kind], value)
        yield ecc

        tally = self.health()
        xid = CounterMetricFamily(
            "kubegpu_gpu_xid_errors",
            "Xid errors reported by the driver since the exporter started, by Xid code.",
            labels=[*GPU_LABELS, "xid"],
        )
        for (uuid, code), count in sorted(tally.xid_counts.items()):
            if uuid in gpus:
                xid.add_metric([*labels(uuid), str(code)], count)
        yield xid
        yield gauge(
            "kubegpu_gpu_healthy",
            "1 when the GPU is healthy, 0 after a critical Xid or when it was lost.",
            lambda uuid: 1.0 if tally.healthy(uuid) else 0.0,
        )

        alloc = snapshot.allocation
        yield gauge(
            "kubegpu_gpu_allocated_memory_bytes",
            "GPU memory granted to the node's pods (whole GPUs count fully; shared GPUs count "
            "each pod's share). Absent when a holder's share is unknown.",
            lambda uuid: alloc[uuid].memory_bytes if uuid in alloc else None,
        )
        yield gauge(
            "kubegpu_gpu_allocated_compute_ratio",
            "GPU compute granted to the node's pods (1 = the whole GPU).",
            lambda uuid: alloc[uuid].compute_ratio if uuid in alloc else None,
        )
        unattributed = snapshot.attribution.unattributed_bytes
        yield gauge(
            "kubegpu_gpu_unattributed_memory_used_bytes",
            "Memory used on the GPU by processes that belong to no known pod (host processes, "
            "out-of-band use).",
            lambda uuid: unattributed.get(uuid),
        )

    def _pod_metrics(self, snapshot: ExporterSnapshot) -> Iterator[GaugeMetricFamily]:
        gpus = {gpu.uuid: gpu for gpu in snapshot.inventory.gpus}

        def pod_labels(pod: PodKey, uuid: GpuUuid) -> list[str]:
            return [pod.namespace, pod.name, *_gpu_labels(snapshot.node, gpus[uuid])]

        allocated = GaugeMetricFamily(
            "kubegpu_pod_gpu_allocated",
            "Device IDs of the GPU the kubelet gave the container (1 for a whole GPU; the "
            "number of replicas when time-slicing).",
            labels=CONTAINER_LABELS,
        )
        for holder in snapshot.holders or ():
            allocated.add_metric(
                [
                    holder.pod.namespace,
                    holder.pod.name,
                    holder.container,
                    *_gpu_labels(snapshot.node, gpus[holder.uuid]),
                ],
                holder.slots,
            )
        yield allocated

        used = GaugeMetricFamily(
            "kubegpu_pod_gpu_memory_used_bytes",
            "GPU memory used by the pod's processes (NVML per-process accounting).",
            labels=POD_LABELS,
        )
        over = GaugeMetricFamily(
            "kubegpu_pod_gpu_over_share",
            "1 when the pod uses more GPU memory than its share, else 0 (only pods with a share).",
            labels=POD_LABELS,
        )
        for usage in snapshot.attribution.per_pod:
            if usage.uuid not in gpus:
                continue
            used.add_metric(pod_labels(usage.pod, usage.uuid), usage.memory_used_bytes)
            if usage.over_share is not None:
                over.add_metric(pod_labels(usage.pod, usage.uuid), 1.0 if usage.over_share else 0.0)
        yield used
        yield over

        share = GaugeMetricFamily(
            "kubegpu_pod_gpu_memory_share_bytes",
            "GPU memory the pod was granted on a shared GPU.",
            labels=POD_LABELS,
        )
        for pod, pod_shares in sorted(snapshot.shares.items()):
            for s in pod_shares:
                if s.uuid in gpus and s.memory_bytes is not None:
                    share.add_metric(pod_labels(pod, s.uuid), s.memory_bytes)
        yield share

        mismatch = GaugeMetricFamily(
            "kubegpu_pod_gpu_share_mismatch",
            "1 when the kubelet gave the pod share slots of this GPU but the extender's "
            "decision names no share of it for the pod, else 0 (only pods holding share slots).",
            labels=POD_LABELS,
        )
        if snapshot.holders is not None and snapshot.shares_known:
            for (pod, uuid), differs in share_mismatches(snapshot.holders, snapshot.shares).items():
                mismatch.add_metric(pod_labels(pod, uuid), 1.0 if differs else 0.0)
        yield mismatch


def _gpu_labels(node: str, gpu: GpuDevice) -> list[str]:
    return [node, str(gpu.index), gpu.uuid, gpu.product_name]


MIG_LABELS = [*GPU_LABELS, "mig_uuid", "profile"]


def _mig_metrics(snapshot: ExporterSnapshot) -> Iterator[GaugeMetricFamily]:
    """MIG devices under their parent card (the card's labels, then the device's own), and the
    pods holding them; nothing on a node without cards in MIG mode."""
    migs = snapshot.inventory.mig_devices
    if not migs:
        return
    cards = {gpu.uuid: gpu for gpu in snapshot.inventory.gpus}

    def labels(mig: MigDevice) -> list[str]:
        return [*_gpu_labels(snapshot.node, cards[mig.parent_uuid]), mig.uuid, mig.profile]

    info = GaugeMetricFamily(
        "kubegpu_mig_device_info",
        "Each MIG device of a card in MIG mode (value always 1): its GPU and compute instance "
        "and the first memory slice of its placement.",
        labels=[*MIG_LABELS, "gpu_instance_id", "compute_instance_id", "placement_start"],
    )
    memory = GaugeMetricFamily(
        "kubegpu_mig_device_memory_total_bytes",
        "Memory of each MIG device.",
        labels=MIG_LABELS,
    )
    for mig in migs:
        ids = [str(mig.gpu_instance_id), str(mig.compute_instance_id), str(mig.start)]
        info.add_metric([*labels(mig), *ids], 1)
        memory.add_metric(labels(mig), mig.memory_total_mib * 1024 * 1024)
    yield info
    yield memory
    if snapshot.mig_holders is None:
        return
    held = GaugeMetricFamily(
        "kubegpu_pod_mig_device_allocated",
        "1 for each MIG device a pod's container holds (from the kubelet's PodResources).",
        labels=["namespace", "pod", "container", *MIG_LABELS],
    )
    for holder in snapshot.mig_holders:
        pod = holder.pod
        held.add_metric([pod.namespace, pod.name, holder.container, *labels(holder.mig)], 1)
    yield held
