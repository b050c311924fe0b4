"""The lightkube implementations of the DRA ports, over real HTTP (tests/dra/resource_api.py)."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.dra import KUBEGPU_NAMING, AllocatedDevice, ClaimRef
from kubegpu.core.dra_ports import ClaimLookupError
from kubegpu.core.gpu import NodeInventory
from kubegpu.dra.publisher import ResourceSlicePublisher
from kubegpu.kube.resource_claims import LightkubeResourceClaimSource
from kubegpu.kube.resource_slices import LightkubeResourceSliceSink

from .conftest import NODE
from .resource_api import ResourceApi, serve

DRIVER = "gpu.kubegpu.io"
CLAIM = ClaimRef("team-a", "train", "uid-1")


def foreign_slice(name: str, node: str, driver: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 9, "resourceSliceCount": 1},
            "devices": [],
        },
    }


async def test_claim_source_reads_our_results_and_reports_a_missing_claim() -> None:
    api = ResourceApi()
    api.claims[("team-a", "train")] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "train", "namespace": "team-a", "uid": "uid-1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": NODE,
                            "device": "gpu-0",
                            "shareID": "s-1",
                            "consumedCapacity": {"memory": "2Gi"},
                        }
                    ]
                }
            }
        },
    }
    async with serve(api) as client:
        source = LightkubeResourceClaimSource(client)
        allocation = await source.allocation(CLAIM, DRIVER)
        with pytest.raises(ClaimLookupError, match="not found"):
            await source.allocation(ClaimRef("team-a", "gone", "uid-2"), DRIVER)
    assert allocation.devices == (
        AllocatedDevice("gpu", NODE, "gpu-0", share_id="s-1", memory_bytes=2 * 2**30),
    )


async def test_claim_source_lists_the_pools_allocations_across_namespaces() -> None:
    api = ResourceApi()
    for namespace, name, device, pool in (
        ("team-a", "train", "gpu-0", NODE),
        ("team-b", "infer", "gpu-1", NODE),
        ("team-b", "elsewhere", "gpu-1", "node-b"),
    ):
        api.claims[(namespace, name)] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}
                        ]
                    }
                }
            },
        }
    async with serve(api) as client:
        devices = await LightkubeResourceClaimSource(client).pool_allocations(DRIVER, NODE)
    assert sorted(d.device for d in devices) == ["gpu-0", "gpu-1"]
    assert api.requests == [("list", "resourceclaims")]


async def test_slice_sink_creates_replaces_and_deletes_only_this_nodes_slices(
    inventory: NodeInventory,
) -> None:
    api = ResourceApi()
    other_node = foreign_slice("node-b-x", "node-b", DRIVER)
    other_driver = foreign_slice("node-a-net", NODE, "net.example.com")
    stale = foreign_slice(f"{NODE}-{DRIVER}-7", NODE, DRIVER)
    for obj in (other_node, other_driver, stale):
        api.slices[obj["metadata"]["name"]] = obj
    async with serve(api) as client:
        publisher = ResourceSlicePublisher(NODE, KUBEGPU_NAMING, LightkubeResourceSliceSink(client))
        await publisher.publish(inventory)
        created = api.slices[f"{NODE}-{DRIVER}-0"]
        # continues above the generation the API server held (the stale slice's 9)
        assert created["spec"]["pool"]["generation"] == 10
        assert stale["metadata"]["name"] not in api.slices
        await publisher.publish(inventory, {inventory.gpus[0].uuid: "xid-79"})
    replaced = api.slices[f"{NODE}-{DRIVER}-0"]
    assert replaced["spec"]["pool"]["generation"] == 11
    assert "taints" in replaced["spec"]["devices"][0]
    assert set(api.slices) == {"node-b-x", "node-a-net", f"{NODE}-{DRIVER}-0"}
    assert set(api.field_selectors) == {f"spec.nodeName={NODE},spec.driver={DRIVER}"}
