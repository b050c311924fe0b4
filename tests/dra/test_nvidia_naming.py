"""The NVIDIA naming (dra.naming: nvidia): what NVIDIA's DRA driver publishes, by our code.

The attribute names, types and value formats are those of kubernetes-sigs/
dra-driver-nvidia-gpu at 95932046 (cmd/gpu-kubelet-plugin/deviceinfo.go, its vendored
go-nvlib for the strings, and site/content/docs/reference/resourceslice-attributes.md);
docs/migrate-nvidia.md maps them against ours."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kubegpu.core.dra import KUBEGPU_NAMING, NVIDIA_NAMING, AllocatedDevice, ClaimRef
from kubegpu.core.dra_cluster import DeviceRequest, DraClaim, SliceDevice
from kubegpu.core.gpu import GpuLink, NodeInventory, PcieLink
from kubegpu.dra.slices import MANAGED_BY_LABEL, build_resource_slices
from kubegpu.extender.dra_rank import card_states, dra_demand

from .conftest import NODE, gpu


def nvidia_slice(inventory: NodeInventory, **kwargs: Any) -> dict[str, Any]:
    (only,) = build_resource_slices(NODE, inventory, naming=NVIDIA_NAMING, generation=1, **kwargs)
    return only


def full_card(index: int = 0) -> Any:
    return dataclasses.replace(
        gpu(index, compute_capability=(9, 0), numa_node=1),
        product_name="NVIDIA H100 80GB HBM3",
        pci_bus_id=f"00000000:{0x65 + index:02X}:00.0",
        brand="Nvidia",
        architecture="Hopper",
        pcie_root="pci0000:64",
    )


def test_the_driver_and_every_attribute_are_named_and_typed_as_nvidias() -> None:
    inventory = NodeInventory(
        gpus=(full_card(),), driver_version="580.105.04", cuda_driver_version="13.0"
    )
    resource_slice = nvidia_slice(inventory)
    assert resource_slice["spec"]["driver"] == "gpu.nvidia.com"
    assert resource_slice["metadata"]["name"] == f"{NODE}-gpu.nvidia.com-0"
    device = resource_slice["spec"]["devices"][0]
    assert device["name"] == "gpu-0"
    assert device["attributes"] == {
        "type": {"string": "gpu"},
        "uuid": {"string": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        # NVIDIA strips leading zeros (semver): 580.105.04 is published as 580.105.4.
        "driverVersion": {"version": "580.105.4"},
        "cudaDriverVersion": {"version": "13.0.0"},
        # Lower case, 4-digit domain: the standard attribute's required form.
        "resource.kubernetes.io/pciBusID": {"string": "0000:65:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:64"},
        "resource.kubernetes.io/numaNode": {"int": 1},
        # Ours that NVIDIA lacks: under our own domain, so NVIDIA's holds exactly its set.
        "gpu.kubegpu.io/index": {"int": 0},
    }
    assert device["capacity"]["memory"]["value"] == "81920Mi"


def test_what_the_node_cannot_say_is_left_out_not_made_up() -> None:
    bare = dataclasses.replace(gpu(0), architecture=None)
    device = nvidia_slice(NodeInventory(gpus=(bare,)))["spec"]["devices"][0]
    assert set(device["attributes"]) == {
        "type",
        "uuid",
        "productName",
        "resource.kubernetes.io/pciBusID",
        "gpu.kubegpu.io/index",
    }


def test_nvlink_attributes_go_under_our_domain() -> None:
    a, b = full_card(0), full_card(1)
    inventory = NodeInventory(gpus=(a, b), links={(a.uuid, b.uuid): GpuLink(PcieLink.SYS, 12)})
    attributes = nvidia_slice(inventory)["spec"]["devices"][1]["attributes"]
    assert attributes["gpu.kubegpu.io/nvlinkDomain"] == {"int": 0}
    assert attributes["gpu.kubegpu.io/nvlinkPeers"] == {"string": "0"}
    assert not any(name.startswith("nvlink") for name in attributes)


@pytest.mark.parametrize(
    ("naming", "default", "low"),
    [(KUBEGPU_NAMING, "1000", "10"), (NVIDIA_NAMING, "0", "0")],
    ids=["kubegpu-unnamed-compute-is-the-card", "nvidia-unnamed-compute-is-none"],
)
def test_what_a_request_naming_no_compute_consumes(naming: Any, default: str, low: str) -> None:
    (only,) = build_resource_slices(
        NODE, NodeInventory(gpus=(gpu(0),)), naming=naming, generation=1
    )
    device = only["spec"]["devices"][0]
    policy = device["capacity"]["compute"]["requestPolicy"]
    assert policy == {"default": default, "validRange": {"min": low, "max": "1000", "step": "10"}}
    # Whole-GPU requests stay exclusive under both: the memory default is all of it.
    assert device["capacity"]["memory"]["requestPolicy"]["default"] == "81920Mi"
    assert device["allowMultipleAllocations"] is True


def test_an_unhealthy_gpu_is_tainted_under_the_drivers_name() -> None:
    card = gpu(0)
    device = nvidia_slice(NodeInventory(gpus=(card,)), unhealthy={card.uuid: "Xid 79"})
    assert device["spec"]["devices"][0]["taints"] == [
        {"key": "gpu.nvidia.com/unhealthy", "value": "Xid-79", "effect": "NoSchedule"}
    ]


def test_every_slice_says_kubegpu_wrote_it() -> None:
    for naming in (KUBEGPU_NAMING, NVIDIA_NAMING):
        (only,) = build_resource_slices(
            NODE, NodeInventory(gpus=(gpu(0),)), naming=naming, generation=1
        )
        assert only["metadata"]["labels"] == {MANAGED_BY_LABEL: "kubegpu"}


def claim_asking(memory: int | None, compute: int | None) -> DraClaim:
    return DraClaim(
        ClaimRef("ns", "c", "uid"),
        (DeviceRequest("gpu", 1, memory_bytes=memory, compute_milli=compute),),
    )


@pytest.mark.parametrize(
    ("unnamed", "memory", "compute", "expected"),
    [
        # Ours: memory alone takes the card's compute, so it is a whole card.
        (1000, 2 * 2**30, None, (1, 1000, None)),
        # NVIDIA's: memory alone is a memory share (1 milli of compute in the engine).
        (0, 2 * 2**30, None, (1, 1, 2048)),
        # Nothing named: a whole card under both.
        (0, None, None, (1, 1000, None)),
    ],
    ids=["kubegpu-memory-only", "nvidia-memory-only", "nvidia-nothing-named"],
)
def test_the_extender_charges_unnamed_compute_as_the_naming_does(
    unnamed: int, memory: int | None, compute: int | None, expected: tuple[Any, ...]
) -> None:
    demand = dra_demand([claim_asking(memory, compute)], 100, 64, unnamed_compute_milli=unnamed)
    assert demand is not None
    assert (demand.gpu_count, demand.gpu_milli, demand.gpu_memory_mib) == expected


def test_a_memory_share_that_consumed_no_compute_leaves_the_cards_compute_free() -> None:
    # The allocator records every capacity as consumed, defaults included: under NVIDIA's
    # naming a memory share consumed compute 0, and ranking must still see its memory used.
    device = SliceDevice(NODE, NODE, "gpu-0", memory_bytes=80 * 2**30, compute_milli=1000)
    share = AllocatedDevice("gpu", NODE, "gpu-0", "s1", memory_bytes=2 * 2**30, compute_milli=0)
    (card,) = card_states([device], [share])
    assert (card.free_milli, card.free_memory_mib) == (1000, 78 * 1024)
