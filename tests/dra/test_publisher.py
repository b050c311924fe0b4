"""Publishing the node's ResourceSlices through the slice port (fake)."""

from __future__ import annotations

from kubegpu.core.dra import DEFAULT_DRIVER_NAME, KUBEGPU_NAMING
from kubegpu.core.dra_ports import FakeResourceSliceSink
from kubegpu.core.gpu import NodeInventory
from kubegpu.dra.publisher import ResourceSlicePublisher
from kubegpu.dra.slices import build_resource_slices

from .conftest import NODE

KEY = (NODE, DEFAULT_DRIVER_NAME)


def generation(sink: FakeResourceSliceSink) -> int:
    return int(sink.slices[KEY][0]["spec"]["pool"]["generation"])


async def test_first_publish_writes_the_pool_at_generation_one(inventory: NodeInventory) -> None:
    sink = FakeResourceSliceSink()
    assert await ResourceSlicePublisher(NODE, KUBEGPU_NAMING, sink).publish(inventory)
    assert sink.slices[KEY] == build_resource_slices(NODE, inventory, generation=1)


async def test_unchanged_devices_are_not_rewritten(inventory: NodeInventory) -> None:
    sink = FakeResourceSliceSink()
    publisher = ResourceSlicePublisher(NODE, KUBEGPU_NAMING, sink)
    await publisher.publish(inventory)
    assert not await publisher.publish(inventory)
    assert sink.applies == 1


async def test_health_change_taints_then_untaints_with_growing_generations(
    inventory: NodeInventory,
) -> None:
    sink = FakeResourceSliceSink()
    publisher = ResourceSlicePublisher(NODE, KUBEGPU_NAMING, sink)
    sick = inventory.gpus[1].uuid
    await publisher.publish(inventory)
    assert await publisher.publish(inventory, {sick: "xid-79"})
    devices = sink.slices[KEY][0]["spec"]["devices"]
    assert [("taints" in d) for d in devices] == [False, True]
    assert generation(sink) == 2
    assert await publisher.publish(inventory, {})
    assert all("taints" not in d for d in sink.slices[KEY][0]["spec"]["devices"])
    assert generation(sink) == 3


async def test_a_restarted_driver_continues_above_the_published_generation(
    inventory: NodeInventory,
) -> None:
    sink = FakeResourceSliceSink()
    first = ResourceSlicePublisher(NODE, KUBEGPU_NAMING, sink)
    await first.publish(inventory)
    await first.publish(inventory, {inventory.gpus[0].uuid: "lost"})
    restarted = ResourceSlicePublisher(NODE, KUBEGPU_NAMING, sink)
    assert await restarted.publish(inventory)
    assert generation(sink) == 3


async def test_forget_makes_the_next_publish_write_again(inventory: NodeInventory) -> None:
    # The kubelet wipes a node's slices when it restarts or loses the driver for 30 s.
    sink = FakeResourceSliceSink()
    publisher = ResourceSlicePublisher(NODE, KUBEGPU_NAMING, sink)
    await publisher.publish(inventory)
    sink.slices.clear()
    publisher.forget()
    assert await publisher.publish(inventory)
    assert sink.slices[KEY][0]["spec"]["devices"]
