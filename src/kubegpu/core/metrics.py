"""Live GPU metrics and their attribution to pods, as pure values and pure functions.

The NVML reader and its fake (``kubegpu.inventory.nvml_metrics`` / ``fake_metrics``) produce
:class:`GpuMetrics`; the exporter edge gathers who holds which GPU (kubelet PodResources), which
process belongs to which pod (``/proc/<pid>/cgroup``) and each pod's share, and the functions
here combine them into per-GPU allocation and per-pod usage. Keeping the arithmetic here means
it is tested as plain tables, and the exporter only converts to Prometheus samples.

Units are in the names. Anything a driver cannot report is ``None`` (the metric is then absent),
never 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from kubegpu.core.gpu import GpuUuid, MigDevice, NodeInventory
from kubegpu.core.health import HealthEvent, HealthEventKind


@dataclass(frozen=True)
class ProcessGpuMemory:
    """One process running on a GPU, as NVML's running-compute-processes list reports it."""

    pid: int  # in the host's PID namespace (the exporter needs hostPID to see it in /proc)
    used_memory_bytes: int | None  # None: the driver would not say (e.g. no permission)


@dataclass(frozen=True)
class GpuMetrics:
    """One read of one GPU's live counters."""

    uuid: GpuUuid
    utilization_ratio: float | None = None  # 0..1, share of time a kernel was running
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    graphics_clock_hertz: float | None = None
    ecc_corrected_total: int | None = None  # volatile: since the driver loaded
    ecc_uncorrected_total: int | None = None
    processes: tuple[ProcessGpuMemory, ...] | None = None  # None: process list unavailable


class MetricsSource(Protocol):
    """Reads every GPU's live metrics once. NVML and the fake implement it. A call may block
    (NVML can hang on a wedged GPU); the exporter calls it off the scrape path."""

    def read_metrics(self) -> tuple[GpuMetrics, ...]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, order=True)
class PodKey:
    namespace: str
    name: str


@dataclass(frozen=True)
class DeviceAssignment:
    """One device ID the kubelet gave one container (a PodResources ``device_ids`` entry)."""

    pod: PodKey
    container: str
    resource_name: str
    device_id: str


@dataclass(frozen=True)
class PodGpuShare:
    """The part of one GPU a pod was granted on a shared GPU (from the pod's annotations)."""

    uuid: GpuUuid
    memory_bytes: int | None = None
    compute_ratio: float | None = None  # 0..1


@dataclass(frozen=True)
class ContainerGpu:
    """A container holds ``slots`` device IDs of one physical GPU (1 for a whole GPU; more when
    time-slicing replicas of the same GPU were handed out)."""

    pod: PodKey
    container: str
    uuid: GpuUuid
    slots: int
    exclusive: bool  # the device ID was the GPU itself, not a replica of it
    # The device IDs were kubegpu share slots (``<uuid>::slot-<n>``), which the kubelet hands
    # out only for a share the extender decided; time-slicing replicas carry no decision.
    share_slots: bool = False


# The device plugin's share-slot form (kubegpu.kubelet.resources: SLOT_MARK after "::"),
# repeated here because the core imports no edge; a test keeps the two equal.
SHARE_SLOT_INFIX = "::slot-"


def device_uuid(device_id: str, known: Iterable[GpuUuid]) -> GpuUuid | None:
    """The physical GPU behind a device-plugin device ID, or ``None`` if it is not one of ours.

    Replica IDs (``<uuid>::<n>``, NVIDIA's time-slicing form) name their GPU before ``::``.
    """
    base = device_id.split("::", 1)[0]
    return GpuUuid(base) if base in set(known) else None


@dataclass(frozen=True)
class ContainerMig:
    """A container holds a MIG device (under the device plugin's MIG strategies the kubelet's
    device ID is the MIG device's UUID, or a time-slicing replica of it)."""

    pod: PodKey
    container: str
    mig: MigDevice


def containers_by_mig(
    assignments: Iterable[DeviceAssignment], inventory: NodeInventory
) -> tuple[ContainerMig, ...]:
    """The MIG devices each container holds, once per (container, MIG device)."""
    by_uuid = {mig.uuid: mig for mig in inventory.mig_devices}
    held = {
        (a.pod, a.container, a.device_id.split("::", 1)[0])
        for a in assignments
        if a.device_id.split("::", 1)[0] in by_uuid
    }
    return tuple(
        ContainerMig(pod, container, by_uuid[uuid]) for pod, container, uuid in sorted(held)
    )


def containers_by_gpu(
    assignments: Iterable[DeviceAssignment], known: Iterable[GpuUuid]
) -> tuple[ContainerGpu, ...]:
    """Group PodResources entries by (container, physical GPU). The kubelet lists one entry per
    device ID, so a container with several replicas of one GPU shows up several times."""
    known_set = frozenset(known)
    ids: dict[tuple[PodKey, str, GpuUuid], list[str]] = {}
    for a in assignments:
        uuid = device_uuid(a.device_id, known_set)
        if uuid is None:
            continue
        ids.setdefault((a.pod, a.container, uuid), []).append(a.device_id)
    return tuple(
        ContainerGpu(
            pod=pod,
            container=container,
            uuid=uuid,
            slots=len(given),
            exclusive=all(i == uuid for i in given),
            share_slots=all(i.startswith(uuid + SHARE_SLOT_INFIX) for i in given),
        )
        for (pod, container, uuid), given in sorted(ids.items())
    )


@dataclass(frozen=True)
class GpuAllocation:
    """What the node's pods were granted on one GPU; ``None`` when some holder's grant is
    unknown (a replica without a share annotation), because a partial sum would mislead."""

    uuid: GpuUuid
    memory_bytes: int | None
    compute_ratio: float | None


def allocation_by_gpu(
    holders: Sequence[ContainerGpu],
    shares: Mapping[PodKey, Sequence[PodGpuShare]],
    memory_total_bytes: Mapping[GpuUuid, int],
) -> dict[GpuUuid, GpuAllocation]:
    """Per GPU: shared pods count their share, a pod holding the whole GPU counts all of it.

    A pod is counted once per GPU even when several of its containers hold it. Pods known only
    from share annotations (a sharing scheme whose device IDs do not name the GPU) count too.
    """
    pods_on: dict[GpuUuid, dict[PodKey, bool]] = {uuid: {} for uuid in memory_total_bytes}
    for h in holders:
        if h.uuid in pods_on:
            pods_on[h.uuid][h.pod] = pods_on[h.uuid].get(h.pod, True) and h.exclusive
    for pod, pod_shares in shares.items():
        for grant in pod_shares:
            if grant.uuid in pods_on:
                pods_on[grant.uuid].setdefault(pod, False)
    result: dict[GpuUuid, GpuAllocation] = {}
    for uuid, pods in pods_on.items():
        memory: int | None = 0
        compute: float | None = 0.0
        for pod, exclusive in pods.items():
            share = next((s for s in shares.get(pod, ()) if s.uuid == uuid), None)
            if share is not None:
                memory = (
                    None
                    if memory is None or share.memory_bytes is None
                    else (memory + share.memory_bytes)
                )
                compute = (
                    None
                    if compute is None or share.compute_ratio is None
                    else (compute + share.compute_ratio)
                )
            elif exclusive:
                memory = None if memory is None else memory + memory_total_bytes[uuid]
                compute = None if compute is None else compute + 1.0
            else:
                memory = compute = None
        result[uuid] = GpuAllocation(uuid=uuid, memory_bytes=memory, compute_ratio=compute)
    return result


def share_mismatches(
    holders: Iterable[ContainerGpu], shares: Mapping[PodKey, Sequence[PodGpuShare]]
) -> dict[tuple[PodKey, GpuUuid], bool]:
    """Per (pod, GPU) where the kubelet gave the pod share slots: ``True`` when the extender's
    decision (the pod's shares) names no share of that GPU for it.

    The kubelet and the extender then disagree about where the pod runs: its share is not
    counted on the card it really uses, so that card can be over-committed unseen. Only
    meaningful when the shares could be read at all (an empty mapping would flag every pod).
    """
    result: dict[tuple[PodKey, GpuUuid], bool] = {}
    for h in holders:
        if not h.share_slots:
            continue
        decided = any(s.uuid == h.uuid for s in shares.get(h.pod, ()))
        key = (h.pod, h.uuid)
        result[key] = result.get(key, False) or not decided
    return dict(sorted(result.items()))


@dataclass(frozen=True)
class PodGpuUsage:
    """Memory the processes of one pod use on one GPU, and whether that exceeds its share."""

    pod: PodKey
    uuid: GpuUuid
    memory_used_bytes: int
    share_memory_bytes: int | None

    @property
    def over_share(self) -> bool | None:
        if self.share_memory_bytes is None:
            return None
        return self.memory_used_bytes > self.share_memory_bytes


@dataclass(frozen=True)
class ProcessAttribution:
    per_pod: tuple[PodGpuUsage, ...]
    # Memory of processes no pod could be found for (host processes, pods unknown to us):
    # out-of-band GPU use that allocation accounting cannot see.
    unattributed_bytes: Mapping[GpuUuid, int] = field(default_factory=dict)


def attribute_processes(
    metrics: Sequence[GpuMetrics],
    pod_of_pid: Mapping[int, PodKey],
    shares: Mapping[PodKey, Sequence[PodGpuShare]],
    *,
    pods_resolvable: bool = True,
) -> ProcessAttribution:
    """Sum each GPU's per-process memory by pod. Processes with unknown memory are skipped;
    pods with a share on a GPU whose processes are listed get an entry even when idle, unless
    ``pods_resolvable`` is false (PIDs could not be mapped to pods, so "idle" would be a guess)."""
    used: dict[tuple[PodKey, GpuUuid], int] = {}
    unattributed: dict[GpuUuid, int] = {}
    for gpu in metrics:
        if gpu.processes is None:
            continue
        unattributed[gpu.uuid] = 0
        for proc in gpu.processes:
            if proc.used_memory_bytes is None:
                continue
            pod = pod_of_pid.get(proc.pid)
            if pod is None:
                unattributed[gpu.uuid] += proc.used_memory_bytes
            else:
                key = (pod, gpu.uuid)
                used[key] = used.get(key, 0) + proc.used_memory_bytes
    # A pod with a share on a GPU whose processes we can list, but with none running there,
    # uses 0 bytes: say so, so "over share" is 0 rather than absent for it.
    for pod, pod_shares in shares.items() if pods_resolvable else ():
        for grant in pod_shares:
            if grant.uuid in unattributed:
                used.setdefault((pod, grant.uuid), 0)
    per_pod = []
    for (pod, uuid), memory in sorted(used.items()):
        share = next((s for s in shares.get(pod, ()) if s.uuid == uuid), None)
        per_pod.append(
            PodGpuUsage(
                pod=pod,
                uuid=uuid,
                memory_used_bytes=memory,
                share_memory_bytes=share.memory_bytes if share else None,
            )
        )
    return ProcessAttribution(per_pod=tuple(per_pod), unattributed_bytes=unattributed)


@dataclass(frozen=True)
class HealthTally:
    """Health verdicts (from the one judge, the health monitor) and Xid counts per GPU."""

    unhealthy: frozenset[GpuUuid] = frozenset()
    xid_counts: Mapping[tuple[GpuUuid, int], int] = field(default_factory=dict)

    def healthy(self, uuid: GpuUuid) -> bool:
        return uuid not in self.unhealthy

    def with_health(self, uuid: GpuUuid, healthy: bool) -> HealthTally:
        """The verdict of an authoritative judge (the node agent's health monitor)."""
        unhealthy = self.unhealthy - {uuid} if healthy else self.unhealthy | {uuid}
        return replace(self, unhealthy=unhealthy)


def count_xid(tally: HealthTally, event: HealthEvent, all_gpus: Iterable[GpuUuid]) -> HealthTally:
    """Count an Xid event (on its GPU, or on every GPU when it names none) without judging
    health: for a consumer whose health verdicts come from elsewhere (the node agent's monitor).
    Any other event leaves the tally as it is."""
    if event.kind is not HealthEventKind.XID or event.xid is None:
        return tally
    targets = frozenset(all_gpus) if event.uuid is None else frozenset({event.uuid})
    counts = dict(tally.xid_counts)
    for uuid in targets:
        counts[(uuid, event.xid)] = counts.get((uuid, event.xid), 0) + 1
    return replace(tally, xid_counts=counts)
