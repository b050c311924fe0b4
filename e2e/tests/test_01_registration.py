"""The real kubelet accepts the node agent: the Node advertises 8 whole GPUs and the share
slots, and they come back after the kubelet restarts with its device-plugin folder wiped."""

from __future__ import annotations

import shutil

import pytest
from kubegpu_e2e.cluster import NODE_NAME, Cluster
from kubegpu_e2e.kubegpu import KubegpuRoles
from kubegpu_e2e.workloads import SHARED, WHOLE

pytestmark = pytest.mark.e2e

SLOTS_PER_CARD = 32  # sharing.gpuShare.slotsPerCard's default; deploy/ does not change it


def _advertised(cluster: Cluster) -> dict[str, tuple[str | None, str | None]]:
    status = cluster.get("node", NODE_NAME)["status"]
    return {
        name: (status["capacity"].get(name), status["allocatable"].get(name))
        for name in (WHOLE, SHARED)
    }


def _expected() -> dict[str, tuple[str | None, str | None]]:
    slots = str(8 * SLOTS_PER_CARD)
    return {WHOLE: ("8", "8"), SHARED: (slots, slots)}


def test_node_advertises_whole_gpus_and_share_slots(cluster: Cluster, roles: KubegpuRoles) -> None:
    cluster.wait_for(
        "the Node to advertise 8 GPUs and 256 share slots",
        lambda: _advertised(cluster) == _expected(),
        timeout=60,
    )
    # The two resources are two registrations with the real kubelet, each on its own socket.
    sockets = {p.name for p in cluster.device_plugin_dir.glob("*.sock")}
    assert "kubelet.sock" in sockets
    assert len(sockets - {"kubelet.sock"}) == 2, sockets


def test_kubelet_restart_with_socket_folder_removed(cluster: Cluster, roles: KubegpuRoles) -> None:
    before = {p.name for p in cluster.device_plugin_dir.glob("*.sock")} - {"kubelet.sock"}
    cluster.stop_kubelet()
    shutil.rmtree(cluster.device_plugin_dir)
    cluster.start_kubelet()
    # The agent must notice that its sockets are gone and register again with the new kubelet.
    cluster.wait_for(
        "the node agent's sockets to be back in the new device-plugin folder",
        lambda: before <= {p.name for p in cluster.device_plugin_dir.glob("*.sock")},
        timeout=60,
    )
    cluster.wait_for(
        "the Node to advertise 8 GPUs and 256 share slots again",
        lambda: _advertised(cluster) == _expected(),
        timeout=90,
    )
    assert roles.processes["kubegpu-node-agent"].running
