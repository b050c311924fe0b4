"""Whole GPUs through the real default kube-scheduler and kubelet: each container sees exactly
the devices the kubelet says it handed over, and a 9th GPU pod waits with the scheduler's
reason."""

from __future__ import annotations

import pytest
from kubegpu_e2e.cluster import Cluster
from kubegpu_e2e.kubegpu import KubegpuRoles
from kubegpu_e2e.workloads import (
    WHOLE,
    container,
    container_env,
    create,
    pending_reason,
    phase,
    pod,
    pod_resources,
    wait_running,
)

pytestmark = pytest.mark.e2e


def _devices_of(cluster: Cluster, namespace: str, name: str) -> tuple[list[str], list[str]]:
    """(what PodResources says the container holds, what its NVIDIA_VISIBLE_DEVICES says)."""
    held = [
        d
        for entry in pod_resources(cluster.pod_resources_socket)
        if (entry.namespace, entry.pod, entry.container, entry.resource)
        == (namespace, name, "main", WHOLE)
        for d in entry.device_ids
    ]
    env = container_env(cluster, namespace, name, "main")
    visible = [d for d in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if d]
    return sorted(held), sorted(visible)


def test_whole_gpu_pods_see_exactly_their_devices(
    cluster: Cluster, roles: KubegpuRoles, namespace: str
) -> None:
    create(
        cluster,
        pod("one", namespace, [container("main", {WHOLE: "1"})]),
        pod("two", namespace, [container("main", {WHOLE: "2"})]),
    )
    wait_running(cluster, namespace, "one", "two")
    seen: set[str] = set()
    for name, count in (("one", 1), ("two", 2)):
        held, visible = _devices_of(cluster, namespace, name)
        assert len(held) == count, (name, held)
        assert visible == held, (name, visible, held)
        assert not seen & set(held), "two pods were handed the same GPU"
        seen |= set(held)

    cluster.kubectl("delete", "pod", "-n", namespace, "one", "two", "--wait=true")
    create(cluster, pod("eight", namespace, [container("main", {WHOLE: "8"})]))
    wait_running(cluster, namespace, "eight")
    held, visible = _devices_of(cluster, namespace, "eight")
    assert len(set(held)) == 8
    assert visible == held

    create(cluster, pod("ninth", namespace, [container("main", {WHOLE: "1"})]))
    reason = cluster.wait_for(
        "the 9th GPU pod to be refused by kube-scheduler",
        lambda: pending_reason(cluster, namespace, "ninth"),
        timeout=60,
    )
    assert f"Insufficient {WHOLE}" in reason, reason
    assert phase(cluster, namespace, "ninth") == "Pending"
