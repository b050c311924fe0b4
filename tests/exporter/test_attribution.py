"""The pure arithmetic behind the pod metrics (``kubegpu.core.metrics``), as tables."""

from __future__ import annotations

import pytest

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.metrics import (
    SHARE_SLOT_INFIX,
    ContainerGpu,
    DeviceAssignment,
    GpuMetrics,
    PodGpuShare,
    PodKey,
    ProcessGpuMemory,
    allocation_by_gpu,
    attribute_processes,
    containers_by_gpu,
    device_uuid,
    share_mismatches,
)
from kubegpu.kubelet.resources import REPLICA_SEPARATOR, SLOT_MARK

A, B = GpuUuid("GPU-aaaa"), GpuUuid("GPU-bbbb")
P, Q, R = PodKey("ns", "p"), PodKey("ns", "q"), PodKey("ns", "r")
TOTAL = {A: 16_000, B: 16_000}


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [("GPU-aaaa", A), ("GPU-aaaa::3", A), ("GPU-cccc", None), ("MIG-1g.10gb", None), ("", None)],
)
def test_device_ids_resolve_to_their_physical_gpu(device_id: str, expected: GpuUuid | None) -> None:
    assert device_uuid(device_id, [A, B]) == expected


def test_replicas_of_one_gpu_in_one_container_count_as_slots() -> None:
    r = "kubegpu.io/gpu"
    holders = containers_by_gpu(
        [
            DeviceAssignment(P, "c", r, "GPU-aaaa::0"),
            DeviceAssignment(P, "c", r, "GPU-aaaa::1"),
            DeviceAssignment(P, "c", r, "GPU-bbbb"),
            DeviceAssignment(P, "d", r, "GPU-unknown"),
        ],
        [A, B],
    )
    assert holders == (
        ContainerGpu(P, "c", A, slots=2, exclusive=False),
        ContainerGpu(P, "c", B, slots=1, exclusive=True),
    )


def test_share_slots_are_told_from_replicas_by_the_device_plugins_slot_form() -> None:
    assert REPLICA_SEPARATOR + SLOT_MARK == SHARE_SLOT_INFIX
    r = "kubegpu.io/gpu-shared"
    holders = containers_by_gpu(
        [
            DeviceAssignment(P, "c", r, "GPU-aaaa::slot-0"),
            DeviceAssignment(P, "c", r, "GPU-aaaa::slot-7"),
            DeviceAssignment(Q, "c", r, "GPU-aaaa::3"),
            DeviceAssignment(R, "c", r, "GPU-bbbb"),
        ],
        [A, B],
    )
    assert [(h.pod, h.slots, h.share_slots) for h in holders] == [
        (P, 2, True),
        (Q, 1, False),
        (R, 1, False),
    ]


def slot(pod: PodKey, uuid: GpuUuid, container: str = "c") -> ContainerGpu:
    return ContainerGpu(pod, container, uuid, 1, False, share_slots=True)


@pytest.mark.parametrize(
    ("holders", "shares", "expected"),
    [
        pytest.param([slot(P, A)], {P: [PodGpuShare(A, 4000, 0.25)]}, {(P, A): False}, id="agree"),
        pytest.param([slot(P, A)], {}, {(P, A): True}, id="slot-without-decision"),
        pytest.param(
            [slot(P, A)], {P: [PodGpuShare(B, 4000, 0.25)]}, {(P, A): True}, id="decided-other"
        ),
        pytest.param(
            [slot(P, A), slot(P, A, "d")],
            {P: [PodGpuShare(A, 4000, 0.25)]},
            {(P, A): False},
            id="two-containers-one-entry",
        ),
        pytest.param(
            [ContainerGpu(P, "c", A, 1, False), ContainerGpu(Q, "c", B, 1, True)],
            {},
            {},
            id="replicas-and-whole-gpus-carry-no-decision-to-compare",
        ),
    ],
)
def test_share_mismatch_per_pod_and_gpu(
    holders: list[ContainerGpu],
    shares: dict[PodKey, list[PodGpuShare]],
    expected: dict[tuple[PodKey, GpuUuid], bool],
) -> None:
    assert share_mismatches(holders, shares) == expected


@pytest.mark.parametrize(
    ("holders", "shares", "memory_a", "compute_a"),
    [
        pytest.param([], {}, 0, 0.0, id="idle"),
        pytest.param([ContainerGpu(P, "c", A, 1, True)], {}, 16_000, 1.0, id="whole-gpu"),
        pytest.param(
            [ContainerGpu(P, "c", A, 1, True), ContainerGpu(P, "d", A, 1, True)],
            {},
            16_000,
            1.0,
            id="two-containers-of-one-pod-count-once",
        ),
        pytest.param(
            [ContainerGpu(P, "c", A, 1, False), ContainerGpu(Q, "c", A, 1, False)],
            {P: [PodGpuShare(A, 4000, 0.25)], Q: [PodGpuShare(A, 6000, 0.5)]},
            10_000,
            0.75,
            id="shares-add-up",
        ),
        pytest.param(
            [],
            {P: [PodGpuShare(A, 4000, 0.25)]},
            4000,
            0.25,
            id="share-without-a-kubelet-entry-still-counts",
        ),
        pytest.param(
            [ContainerGpu(P, "c", A, 1, False)],
            {},
            None,
            None,
            id="replica-without-share",
        ),
        pytest.param(
            [ContainerGpu(P, "c", A, 1, False)],
            {P: [PodGpuShare(A, 4000, None)]},
            4000,
            None,
            id="share-without-compute",
        ),
    ],
)
def test_allocation_per_gpu(
    holders: list[ContainerGpu],
    shares: dict[PodKey, list[PodGpuShare]],
    memory_a: int | None,
    compute_a: float | None,
) -> None:
    allocation = allocation_by_gpu(holders, shares, TOTAL)
    assert (allocation[A].memory_bytes, allocation[A].compute_ratio) == (memory_a, compute_a)
    assert (allocation[B].memory_bytes, allocation[B].compute_ratio) == (0, 0.0)


def test_processes_are_summed_per_pod_and_unknown_memory_is_skipped() -> None:
    metrics = [
        GpuMetrics(
            A,
            processes=(
                ProcessGpuMemory(1, 100),
                ProcessGpuMemory(2, 50),
                ProcessGpuMemory(3, None),
                ProcessGpuMemory(4, 7),
            ),
        ),
        GpuMetrics(B, processes=None),
    ]
    shares = {P: [PodGpuShare(A, 120)], Q: [PodGpuShare(B, 10)], R: [PodGpuShare(A, 10)]}
    result = attribute_processes(metrics, {1: P, 2: P, 3: Q}, shares)
    assert [(u.pod, u.uuid, u.memory_used_bytes, u.over_share) for u in result.per_pod] == [
        (P, A, 150, True),
        (R, A, 0, False),  # idle pod with a share: not over it
    ]
    assert result.unattributed_bytes == {A: 7}  # B cannot list processes: no claim about it
