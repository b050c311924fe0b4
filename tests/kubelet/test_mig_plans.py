"""The device plugin's MIG strategies (flags.migStrategy): which resource each card or MIG
device is advertised under, NVIDIA's refusals, and what Allocate and ListAndWatch say of MIG
devices over a real unix socket."""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc import aio

from kubegpu.config import load_config
from kubegpu.config.load import ConfigError
from kubegpu.core.gpu import GpuDevice, GpuUuid, NodeInventory
from kubegpu.core.health_feed import HealthFeed
from kubegpu.inventory.spec import parse_fake_spec, resolve_fake_spec
from kubegpu.kube.agent_api import LightkubeNodeApi
from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.kubelet.board import DeviceBoard
from kubegpu.kubelet.cdi import cdi_spec
from kubegpu.kubelet.inventory_publisher import InventoryPublisher
from kubegpu.kubelet.plans import all_gpus, all_migs, build_plans
from kubegpu.kubelet.plugin import DevicePluginServicer, PluginServer
from kubegpu.kubelet.resources import MigLayoutError, PlanError, ResourcePlan
from kubegpu.kubelet.retry import RetryBackoff
from kubegpu.sharing.annotations import INVENTORY_ANNOTATION, decode_inventory
from kubegpu.testing.apiserver import FakeApiServer, make_node
from kubegpu.testing.waiting import wait_until_async
from tests.kubelet.conftest import short_tempdir

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

NODE = resolve_fake_spec("4xH100-80GB-MIG").inventory
CARD0, CARD1, CARD2, CARD3 = NODE.gpus
ONE_G, TWO_G, THREE_G = (f"nvidia.com/mig-{p}" for p in ("1g.10gb", "2g.20gb", "3g.40gb"))


def plans(strategy: str, inventory: NodeInventory = NODE, **overrides: Any) -> list[ResourcePlan]:
    return build_plans(load_config(None, {"flags.migStrategy": strategy, **overrides}), inventory)


def by_name(found: list[ResourcePlan]) -> dict[str, list[str]]:
    return {p.resource_name: [d.device_id for d in p.devices] for p in found}


def migs(*cards: GpuDevice, profile: str | None = None) -> list[str]:
    return [m.uuid for g in cards for m in g.mig_devices if profile in (None, m.profile)]


def uniform(count: int = 2, *, profile: str = "1g.10gb") -> NodeInventory:
    """``count`` H100s in MIG mode, every one filled with ``profile`` instances."""
    starts = {"1g.10gb": range(7), "3g.40gb": (0, 4), "7g.80gb": (0,)}[profile]
    cards = "".join(
        f"""
  - index: {i}
    uuid: GPU-00000000-0000-0000-0000-00000000000{i}
    product_name: NVIDIA H100 80GB HBM3
    memory_total_mib: 81559
    pci_bus_id: "00000000:0{i}:00.0"
    mig_enabled: true
    mig_instances: [{", ".join(f"{{profile: {profile}, start: {s}}}" for s in starts)}]"""
        for i in range(count)
    )
    return parse_fake_spec("gpus:" + cards, name="t", source="t.yaml").inventory


# -- which resource ------------------------------------------------------------------------


def test_none_advertises_cards_in_mig_mode_as_whole_gpus_as_nvidia_does() -> None:
    assert by_name(plans("none")) == {"nvidia.com/gpu": [g.uuid for g in NODE.gpus]}


def test_under_none_a_card_in_mig_mode_is_unhealthy_with_any_of_its_instances() -> None:
    (plan,) = plans("none")
    bad = {GpuUuid(CARD1.mig_devices[4].uuid)}
    unhealthy = {s.device_id for s in plan.states(bad) if not s.healthy}
    assert unhealthy == {CARD1.uuid}


def test_mixed_advertises_one_resource_per_profile_beside_the_cards_outside_mig_mode() -> None:
    found = by_name(plans("mixed"))
    assert found == {
        "nvidia.com/gpu": [CARD3.uuid],
        THREE_G: migs(CARD0, CARD2, profile="3g.40gb"),
        TWO_G: migs(CARD0, profile="2g.20gb"),
        ONE_G: migs(CARD0, CARD1, profile="1g.10gb"),
    }
    assert {n: len(ids) for n, ids in found.items()} == {
        "nvidia.com/gpu": 1,
        THREE_G: 3,
        TWO_G: 1,
        ONE_G: 8,
    }
    assert all(i.startswith("MIG-") for n, ids in found.items() if "mig-" in n for i in ids)


def test_single_advertises_every_mig_device_as_nvidia_com_gpu() -> None:
    node = uniform()
    (plan,) = plans("single", node)
    assert plan.resource_name == "nvidia.com/gpu" and plan.mig and not plan.shared
    assert [d.device_id for d in plan.devices] == migs(*node.gpus)
    assert len(plan.devices) == 14


def test_single_without_a_card_in_mig_mode_serves_whole_gpus() -> None:
    a100 = resolve_fake_spec("8xA100-80GB-NVLink").inventory
    (plan,) = plans("single", a100)
    assert [d.device_id for d in plan.devices] == [g.uuid for g in a100.gpus]


@pytest.mark.parametrize(
    ("inventory", "message"),
    [
        pytest.param(
            NODE,
            "invalid MIG configuration: more than one MIG device type present on node",
            id="two-profiles",
        ),
        pytest.param(
            uniform(3, profile="3g.40gb"),
            "all devices on the node must be configured with the same migEnabled value",
            id="a-card-outside-mig-mode",
        ),
        pytest.param(
            uniform(2),
            "invalid MIG configuration: at least one device with migEnabled=true was not "
            "configured correctly: device 1 has no MIG devices configured",
            id="an-empty-card",
        ),
    ],
)
def test_single_refuses_a_node_that_is_not_uniform_in_nvidias_words(
    inventory: NodeInventory, message: str
) -> None:
    gpus = list(inventory.gpus)
    if "migEnabled value" in message:
        gpus[2] = dataclasses.replace(gpus[2], mig_enabled=False, mig_devices=())
    if "device 1" in message:
        gpus[1] = dataclasses.replace(gpus[1], mig_devices=())
    with pytest.raises(MigLayoutError) as caught:
        plans("single", dataclasses.replace(inventory, gpus=tuple(gpus)))
    assert str(caught.value) == message


def test_mixed_stops_on_a_profile_nvidia_has_no_resource_for() -> None:
    partial = dataclasses.replace(CARD0.mig_devices[0], profile="1c.3g.40gb")
    card = dataclasses.replace(CARD0, mig_devices=(partial, *CARD0.mig_devices[1:]))
    node = dataclasses.replace(NODE, gpus=(card, *NODE.gpus[1:]))
    with pytest.raises(
        MigLayoutError, match=re.escape("MIG profile '1c.3g.40gb' does not match any")
    ):
        plans("mixed", node)


def test_mixed_keeps_share_slots_and_peer_cards_to_the_cards_outside_mig_mode() -> None:
    found = plans("mixed", **{"sharing.gpuShare.enabled": True})
    (slots,) = [p for p in found if p.share_slots]
    assert {d.gpu.uuid for d in slots.devices} == {CARD3.uuid}
    with pytest.raises(PlanError, match="GPU 1 is in MIG mode"):
        plans("mixed", **{"sharing.gpuShare.enabled": True, "sharing.gpuShare.devices": [1, 3]})


def test_a_mig_profile_can_be_time_sliced_under_mixed() -> None:
    found = plans(
        "mixed",
        **{"sharing.timeSlicing.resources": [{"name": THREE_G, "replicas": 2}]},
    )
    (sliced,) = [p for p in found if p.resource_name == THREE_G]
    assert sliced.shared and sliced.mig
    three = migs(CARD0, CARD2, profile="3g.40gb")
    assert [d.device_id for d in sliced.devices] == [f"{u}::{k}" for u in three for k in (0, 1)]
    answer = sliced.allocate(load_config(None), [f"{three[1]}::1"])
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == three[1]


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        pytest.param(
            {"sharing.timeSlicing.resources": [{"name": THREE_G, "replicas": 2, "devices": [0]}]},
            "MIG devices of a resource are time-sliced all or none",
            id="a-subset-of-mig-devices",
        ),
    ],
)
def test_mixed_refuses_what_cannot_apply_to_mig_devices(
    overrides: dict[str, Any], fragment: str
) -> None:
    overrides["sharing.timeSlicing.renameByDefault"] = True
    with pytest.raises(PlanError, match=fragment):
        plans("mixed", **overrides)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        pytest.param(
            {
                "flags.migStrategy": "mixed",
                "sharing.gpuShare.enabled": True,
                "sharing.gpuShare.enforcement": "mps",
            },
            "using --mig-strategy=mixed is not supported with MPS",
            id="mixed-with-mps",
        ),
        pytest.param(
            {"sharing.timeSlicing.resources": [{"name": THREE_G, "replicas": 2}]},
            "a MIG profile's resource needs flags.migStrategy: mixed",
            id="mig-resource-without-mixed",
        ),
    ],
)
def test_the_config_refuses_mig_settings_that_do_not_go_together(
    overrides: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config(None, overrides)


# -- what a container is told ------------------------------------------------------------


def test_allocate_names_the_mig_device_by_uuid_or_index_with_its_three_device_nodes() -> None:
    (plan,) = [p for p in plans("mixed") if p.resource_name == TWO_G]
    (two,) = CARD0.mig_devices[1:2]
    assert plan.allocate(load_config(None), [two.uuid]).envs == {"NVIDIA_VISIBLE_DEVICES": two.uuid}
    config = load_config(
        None,
        {
            "flags.plugin.deviceIDStrategy": "index",
            "flags.plugin.passDeviceSpecs": True,
            "flags.plugin.deviceListStrategy": ["envvar", "cdi-cri"],
        },
    )
    answer = plan.allocate(config, [two.uuid])
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": "0:1"}
    assert answer.cdi_devices == ("k8s.kubegpu.io/gpu=0:1",)
    assert [n.container_path for n in answer.device_nodes] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        *two.device_nodes,
    ]
    assert two.device_nodes[0] == "/dev/nvidia0" and len(two.device_nodes) == 3


def test_two_mig_devices_of_one_card_share_its_node_once() -> None:
    (plan,) = [p for p in plans("mixed") if p.resource_name == ONE_G]
    a, b = CARD1.mig_devices[4], CARD1.mig_devices[1]
    config = load_config(None, {"flags.plugin.passDeviceSpecs": True})
    answer = plan.allocate(config, [a.uuid, b.uuid])
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == f"{b.uuid},{a.uuid}"  # card, then MIG index
    paths = [n.container_path for n in answer.device_nodes]
    assert paths.count("/dev/nvidia1") == 1 and len(paths) == 3 + 1 + 4


def test_the_cdi_spec_has_a_device_per_mig_device_with_its_caps() -> None:
    found = plans("mixed")
    spec = cdi_spec(all_gpus(found), "k8s.kubegpu.io/gpu", "uuid", migs=all_migs(found))
    devices = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert set(devices) == {CARD3.uuid, *migs(CARD0, CARD1, CARD2), "all"}
    three = CARD2.mig_devices[1]
    assert [n["path"] for n in devices[three.uuid]] == list(three.device_nodes)
    every = [n["path"] for n in devices["all"]]
    assert every[0] == "/dev/nvidia3" and len(every) == len(set(every)) == 1 + 3 + 2 * 12


# -- over the socket: ListAndWatch health and Allocate -------------------------------------


class Served:
    def __init__(self, plan: ResourcePlan, server: PluginServer, stub: Any, health: HealthFeed):
        self.plan, self.server, self.stub, self.health = plan, server, stub, health

    async def health_of(self) -> dict[str, str]:
        stream = self.stub.ListAndWatch(api_pb2.Empty())
        first = await stream.read()
        stream.cancel()
        return {d.ID: d.health for d in first.devices}


@pytest.fixture
async def one_g() -> AsyncIterator[Served]:
    config = load_config(None, {"flags.migStrategy": "mixed"})
    (plan,) = [p for p in build_plans(config, NODE) if p.resource_name == ONE_G]
    health = HealthFeed(g.uuid for g in NODE.gpus)
    board = DeviceBoard(health)
    server = PluginServer(DevicePluginServicer(plan, NODE, config, board, "unit"), short_tempdir())
    await server.start()
    channel = aio.insecure_channel(f"unix://{server.socket_path}")
    yield Served(plan, server, api_pb2_grpc.DevicePluginStub(channel), health)
    await channel.close()
    await server.stop()
    board.close()
    shutil.rmtree(server.kubelet_dir, ignore_errors=True)


async def test_a_mig_devices_own_verdict_marks_only_it_and_its_cards_marks_all_of_them(
    one_g: Served,
) -> None:
    assert set((await one_g.health_of()).values()) == {"Healthy"}
    one = CARD1.mig_devices[3]
    one_g.health.set_healthy(GpuUuid(one.uuid), False, "Xid 48: MIG GPU instance 4")
    seen = await one_g.health_of()
    assert {i for i, h in seen.items() if h == "Unhealthy"} == {one.uuid}
    one_g.health.set_healthy(CARD1.uuid, False, "Xid 79")
    seen = await one_g.health_of()
    assert {i for i, h in seen.items() if h == "Unhealthy"} == set(migs(CARD1))
    assert seen[CARD0.mig_devices[2].uuid] == "Healthy"


async def test_allocate_refuses_an_unhealthy_mig_device_and_serves_a_healthy_one(
    one_g: Served,
) -> None:
    bad, good = CARD1.mig_devices[0], CARD1.mig_devices[1]
    one_g.health.set_healthy(GpuUuid(bad.uuid), False, "Xid 48: MIG GPU instance 1")

    def request(uuid: str) -> api_pb2.AllocateRequest:
        return api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[uuid])]
        )

    with pytest.raises(aio.AioRpcError) as caught:
        await one_g.stub.Allocate(request(bad.uuid))
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "Xid 48" in str(caught.value.details())
    answer = await one_g.stub.Allocate(request(good.uuid))
    assert answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == good.uuid


async def test_preferred_allocation_offers_healthy_mig_devices_spread_over_cards(
    one_g: Served,
) -> None:
    one_g.health.set_healthy(GpuUuid(CARD1.mig_devices[0].uuid), False, "Xid 48")
    available = [d.device_id for d in one_g.plan.devices]
    response = await one_g.stub.GetPreferredAllocation(
        api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, allocation_size=2
                )
            ]
        )
    )
    chosen = list(response.container_responses[0].deviceIDs)
    assert CARD1.mig_devices[0].uuid not in chosen
    # distributed (the default policy): one from each card
    assert {one_g.plan.lookup(i).gpu.index for i in chosen} == {0, 1}


# -- the Node: inventory annotation and the peers' figures --------------------------------


async def test_cards_in_mig_mode_leave_the_inventory_annotation_and_the_peer_figures() -> None:
    config = load_config(
        None,
        {
            "flags.migStrategy": "mixed",
            "sharing.gpuShare.enabled": True,
            "sharing.gpuShare.compat.modes": ["volcano"],
        },
    )
    async with FakeApiServer() as server:
        server.store.put("nodes", make_node("n1"))
        api = LightkubeNodeApi(server.async_client(), "n1")
        publisher = InventoryPublisher(
            api, "n1", NODE, HealthFeed(g.uuid for g in NODE.gpus), RetryBackoff(), config
        )
        publisher.start()
        try:
            await wait_until_async(
                lambda: publisher.publications > 0, timeout_s=10, what="a publication"
            )
        finally:
            await publisher.stop()
            await api.close()
        node = server.store.get("nodes", "", "n1")
        assert node is not None
        published = decode_inventory(node["metadata"]["annotations"][INVENTORY_ANNOTATION])
        assert [g.uuid for g in published.gpus] == [CARD3.uuid]
        assert node["status"]["capacity"]["volcano.sh/gpu-memory"] == str(CARD3.memory_total_mib)
