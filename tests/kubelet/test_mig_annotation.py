"""The Node annotation ``kubegpu.io/mig-devices``: the cards the inventory leaves out under the
MIG strategies, by their MIG devices, published by the inventory publisher beside the inventory
(through the real lightkube client and the fake API server over HTTP)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from kubegpu.config import load_config
from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.core.health_feed import HealthFeed
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.kube.agent_api import LightkubeNodeApi
from kubegpu.kubelet.cluster import mig_records
from kubegpu.kubelet.inventory_publisher import InventoryPublisher
from kubegpu.kubelet.retry import RetryBackoff
from kubegpu.sharing.annotations import (
    INVENTORY_ANNOTATION,
    MIG_DEVICES_ANNOTATION,
    NodeMigDevices,
    decode_inventory,
    decode_mig_devices,
    encode_mig_devices,
)
from kubegpu.testing.apiserver import FakeApiServer, make_node
from kubegpu.testing.waiting import wait_until_async
from tests.kubelet.test_mig_plans import uniform

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

NODE = resolve_fake_spec("4xH100-80GB-MIG").inventory
CARD0, CARD1, CARD2, CARD3 = NODE.gpus


@dataclass
class Published:
    server: FakeApiServer
    publisher: InventoryPublisher

    def annotations(self) -> Mapping[str, str]:
        node = self.server.store.get("nodes", "", "n1")
        assert node is not None
        found: Mapping[str, str] = node["metadata"].get("annotations") or {}
        return found

    def mig(self) -> NodeMigDevices:
        return decode_mig_devices(self.annotations()[MIG_DEVICES_ANNOTATION])

    async def round(self) -> None:
        """Publish again now, and wait for it."""
        target = self.publisher.publications + 1
        self.publisher.changed()
        await wait_until_async(
            lambda: self.publisher.publications >= target, timeout_s=10, what="a publication"
        )


@pytest.fixture
async def published(request: pytest.FixtureRequest) -> AsyncIterator[Published]:
    """A publisher for ``NODE`` (or ``inventory``) under ``overrides`` of the agent config,
    against a Node that may already carry ``annotations``, after its first publication."""
    params: dict[str, Any] = getattr(request, "param", {})
    inventory: NodeInventory = params.get("inventory", NODE)
    health = HealthFeed(g.uuid for g in inventory.gpus)
    config = load_config(None, {"sharing.gpuShare.inventoryIntervalS": 3600, **params["config"]})
    async with FakeApiServer() as server:
        server.store.put("nodes", make_node("n1", annotations=params.get("annotations")))
        api = LightkubeNodeApi(server.async_client(), "n1")
        publisher = InventoryPublisher(api, "n1", inventory, health, RetryBackoff(), config)
        publisher.start()
        try:
            await wait_until_async(
                lambda: publisher.publications > 0, timeout_s=10, what="a publication"
            )
            yield Published(server, publisher)
        finally:
            await publisher.stop()
            await api.close()


MIXED = {"config": {"flags.migStrategy": "mixed"}}


@pytest.mark.parametrize("published", [MIXED], indirect=True)
async def test_under_mixed_the_cards_in_mig_mode_are_published_by_their_mig_devices(
    published: Published,
) -> None:
    inventory = decode_inventory(published.annotations()[INVENTORY_ANNOTATION])
    assert [g.uuid for g in inventory.gpus] == [CARD3.uuid]
    mig = published.mig()
    assert [(g.index, g.uuid, g.model, g.memory_mib) for g in mig.gpus] == [
        (g.index, g.uuid, g.product_name, g.memory_total_mib) for g in (CARD0, CARD1, CARD2)
    ]
    card0 = mig.gpus[0]
    assert [
        (d.uuid, d.profile, d.start, d.slices, d.memory_mib, d.gpu_instance_id, d.resource)
        for d in card0.devices
    ] == [
        (m.uuid, m.profile, m.start, m.memory_slices, m.memory_total_mib, m.gpu_instance_id, r)
        for m, r in zip(
            CARD0.mig_devices,
            ["nvidia.com/mig-3g.40gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-1g.10gb"],
            strict=True,
        )
    ]
    assert all(d.healthy for g in mig.gpus for d in g.devices)
    assert len(mig.gpus[1].devices) == 7


@pytest.mark.parametrize("published", [MIXED], indirect=True)
async def test_a_health_change_republishes_the_mig_device_and_its_cards_devices(
    published: Published,
) -> None:
    health = published.publisher.health
    health.set_healthy(GpuUuid(CARD1.mig_devices[2].uuid), False, "Xid 48")
    health.set_healthy(CARD2.uuid, False, "Xid 79")
    await published.round()
    _, card1, card2 = published.mig().gpus
    assert card1.healthy and [d.healthy for d in card1.devices] == [True] * 2 + [False] + [True] * 4
    assert not card2.healthy and not any(d.healthy for d in card2.devices)


@pytest.mark.parametrize(
    "published",
    [{"config": {"flags.migStrategy": "single"}, "inventory": uniform(2)}],
    indirect=True,
)
async def test_under_single_the_mig_devices_go_by_the_cards_own_resource(
    published: Published,
) -> None:
    assert decode_inventory(published.annotations()[INVENTORY_ANNOTATION]).gpus == ()
    mig = published.mig()
    assert [len(g.devices) for g in mig.gpus] == [7, 7]
    assert {d.resource for g in mig.gpus for d in g.devices} == {"nvidia.com/gpu"}


@pytest.mark.parametrize(
    "published",
    [
        {
            "config": {
                "flags.migStrategy": "mixed",
                "sharing.timeSlicing.resources": [
                    {"name": "nvidia.com/mig-1g.10gb", "replicas": 2, "devices": "all"}
                ],
                "sharing.timeSlicing.renameByDefault": True,
            }
        }
    ],
    indirect=True,
)
async def test_a_time_sliced_mig_device_carries_the_resource_its_replicas_go_by(
    published: Published,
) -> None:
    resources = {d.profile: d.resource for g in published.mig().gpus for d in g.devices}
    assert resources["1g.10gb"] == "nvidia.com/mig-1g.10gb.shared"
    assert resources["3g.40gb"] == "nvidia.com/mig-3g.40gb"


STALE = encode_mig_devices(mig_records([CARD0]) or NodeMigDevices(()))


@pytest.mark.parametrize(
    "published",
    [{"config": {"flags.migStrategy": "none"}, "annotations": {MIG_DEVICES_ANNOTATION: STALE}}],
    indirect=True,
)
async def test_under_none_a_stale_annotation_is_removed_and_others_are_kept(
    published: Published,
) -> None:
    annotations = published.annotations()
    assert MIG_DEVICES_ANNOTATION not in annotations
    # Every card is whole under none: all four are in the inventory.
    assert len(decode_inventory(annotations[INVENTORY_ANNOTATION]).gpus) == 4


@pytest.mark.parametrize("published", [MIXED], indirect=True)
async def test_an_unchanged_layout_is_not_written_again(published: Published) -> None:
    patches = published.server.count("patch", "nodes")
    await published.round()
    assert published.server.count("patch", "nodes") == patches


def test_no_card_in_mig_mode_publishes_nothing() -> None:
    assert mig_records([]) is None
    assert mig_records([CARD3]) is not None  # a card in the list is published, devices or not
