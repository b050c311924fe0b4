"""ResourceSlices built from the inventory: pool, devices, attributes, capacities, taints."""

from __future__ import annotations

import math
from typing import Any

import pytest

from kubegpu.core.dra import DEFAULT_DRIVER_NAME
from kubegpu.core.gpu import GpuLink, NodeInventory, PcieLink
from kubegpu.dra.slices import (
    MAX_DEVICES_PER_SLICE,
    build_resource_slices,
    taint_value,
)
from kubegpu.sharing.resources import parse_quantity

from .conftest import NODE, gpu

DRIVER = DEFAULT_DRIVER_NAME


def only_slice(inventory: NodeInventory, **kwargs: Any) -> dict[str, Any]:
    slices = build_resource_slices(NODE, inventory, generation=3, **kwargs)
    assert len(slices) == 1
    return slices[0]


def test_one_pool_per_node_one_device_per_gpu(inventory: NodeInventory) -> None:
    resource_slice = only_slice(inventory)
    assert resource_slice["apiVersion"] == "resource.k8s.io/v1"
    assert resource_slice["kind"] == "ResourceSlice"
    spec = resource_slice["spec"]
    assert spec["driver"] == DRIVER
    assert spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    # exactly one of nodeName / nodeSelector / allNodes / perDeviceNodeSelection
    assert not {"nodeSelector", "allNodes", "perDeviceNodeSelection"} & spec.keys()


def test_device_attributes_are_typed_values(inventory: NodeInventory) -> None:
    device = only_slice(inventory)["spec"]["devices"][1]
    assert device["attributes"] == {
        "uuid": {"string": "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"},
        "index": {"int": 1},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        "pciBusID": {"string": "00000000:11:00.0"},
        "computeCapability": {"version": "8.0.0"},
        "numaNode": {"int": 1},
        # semver: NVIDIA's zero-padded patch "05" is not valid semver, "5" is.
        "driverVersion": {"version": "535.104.5"},
    }


def test_unknown_fields_are_left_out_not_faked() -> None:
    device = only_slice(NodeInventory(gpus=(gpu(0),)))["spec"]["devices"][0]
    assert set(device["attributes"]) == {"uuid", "index", "productName", "pciBusID"}


@pytest.mark.parametrize(
    ("raw", "attribute"),
    [
        ("550.54.15", {"version": "550.54.15"}),
        ("535.104.05", {"version": "535.104.5"}),
        ("560.28", {"version": "560.28.0"}),
        ("weird-1.2", None),
    ],
    ids=["semver", "zero-padded", "two-parts", "unparseable"],
)
def test_driver_version_attribute(raw: str, attribute: dict[str, str] | None) -> None:
    inventory = NodeInventory(gpus=(gpu(0),), driver_version=raw)
    attributes = only_slice(inventory)["spec"]["devices"][0]["attributes"]
    assert attributes.get("driverVersion") == attribute


def test_capacities_allow_shares_by_memory_and_compute_and_default_to_the_whole_card() -> None:
    # 81559 MiB is not a multiple of the 256 MiB step: the whole-card default is the largest
    # multiple that fits, and the leftover (< one step) is below the smallest share.
    device = only_slice(NodeInventory(gpus=(gpu(0, memory_mib=81559),)))["spec"]["devices"][0]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"] == {
        "memory": {
            "value": "81559Mi",
            "requestPolicy": {
                "default": "81408Mi",
                "validRange": {"min": "256Mi", "max": "81408Mi", "step": "256Mi"},
            },
        },
        "compute": {
            "value": "1000",
            "requestPolicy": {
                "default": "1000",
                "validRange": {"min": "10", "max": "1000", "step": "10"},
            },
        },
    }


def _allocator_round_up(requested: str, valid_range: dict[str, str]) -> int:
    """kube-scheduler's rounding of a capacity request to a request policy, ported from
    roundUpRange in k8s.io/dynamic-resource-allocation v0.35.4
    (structured/internal/experimental/consumable_capacity.go): below min gives min, else
    min + step * ceil((request - min) / step), all through Quantity.Value(), which rounds a
    fraction up to the next whole number."""

    def value(quantity: str) -> int:
        return math.ceil(parse_quantity(quantity))

    if parse_quantity(requested) < parse_quantity(valid_range["min"]):
        return value(valid_range["min"])
    low, step = value(valid_range["min"]), value(valid_range["step"])
    return low + step * math.ceil((value(requested) - low) / step)


@pytest.mark.parametrize(
    ("share", "per_card"), [(("20Gi", "250"), 4), (("8Gi", "100"), 10), (("256Mi", "50"), 20)]
)
def test_the_real_allocator_fits_as_many_shares_on_a_card_as_the_share_says(
    share: tuple[str, str], per_card: int
) -> None:
    # On the real kube-scheduler a compute policy in cards ("1", steps of "50m") made every
    # share consume the whole "1": one share per card (e2e/tests/test_11_dra.py).
    capacity = only_slice(NodeInventory(gpus=(gpu(0, memory_mib=81920),)))["spec"]["devices"][0][
        "capacity"
    ]
    for name, requested in zip(("memory", "compute"), share, strict=True):
        consumed = _allocator_round_up(requested, capacity[name]["requestPolicy"]["validRange"])
        assert consumed == math.ceil(parse_quantity(requested)), name
        assert consumed * per_card <= parse_quantity(capacity[name]["value"]), name


def test_a_card_smaller_than_one_step_gets_no_memory_policy() -> None:
    device = only_slice(NodeInventory(gpus=(gpu(0, memory_mib=200),)))["spec"]["devices"][0]
    assert device["capacity"]["memory"] == {"value": "200Mi"}


def test_unhealthy_gpu_is_tainted_no_schedule_and_healthy_ones_are_not(
    inventory: NodeInventory,
) -> None:
    sick = inventory.gpus[0].uuid
    devices = only_slice(inventory, unhealthy={sick: "Xid 79: GPU has fallen off the bus"})["spec"][
        "devices"
    ]
    assert devices[0]["taints"] == [
        {
            "key": "gpu.kubegpu.io/unhealthy",
            "value": "Xid-79-GPU-has-fallen-off-the-bus",
            "effect": "NoSchedule",
        }
    ]
    assert "taints" not in devices[1]


@pytest.mark.parametrize(
    ("reason", "value"),
    [("xid-48", "xid-48"), ("  !!", ""), ("a" * 100, "a" * 63), ("-lost-", "lost")],
    ids=["plain", "nothing-valid", "too-long", "trimmed-ends"],
)
def test_taint_value_is_a_valid_label_value(reason: str, value: str) -> None:
    assert taint_value(reason) == value


def test_many_gpus_are_split_into_slices_of_one_pool() -> None:
    inventory = NodeInventory(gpus=tuple(gpu(i) for i in range(MAX_DEVICES_PER_SLICE + 1)))
    slices = build_resource_slices(NODE, inventory, generation=1)
    assert [len(s["spec"]["devices"]) for s in slices] == [MAX_DEVICES_PER_SLICE, 1]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    assert len({s["metadata"]["name"] for s in slices}) == 2


def test_node_without_gpus_still_publishes_its_empty_pool() -> None:
    (empty,) = build_resource_slices(NODE, NodeInventory(gpus=()), generation=1)
    assert empty["spec"]["devices"] == []


def test_generation_must_be_positive(inventory: NodeInventory) -> None:
    with pytest.raises(ValueError, match="generation must be >= 1, got 0"):
        build_resource_slices(NODE, inventory, generation=0)


def _linked(count: int, lanes: dict[tuple[int, int], int]) -> NodeInventory:
    gpus = tuple(gpu(i) for i in range(count))
    links = {
        (gpus[a].uuid, gpus[b].uuid): GpuLink(pcie=PcieLink.SYS, nvlinks=n)
        for (a, b), n in lanes.items()
    }
    return NodeInventory(gpus=gpus, links=links)


def _nvlink_of(inventory: NodeInventory) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in device["attributes"].items() if k.startswith("nvlink")}
        for device in only_slice(inventory)["spec"]["devices"]
    ]


def test_nvlink_peers_and_islands_are_attributes_of_the_linked_gpus_only() -> None:
    # Two islands: 0-1-2 (a chain: 0 and 2 reach each other through 1) and 4-5; GPU 3 has only
    # PCIe, and a pair with 0 lanes is no NVLink.
    inventory = _linked(6, {(0, 1): 12, (2, 1): 4, (5, 4): 2, (3, 4): 0, (0, 3): 0})
    assert _nvlink_of(inventory) == [
        {"nvlinkPeerCount": {"int": 1}, "nvlinkDomain": {"int": 0}, "nvlinkPeers": {"string": "1"}},
        {
            "nvlinkPeerCount": {"int": 2},
            "nvlinkDomain": {"int": 0},
            "nvlinkPeers": {"string": "0,2"},
        },
        {"nvlinkPeerCount": {"int": 1}, "nvlinkDomain": {"int": 0}, "nvlinkPeers": {"string": "1"}},
        {},
        {"nvlinkPeerCount": {"int": 1}, "nvlinkDomain": {"int": 4}, "nvlinkPeers": {"string": "5"}},
        {"nvlinkPeerCount": {"int": 1}, "nvlinkDomain": {"int": 4}, "nvlinkPeers": {"string": "4"}},
    ]


def test_no_topology_means_no_nvlink_attributes(inventory: NodeInventory) -> None:
    assert _nvlink_of(inventory) == [{}, {}]


def test_a_peer_list_past_the_api_limit_is_left_out_but_count_and_island_stay() -> None:
    # 32 GPUs all joined: "1,2,…,31" is 84 characters, over the 64 the API server accepts.
    everyone = {(a, b): 1 for a in range(32) for b in range(a + 1, 32)}
    devices = only_slice(_linked(32, everyone))["spec"]["devices"]
    for device in devices:
        attributes = device["attributes"]
        assert "nvlinkPeers" not in attributes
        assert attributes["nvlinkPeerCount"] == {"int": 31}
        assert attributes["nvlinkDomain"] == {"int": 0}
        assert all(len(v.get("string", "")) <= 64 for v in attributes.values())
