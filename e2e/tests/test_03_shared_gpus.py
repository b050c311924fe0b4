"""Shared GPUs through the real kube-scheduler, our extender and the real kubelet: single- and
multi-container pods and a pod with an init container run on the card the extender decided,
each container is told its share, no card is over-committed by what the kubelet and the
containers themselves report, and a pod that fits nowhere waits with the extender's reason."""

from __future__ import annotations

import json

import pytest
from kubegpu_e2e.cluster import Cluster
from kubegpu_e2e.kubegpu import KubegpuRoles
from kubegpu_e2e.workloads import (
    CARD_COMPUTE_MILLI,
    CARD_MEMORY_MIB,
    SCHEDULER,
    SHARED,
    card_totals,
    container,
    container_env,
    create,
    pending_reason,
    phase,
    pod,
    pod_resources,
    share,
    wait_running,
)

from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION

pytestmark = pytest.mark.e2e

# pod -> [(container, init?, memory MiB, compute milli)]
PODS = {
    "single": [("main", False, 20480, 300)],
    "multi": [("main", False, 10240, 200), ("helper", False, 6144, 150)],
    "with-init": [("prepare", True, 8192, 100), ("main", False, 16384, 250)],
}


def test_shared_pods_run_on_the_decided_card_with_their_share(
    cluster: Cluster, roles: KubegpuRoles, namespace: str
) -> None:
    manifests = []
    for name, parts in PODS.items():
        apps = [container(c, share(m, k)) for c, init, m, k in parts if not init]
        inits = [container(c, share(m, k), idle=False) for c, init, m, k in parts if init]
        manifests.append(pod(name, namespace, apps, init_containers=inits, scheduler=SCHEDULER))
    create(cluster, *manifests)
    wait_running(cluster, namespace, *PODS)

    slot_holders = {
        (e.pod, e.container)
        for e in pod_resources(cluster.pod_resources_socket)
        if e.namespace == namespace and e.resource == SHARED
    }
    for name, parts in PODS.items():
        obj = cluster.get("pod", "-n", namespace, name)
        decision = json.loads(obj["metadata"]["annotations"][ALLOCATION_ANNOTATION])
        assert decision["mode"] == "shared"
        decided_cards = {g["uuid"] for g in decision["gpus"]}
        assert len(decided_cards) == 1, decision
        for container_name, init, memory, compute in parts:
            env = container_env(cluster, namespace, name, container_name)
            assert env["KUBEGPU_GPU_UUID"] in decided_cards, (name, container_name, env)
            assert env["NVIDIA_VISIBLE_DEVICES"] == env["KUBEGPU_GPU_UUID"]
            assert int(env["KUBEGPU_GPU_MEMORY_LIMIT_MIB"]) == memory
            assert int(env["KUBEGPU_GPU_COMPUTE_MILLI"]) == compute
            if not init:
                assert (name, container_name) in slot_holders, "the kubelet lists no slot"

    for card, (memory, compute) in card_totals(cluster, [namespace]).items():
        assert memory <= CARD_MEMORY_MIB and compute <= CARD_COMPUTE_MILLI, card


def test_a_share_that_fits_no_card_waits_with_the_extenders_reason(
    cluster: Cluster, roles: KubegpuRoles, namespace: str
) -> None:
    create(
        cluster,
        pod(
            "too-big",
            namespace,
            [container("main", share(CARD_MEMORY_MIB + 1024, 500))],
            scheduler=SCHEDULER,
        ),
    )
    reason = cluster.wait_for(
        "kube-scheduler to record the extender's refusal",
        lambda: pending_reason(cluster, namespace, "too-big"),
        timeout=60,
    )
    assert phase(cluster, namespace, "too-big") == "Pending"
    described = cluster.kubectl("describe", "pod", "-n", namespace, "too-big").stdout
    assert "FailedScheduling" in described
    # The extender's own words reach the pod through the real kube-scheduler, counted per
    # reason as it counts its own plugins' (the reason names no node, so nodes add up).
    words = f"1 node(s) have no card with {CARD_MEMORY_MIB + 1024} MiB of GPU memory in total"
    assert words in reason, reason
    assert words in " ".join(described.split()), described
