"""The DRA driver's manifests (deploy/components/dra-driver, rendered through
deploy/examples/dra): they start the real command line, on the right nodes only, with the
rights the driver's API calls need and no more."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubegpu.cli.dra_driver import dra_driver
from kubegpu.config.allocation import check_gpu_allocation
from kubegpu.config.load import load_config
from kubegpu.core.dra import DEFAULT_DRIVER_NAME, KUBEGPU_NAMING, ClaimRef
from kubegpu.core.gpu import NodeInventory
from kubegpu.dra.publisher import ResourceSlicePublisher
from kubegpu.kube.pool_allocations import WatchedPoolAllocations
from kubegpu.kube.resource_claims import LightkubeResourceClaimSource
from kubegpu.kube.resource_slices import LightkubeResourceSliceSink
from kubegpu.roles.dra_driver import socket_paths
from kubegpu.testing.waiting import wait_until_async

from ..deploy.manifests import (
    arg_value,
    container,
    find,
    host_mounts,
    materialise_config_volumes,
    pod_spec,
    render,
)
from .conftest import NODE
from .resource_api import ResourceApi, serve

EXAMPLE = "examples/dra"


def _terms(daemonset: dict[str, Any]) -> list[list[dict[str, Any]]]:
    affinity = pod_spec(daemonset)["affinity"]["nodeAffinity"]
    required = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    return [term["matchExpressions"] for term in required["nodeSelectorTerms"]]


def _matches(expressions: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    for e in expressions:
        value = labels.get(e["key"])
        if e["operator"] == "In" and value not in e["values"]:
            return False
        if e["operator"] == "NotIn" and value in e["values"]:
            return False
    return True


def _runs_on(daemonset: dict[str, Any], labels: dict[str, str]) -> bool:
    return any(_matches(term, labels) for term in _terms(daemonset))


@pytest.mark.parametrize(
    "gpu_label",
    [
        "feature.node.kubernetes.io/pci-0302_10de.present",
        "feature.node.kubernetes.io/pci-0300_10de.present",
        "feature.node.kubernetes.io/pci-10de.present",
        "nvidia.com/gpu.present",
    ],
)
def test_a_node_runs_the_device_plugin_or_the_dra_driver_never_both(gpu_label: str) -> None:
    objs = render(EXAMPLE)
    agent = find(objs, "DaemonSet", "kubegpu-node-agent")
    driver = find(objs, "DaemonSet", "kubegpu-dra-driver")
    gpu_node = {gpu_label: "true"}
    assert _runs_on(agent, gpu_node) and not _runs_on(driver, gpu_node)
    dra_node = {**gpu_node, "kubegpu.io/gpu-allocation": "dra"}
    assert _runs_on(driver, dra_node) and not _runs_on(agent, dra_node)


def test_the_daemonset_starts_the_real_command_on_the_kubelets_folders(tmp_path: Path) -> None:
    objs = render(EXAMPLE)
    driver = find(objs, "DaemonSet", "kubegpu-dra-driver")
    item = container(driver, "dra-driver")
    args = item["args"]
    assert args[0] == "dra-driver"
    paths = materialise_config_volumes(objs, driver, "dra-driver", tmp_path)
    # Every argument is an option of the command (click parses without running it). Click
    # checks paths as it parses (the config exists, the folders are writable), so the config
    # is the one the ConfigMap holds and the host's folders are made here.
    here = {
        "--config": lambda v: v.replace("/etc/kubegpu", paths["/etc/kubegpu"]),
        **dict.fromkeys(
            ("--kubelet-dir", "--cdi-dir", "--state-dir"),
            lambda v: str(tmp_path / "host" / v.lstrip("/")),
        ),
    }
    local = [
        f"{flag}={here[flag](value)}" if flag in here else arg
        for arg in args[1:]
        for flag, _, value in [arg.partition("=")]
    ]
    assert local != list(args[1:])  # the paths did move
    ctx = dra_driver.make_context("dra-driver", local)
    assert ctx.params["node_name"] == "$(NODE_NAME)"
    mounts = host_mounts(driver, "dra-driver")
    sockets = socket_paths(Path(arg_value(args, "--kubelet-dir")))
    # The kubelet's folders are mounted at the same path: the registration answer names the
    # DRA socket by its path, which the kubelet opens on the host.
    for folder in (sockets.registration.parent, sockets.dra.parent.parent):
        assert mounts[str(folder)] == (str(folder), False)
    for option in ("--cdi-dir", "--state-dir"):
        path = arg_value(args, option)
        assert mounts[path] == (path, False), option
    # The config it mounts gives the node's GPUs to the DRA driver.
    config_file = arg_value(args, "--config").replace("/etc/kubegpu", paths["/etc/kubegpu"])
    config = load_config(Path(config_file), {})
    check_gpu_allocation(config, "dra")
    assert pod_spec(driver)["serviceAccountName"] == "kubegpu-dra-driver"


async def test_the_cluster_role_grants_exactly_what_the_driver_calls(
    inventory: NodeInventory,
) -> None:
    api = ResourceApi()
    claim = ClaimRef("team-a", "train", "uid-1")
    api.claims[("team-a", "train")] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "train", "namespace": "team-a", "uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": []}}},
    }
    stale = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "stale", "resourceVersion": "1"},
        "spec": {
            "driver": DEFAULT_DRIVER_NAME,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }
    api.slices["stale"] = stale
    async with serve(api) as client:
        # Everything the driver does with the API: publish (list, create, delete a stale
        # slice), republish on a health change (update), read a claim to prepare it (get),
        # read the claims allocated from the pool to steer (list, then watch).
        publisher = ResourceSlicePublisher(NODE, KUBEGPU_NAMING, LightkubeResourceSliceSink(client))
        await publisher.publish(inventory)
        await publisher.publish(inventory, {inventory.gpus[0].uuid: "Xid 48"})
        await LightkubeResourceClaimSource(client).allocation(claim, DEFAULT_DRIVER_NAME)
        await LightkubeResourceClaimSource(client).pool_allocations(DEFAULT_DRIVER_NAME, NODE)
        watched = WatchedPoolAllocations(client, DEFAULT_DRIVER_NAME)
        watched.start()
        try:
            await wait_until_async(
                lambda: ("watch", "resourceclaims") in api.requests,
                timeout_s=20,
                what="the claim watch",
            )
        finally:
            await watched.close()
    used: dict[str, set[str]] = {}
    for verb, resource in api.requests:
        used.setdefault(resource, set()).add(verb)

    role = find(render(EXAMPLE), "ClusterRole", "kubegpu-dra-driver")
    granted: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert rule["apiGroups"] == ["resource.k8s.io"]
        for resource in rule["resources"]:
            granted.setdefault(resource, set()).update(rule["verbs"])
    assert granted == used


def test_the_probes_are_the_node_agent_s_on_the_driver_s_own_health_port() -> None:
    # Same endpoints, timings and thresholds as the device plugin's (one kubegpu.probes): an
    # operator reads both DaemonSets' probes the same way.
    objs = render(EXAMPLE)
    driver = container(find(objs, "DaemonSet", "kubegpu-dra-driver"), "dra-driver")
    agent = container(find(objs, "DaemonSet", "kubegpu-node-agent"), "device-plugin")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert driver[probe] == agent[probe], probe
        assert driver[probe]["httpGet"]["port"] == "health"
    assert driver["ports"] == [{"name": "health", "containerPort": 9403, "protocol": "TCP"}]
    assert arg_value(driver["args"], "--health-listen") == "0.0.0.0:9403"
    # Its own port: no other container of the install uses 9403.
    others = {
        port["containerPort"]
        for obj in objs
        if obj["kind"] in ("DaemonSet", "Deployment")
        for item in pod_spec(obj)["containers"]
        if item["name"] != "dra-driver"
        for port in item.get("ports", [])
    }
    assert 9403 not in others
