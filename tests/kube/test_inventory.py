"""The node inventory publisher through the real lightkube client and the fake API server."""

from __future__ import annotations

from collections.abc import Iterator

import lightkube
import pytest
from lightkube.resources.core_v1 import Node

from kubegpu.core.gpu import GpuDevice, GpuUuid, NodeInventory
from kubegpu.kube.inventory import publish_node_inventory, read_node_inventory
from kubegpu.kubelet.cluster import inventory_records
from kubegpu.sharing.annotations import INVENTORY_ANNOTATION, AnnotationError
from kubegpu.testing.apiserver import ServerThread, make_node


def device(index: int, model: str = "NVIDIA H200", memory: int = 143771) -> GpuDevice:
    return GpuDevice(
        index=index,
        uuid=GpuUuid(f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000"),
        product_name=model,
        memory_total_mib=memory,
        pci_bus_id=f"00000000:{index + 16:02X}:00.0",
        minor_number=index,
    )


INVENTORY = NodeInventory(gpus=tuple(device(i) for i in range(8)))


@pytest.fixture
def client(fake_api_server: ServerThread) -> Iterator[lightkube.Client]:
    with fake_api_server.client() as client:
        client.create(Node.from_dict(make_node("gpu-1", annotations={"keep": "me"})))
        yield client


def test_publishes_every_card_with_uuid_index_model_memory_and_health(
    client: lightkube.Client,
) -> None:
    records = inventory_records(INVENTORY, unhealthy={str(device(3).uuid)})
    assert publish_node_inventory(client, "gpu-1", records)
    node = client.get(Node, "gpu-1")
    published = read_node_inventory(node)
    assert published == records
    assert [g.healthy for g in published.gpus] == [True] * 3 + [False] + [True] * 4
    assert published.gpus[0].memory_mib == 143771 and published.gpus[0].model == "NVIDIA H200"
    assert node.metadata.annotations["keep"] == "me"


def test_republishing_the_same_inventory_writes_nothing(
    client: lightkube.Client, fake_api_server: ServerThread
) -> None:
    records = inventory_records(INVENTORY)
    assert publish_node_inventory(client, "gpu-1", records)
    patches = fake_api_server.count("patch", "nodes")
    assert not publish_node_inventory(client, "gpu-1", records)
    assert fake_api_server.count("patch", "nodes") == patches


def test_a_health_change_rewrites_the_whole_document(client: lightkube.Client) -> None:
    publish_node_inventory(client, "gpu-1", inventory_records(INVENTORY))
    publish_node_inventory(client, "gpu-1", inventory_records(INVENTORY, {str(device(0).uuid)}))
    published = read_node_inventory(client.get(Node, "gpu-1"))
    assert published is not None and not published.gpus[0].healthy


def test_a_restarted_agent_reasserts_over_whatever_was_there(client: lightkube.Client) -> None:
    client.patch(Node, "gpu-1", {"metadata": {"annotations": {INVENTORY_ANNOTATION: "garbage"}}})
    with pytest.raises(AnnotationError, match="not JSON"):
        read_node_inventory(client.get(Node, "gpu-1"))
    assert publish_node_inventory(client, "gpu-1", inventory_records(INVENTORY))
    assert read_node_inventory(client.get(Node, "gpu-1")) == inventory_records(INVENTORY)


def test_inventory_on_eight_141_gb_cards_stays_small() -> None:
    from kubegpu.sharing.annotations import encode_inventory

    # Annotations share a 256 KiB budget per object; ours uses a tiny part of it.
    assert len(encode_inventory(inventory_records(INVENTORY))) < 2048
