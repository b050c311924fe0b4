"""MIG through the DRA driver: static MIG devices in the slice and prepared with their own UUID
and capability nodes; dynamic MIG's placements over a counter set that admits exactly the
layouts the card allows, and the instance created on prepare, destroyed on unprepare (over the
real gRPC socket, on the fake backend)."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from typing import Any

import pytest

from kubegpu.core.dra import NVIDIA_NAMING, AllocatedDevice, ClaimRef, mig_placement
from kubegpu.core.gpu import GpuDevice, NodeInventory
from kubegpu.core.mig import Instance, layout_problem, profiles_of
from kubegpu.dra.server import DraPluginServer
from kubegpu.dra.slices import build_resource_slices
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.inventory.spec import parse_fake_spec

from .conftest import NODE, Node
from .test_server import cdi_spec, prepare, unprepare

H100 = "NVIDIA H100 80GB HBM3"
SPEC = f"""
driver_version: "570.86.15"
gpus:
  - index: 0
    uuid: GPU-00000000-0000-0000-0000-000000000000
    product_name: {H100}
    memory_total_mib: 81559
    pci_bus_id: "00000000:10:00.0"
    compute_capability: "9.0"
    mig_enabled: true
    mig_instances:
      - {{profile: 3g.40gb, start: 4}}
      - {{profile: 1g.10gb, start: 0}}
  - index: 1
    uuid: GPU-00000000-0000-0000-0000-000000000001
    product_name: {H100}
    memory_total_mib: 81559
    pci_bus_id: "00000000:11:00.0"
    compute_capability: "9.0"
    mig_enabled: false
"""


def mig_node() -> NodeInventory:
    return parse_fake_spec(SPEC, name="mig", source="mig.yaml").inventory


def devices_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", ())}


def test_static_mig_devices_replace_their_card_in_the_slice_under_nvidias_names() -> None:
    inventory = mig_node()
    slices = build_resource_slices(NODE, inventory, naming=NVIDIA_NAMING, generation=1)
    devices = devices_of(slices)
    # The card in MIG mode is not published whole; its instances are, named as NVIDIA names them.
    assert set(devices) == {"gpu-0-mig-1g10gb-19-0", "gpu-0-mig-3g40gb-9-4", "gpu-1"}
    three = devices["gpu-0-mig-3g40gb-9-4"]
    attributes = three["attributes"]
    mig = inventory.by_index(0).mig_devices[1]
    assert attributes["type"] == {"string": "mig"}
    assert attributes["profile"] == {"string": "3g.40gb"}
    assert attributes["uuid"] == {"string": mig.uuid}
    assert attributes["parentUUID"] == {"string": "GPU-00000000-0000-0000-0000-000000000000"}
    assert attributes["productName"] == {"string": H100}
    assert attributes["cudaComputeCapability"] == {"version": "9.0.0"}
    assert three["capacity"]["memory"] == {"value": "40448Mi"}
    assert three["capacity"]["multiprocessors"] == {"value": "60"}
    assert {k for k in three["capacity"] if k.startswith("memorySlice")} == {
        f"memorySlice{i}" for i in range(4, 8)
    }
    # A MIG device is one unit: no shares of it, no counters (static).
    assert "allowMultipleAllocations" not in three and "consumesCounters" not in three
    assert devices["gpu-1"]["attributes"]["type"] == {"string": "gpu"}
    assert mig_placement("gpu-0-mig-3g40gb-9-4") is not None


def test_an_unhealthy_card_taints_each_of_its_mig_devices() -> None:
    inventory = mig_node()
    parent = inventory.by_index(0).uuid
    slices = build_resource_slices(
        NODE, inventory, generation=1, unhealthy={parent: "Xid 79: fell off the bus"}
    )
    devices = devices_of(slices)
    assert all("taints" in devices[n] for n in devices if n.startswith("gpu-0-mig-"))
    assert "taints" not in devices["gpu-1"]
    # An Xid on one GPU instance marks that MIG device alone (by its own UUID).
    one = inventory.by_index(0).mig_devices[0]
    alone = devices_of(
        build_resource_slices(NODE, inventory, generation=2, unhealthy={one.uuid: "Xid 48"})
    )
    assert [n for n in alone if "taints" in alone[n]] == ["gpu-0-mig-1g10gb-19-0"]
    # kubegpu's naming: the card's index, and the profile as the mig.kubegpu.io class wants.
    assert devices["gpu-0-mig-1g10gb-19-0"]["attributes"]["index"] == {"int": 0}
    assert devices["gpu-0-mig-1g10gb-19-0"]["attributes"]["profile"] == {"string": "1g.10gb"}


def partition_slices(cards: int = 1) -> list[dict[str, Any]]:
    inventory = mig_node()
    gpus = tuple(replace(inventory.by_index(0), index=i, mig_devices=()) for i in range(cards))
    return build_resource_slices(
        NODE, replace(inventory, gpus=gpus), naming=NVIDIA_NAMING, generation=3, dynamic_mig=True
    )


def test_dynamic_mig_offers_every_placement_over_a_counter_set_in_slices_of_their_own() -> None:
    slices = partition_slices(cards=9)
    kinds = [("sharedCounters" in s["spec"], "devices" in s["spec"]) for s in slices]
    # Counter sets first, at most 8 per slice, never with devices in one slice (API rule).
    assert kinds[:2] == [(True, False), (True, False)]
    assert all(k == (False, True) for k in kinds[2:])
    assert [len(s["spec"]["sharedCounters"]) for s in slices[:2]] == [8, 1]
    assert all(len(s["spec"]["devices"]) <= 64 for s in slices[2:])
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    devices = devices_of(slices)
    per_card = 7 + 7 + 4 + 3 + 2 + 1 + 1
    assert len(devices) == 9 * per_card
    one = devices["gpu-0-mig-3g40gb-9-4"]
    assert "uuid" not in one["attributes"]  # no instance yet
    (consumes,) = one["consumesCounters"]
    assert consumes["counterSet"] == "gpu-0-counter-set"
    assert consumes["counters"] == {
        **{f"memory-slice-{i}": {"value": "1"} for i in range(4, 8)},
        "compute-slices": {"value": "3"},
    }


def fits_counters(chosen: list[dict[str, Any]], offered: dict[str, Any]) -> bool:
    used: dict[str, int] = {}
    for device in chosen:
        for name, counter in device["consumesCounters"][0]["counters"].items():
            used[name] = used.get(name, 0) + int(counter["value"])
    return all(used[n] <= int(offered[n]["value"]) for n in used)


def test_the_counters_admit_exactly_the_layouts_the_profile_table_allows() -> None:
    slices = partition_slices()
    (counter_set,) = slices[0]["spec"]["sharedCounters"]
    devices = list(devices_of(slices).values())
    by_name = {p.profile_id: p for p in profiles_of(H100)}

    def instance(device: dict[str, Any]) -> Instance:
        placement = mig_placement(device["name"])
        assert placement is not None
        return Instance(by_name[placement.profile_id], placement.start)

    def agree(chosen: list[dict[str, Any]]) -> None:
        allowed = layout_problem(instance(d) for d in chosen) == ""
        assert fits_counters(chosen, counter_set["counters"]) == allowed, [
            d["name"] for d in chosen
        ]

    for pair in itertools.combinations(devices, 2):
        agree(list(pair))
    rng = random.Random(30)
    for _ in range(3000):
        agree(rng.sample(devices, rng.randint(3, 7)))


def allocate(node: Node, claim: ClaimRef, device: str) -> None:
    node.claims.allocate(claim, AllocatedDevice("gpu", NODE, device))


CLAIM = ClaimRef("team-a", "mig", "eeeeeeee-0000-4000-8000-00000000a001")
OTHER = ClaimRef("team-a", "mig-2", "eeeeeeee-0000-4000-8000-00000000a002")


def env(spec: dict[str, Any]) -> dict[str, str]:
    (device,) = spec["devices"]
    return dict(line.split("=", 1) for line in device["containerEdits"]["env"])


async def test_a_static_mig_claim_is_prepared_with_its_own_uuid_and_cap_nodes(node: Node) -> None:
    node.inventory = mig_node()
    allocate(node, CLAIM, "gpu-0-mig-3g40gb-9-4")
    allocate(node, OTHER, "gpu-0-mig-2g20gb-14-0")  # the card holds no such instance
    async with DraPluginServer(node.preparer(), node.sockets):
        answer = await prepare(node, CLAIM, OTHER)
    assert answer.claims[CLAIM.uid].error == ""
    assert "holds no MIG device 'gpu-0-mig-2g20gb-14-0'" in answer.claims[OTHER.uid].error
    spec = cdi_spec(node, CLAIM)
    mig = node.inventory.by_index(0).mig_devices[1]
    assert env(spec)["NVIDIA_VISIBLE_DEVICES"] == mig.uuid
    (device,) = spec["devices"]
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == list(mig.device_nodes)


@pytest.fixture
def dynamic(node: Node) -> tuple[Node, FakeGpuBackend]:
    inventory = mig_node()
    emptied = replace(
        inventory,
        gpus=tuple(replace(g, mig_devices=()) if g.index == 0 else g for g in inventory.gpus),
    )
    backend = FakeGpuBackend(emptied)
    node.inventory = backend.snapshot()
    node.settings = replace(node.settings, dynamic_mig=True)
    return node, backend


async def test_dynamic_mig_creates_the_instance_on_prepare_and_destroys_it_on_unprepare(
    dynamic: tuple[Node, FakeGpuBackend],
) -> None:
    from kubegpu.dra.driver import ClaimPreparer

    node, backend = dynamic
    allocate(node, CLAIM, "gpu-0-mig-3g40gb-9-4")
    allocate(node, OTHER, "gpu-0-mig-3g40gb-9-0")
    preparer = ClaimPreparer(node.settings, node.inventory, node.claims, partitioner=backend)
    async with DraPluginServer(preparer, node.sockets):
        answer = await prepare(node, CLAIM, OTHER)
        assert {c.error for c in answer.claims.values()} == {""}
        card = backend.snapshot().by_index(0)
        assert sorted((m.profile, m.start) for m in card.mig_devices) == [
            ("3g.40gb", 0),
            ("3g.40gb", 4),
        ]
        made = next(m for m in card.mig_devices if m.start == 4)
        assert env(cdi_spec(node, CLAIM))["NVIDIA_VISIBLE_DEVICES"] == made.uuid
        # Prepared again (a kubelet retry): answered from the checkpoint, nothing created.
        await prepare(node, CLAIM)
        assert len(backend.snapshot().by_index(0).mig_devices) == 2
        await unprepare(node, CLAIM)
        left = backend.snapshot().by_index(0).mig_devices
        assert [(m.profile, m.start) for m in left] == [("3g.40gb", 0)]
        await unprepare(node, CLAIM)  # again: nothing left to destroy, no error
    # A driver starting over destroys what no prepared claim holds, and keeps the rest.
    stray = backend.create_mig_device(card.uuid, "1g.10gb", 6)
    restarted = ClaimPreparer(node.settings, node.inventory, node.claims, partitioner=backend)
    gone = restarted.mig.reconcile(
        d.device for c in restarted.checkpoint.claims().values() for d in c.devices
    )
    assert [m.uuid for m in gone] == [stray.uuid]
    assert [(m.profile, m.start) for m in backend.snapshot().by_index(0).mig_devices] == [
        ("3g.40gb", 0)
    ]


def test_static_mig_without_instances_publishes_nothing_for_the_card() -> None:
    inventory = mig_node()
    bare: GpuDevice = replace(inventory.by_index(0), mig_devices=())
    slices = build_resource_slices(
        NODE, replace(inventory, gpus=(bare, inventory.by_index(1))), generation=1
    )
    assert set(devices_of(slices)) == {"gpu-1"}


def test_the_kubelets_health_stream_names_each_static_mig_device() -> None:
    from kubegpu.dra.api.dra_health.v1alpha1 import api_pb2 as health_pb
    from kubegpu.dra.health_stream import health_response

    inventory = mig_node()
    one = inventory.by_index(0).mig_devices[0]
    answer = health_response(inventory, NODE, {one.uuid: "Xid 48"}, 0, 30)
    health = {d.device.device_name: d.health for d in answer.devices}
    assert set(health) == {"gpu-0-mig-1g10gb-19-0", "gpu-0-mig-3g40gb-9-4", "gpu-1"}
    unhealthy = [name for name, h in health.items() if h == health_pb.HealthStatus.UNHEALTHY]
    assert unhealthy == ["gpu-0-mig-1g10gb-19-0"]
