"""`kubectl gpu inspect` through the real kubectl's plugin lookup agrees with what the real
kubelet's PodResources says; `kubegpu labels` puts GPU-feature-discovery labels on the Node,
as NVIDIA's own tests of GFD expect them."""

from __future__ import annotations

import pytest
from kubegpu_e2e.cluster import NODE_NAME, Cluster
from kubegpu_e2e.kubegpu import KubegpuRoles
from kubegpu_e2e.workloads import (
    SCHEDULER,
    WHOLE,
    container,
    create,
    inspected_card_view,
    kubectl_gpu_inspect,
    kubelet_card_view,
    pod,
    share,
    wait_running,
)

from kubegpu.labels.catalogue import TIMESTAMP, owns_label
from kubegpu.testing.gfd_labels import gfd_label_gaps

pytestmark = pytest.mark.e2e


def test_kubectl_gpu_inspect_agrees_with_pod_resources(
    cluster: Cluster, roles: KubegpuRoles, namespace: str
) -> None:
    create(
        cluster,
        pod("share-a", namespace, [container("main", share(12288, 250))], scheduler=SCHEDULER),
        pod("share-b", namespace, [container("main", share(4096, 100))], scheduler=SCHEDULER),
        pod("whole", namespace, [container("main", {WHOLE: "2"})]),
    )
    wait_running(cluster, namespace, "share-a", "share-b", "whole")
    exporter = f"--exporter-url-template=http://127.0.0.1:{roles.exporter_port}/metrics"

    def inspected() -> dict[str, set[str]]:
        return inspected_card_view(cluster, NODE_NAME, namespace, exporter)

    # A whole-GPU pod without a decision is placed from the exporter's PodResources reading,
    # which refreshes every 10 s: the two views agree within a few refreshes.
    kubelet = kubelet_card_view(cluster, namespace)
    cluster.wait_for("inspect to agree with PodResources", lambda: inspected() == kubelet, 60)

    table = kubectl_gpu_inspect(cluster, "-n", namespace, "--no-usage")
    assert table.returncode == 0, table.stderr
    assert NODE_NAME in table.stdout and "share-a" in table.stdout


def test_labeller_writes_gpu_feature_discovery_labels(
    cluster: Cluster, roles: KubegpuRoles
) -> None:
    expected = {
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
        "kubegpu.io/gpu.healthy-count": "8",
        "kubegpu.io/gpu.nvlink": "true",
        "kubegpu.io/gpu-share": "true",
        "kubegpu.io/gpu-share.slots": "32",
    }

    def labels() -> dict[str, str]:
        return dict(cluster.get("node", NODE_NAME)["metadata"].get("labels", {}))

    cluster.wait_for(
        "GPU feature labels on the Node",
        lambda: expected.items() <= labels().items(),
        timeout=60,
    )
    # The driver of the fake preset (535.161.08, CUDA 12.2), in GFD's own label names.
    current = labels()
    assert current["nvidia.com/cuda.driver-version.major"] == "535", current


def test_node_labels_match_nvidias_gfd_label_patterns(
    cluster: Cluster, roles: KubegpuRoles
) -> None:
    """NVIDIA's label patterns for GFD (its e2e suite's and its golden file's) against the
    labels on the real Node: every one present and well formed, no nvidia.com/ label GFD
    would not write. Only the labeller's own labels are held to them: other components label
    the Node under nvidia.com/ too."""

    def labels() -> dict[str, str]:
        return dict(cluster.get("node", NODE_NAME)["metadata"].get("labels", {}))

    # One patch writes them all: once the timestamp is there, so is every other label.
    cluster.wait_for("the labeller's labels on the Node", lambda: TIMESTAMP in labels(), 60)
    ours = {key: value for key, value in labels().items() if owns_label(key)}
    assert gfd_label_gaps(ours) == {}, ours
