"""Steering DRA's first fit from the driver (``kubegpu.dra.steering``): the cards' free state
from the claims allocated from the pool, the order the simulator's ``steered`` mode would
publish, and the driver's loop re-publishing its ResourceSlice only when that order changes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kubegpu.core.dra import KUBEGPU_NAMING, AllocatedDevice, ClaimRef
from kubegpu.core.dra_ports import FakeResourceClaimSource, FakeResourceSliceSink
from kubegpu.core.gpu import NodeInventory
from kubegpu.dra.publisher import ResourceSlicePublisher
from kubegpu.dra.slices import build_resource_slices
from kubegpu.dra.steering import DeviceSteerer, card_free_milli, steered_order
from kubegpu.placement.device_order import CardChoice, DeviceOrderEngine
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.testing.waiting import wait_until_async

from .conftest import NODE, Node, gpu, serve_node

GIB = 2**30
CPU = 64_000
WAIT_S = 20.0


def share(milli: int) -> PodRequest:
    return PodRequest(1000, 1024, 1, milli, name=f"share-{milli}")


# The worked example of tests/placement/test_device_order.py: 80 % shares of 500 milli, 20 %
# of 300. A card with 600 free takes a 500 share badly (a 100-milli sliver no share fits), a
# full card well (500 left, the next 500 fills it): our policy, and the steered order, put the
# full card first; first fit in index order takes the 600 one.
WORKLOAD = TypicalWorkload.from_pods([share(500)] * 8 + [share(300)] * 2)


def shared(device: str, memory_gib: int, compute: int, pool: str = NODE) -> AllocatedDevice:
    return AllocatedDevice("gpu", pool, device, "share", memory_gib * GIB, compute)


def two_cards() -> NodeInventory:
    return NodeInventory(gpus=(gpu(0, memory_mib=80 * 1024), gpu(1, memory_mib=80 * 1024)))


# ------------------------------------------------------------------ the cards' free state
def test_free_milli_is_the_smaller_of_free_memory_and_free_compute() -> None:
    inventory = NodeInventory(gpus=(gpu(0, 80 * 1024), gpu(1, 80 * 1024), gpu(2, 80 * 1024)))
    free = card_free_milli(
        inventory,
        NODE,
        [
            shared("gpu-0", 32, 250),  # memory-bound: 40 % of the memory, 25 % of compute
            shared("gpu-0", 8, 100),  # a second share of the same card adds up
            shared("gpu-1", 8, 700),  # compute-bound
            AllocatedDevice("gpu", NODE, "gpu-2"),  # a whole card: nothing left
        ],
    )
    assert free == {0: 500, 1: 300, 2: 0}


def test_free_milli_ignores_other_pools_and_devices_we_never_publish() -> None:
    free = card_free_milli(
        two_cards(),
        NODE,
        [
            shared("gpu-0", 40, 500, pool="node-b"),
            shared("gpu-7", 40, 500),
            AllocatedDevice("gpu", NODE, "not-a-gpu"),
        ],
    )
    assert free == {0: 1000, 1: 1000}


def test_free_milli_never_goes_below_zero() -> None:
    # The allocator never over-commits; if the claims said otherwise, the card is just full.
    free = card_free_milli(two_cards(), NODE, [shared("gpu-0", 80, 600), shared("gpu-0", 8, 600)])
    assert free[0] == 0


# --------------------------------------------------------------------------- the order
def test_the_order_is_the_simulators_steered_order_for_the_same_cards() -> None:
    order = steered_order(two_cards(), {0: 600, 1: 1000}, WORKLOAD, CPU)
    assert order == (1, 0)  # not index order: the full card first, as our policy chooses
    # The same node in the simulator's engine gives the same order.
    node = NodeState("a", CPU, CPU, 1 << 20, "A100", (GpuState(0, 600), GpuState(1, 1000)))
    engine = DeviceOrderEngine([node], "kubegpu", WORKLOAD, card_choice=CardChoice.STEERED)
    assert tuple(engine.device_order(0).tolist()) == order


def test_cards_with_the_same_free_state_keep_index_order() -> None:
    assert steered_order(two_cards(), {0: 1000, 1: 1000}, WORKLOAD, CPU) == (0, 1)


def test_the_order_names_gpu_indices_not_positions() -> None:
    # GPUs 3 and 5 (say 4 is gone): the order is in their indices.
    inventory = NodeInventory(gpus=(gpu(5, 80 * 1024), gpu(3, 80 * 1024)))
    assert steered_order(inventory, {3: 600, 5: 1000}, WORKLOAD, CPU) == (5, 3)


def test_a_full_card_comes_last() -> None:
    inventory = NodeInventory(gpus=(gpu(0, 80 * 1024), gpu(1, 80 * 1024), gpu(2, 80 * 1024)))
    assert steered_order(inventory, {0: 0, 1: 600, 2: 1000}, WORKLOAD, CPU) == (2, 1, 0)


# ------------------------------------------------------------------- slices and publisher
def names(slices: list[dict[str, object]]) -> list[str]:
    return [d["name"] for s in slices for d in s["spec"]["devices"]]  # type: ignore[index]


def test_slices_list_the_devices_in_the_order_given() -> None:
    inventory = NodeInventory(gpus=(gpu(0), gpu(1), gpu(2)))
    build = build_resource_slices
    assert names(build(NODE, inventory, generation=1)) == ["gpu-0", "gpu-1", "gpu-2"]
    assert names(build(NODE, inventory, generation=1, order=(2, 0, 1))) == [
        "gpu-2",
        "gpu-0",
        "gpu-1",
    ]
    # GPUs the order leaves out follow in index order; indices the node lacks are ignored.
    assert names(build(NODE, inventory, generation=1, order=(9, 1))) == [
        "gpu-1",
        "gpu-0",
        "gpu-2",
    ]


async def test_a_new_order_is_published_under_a_new_generation_the_same_order_is_not() -> None:
    sink = FakeResourceSliceSink()
    publisher = ResourceSlicePublisher(NODE, KUBEGPU_NAMING, sink)
    inventory = two_cards()
    assert await publisher.publish(inventory, order=(0, 1))
    assert not await publisher.publish(inventory, order=(0, 1))
    assert not await publisher.publish(inventory)  # index order is that order
    assert await publisher.publish(inventory, order=(1, 0))
    (published,) = sink.slices[(NODE, KUBEGPU_NAMING.driver)]
    assert names([published]) == ["gpu-1", "gpu-0"]
    assert published["spec"]["pool"]["generation"] == 2
    assert sink.applies == 2


# --------------------------------------------------------------------------- the steerer
async def test_the_steerer_follows_the_claims_allocated_from_the_pool() -> None:
    claims = FakeResourceClaimSource()
    steerer = DeviceSteerer(two_cards(), "d", NODE, claims, WORKLOAD, CPU)
    assert await steerer.order() == (0, 1)
    claims.allocate(ClaimRef("ns", "a", "uid-a"), shared("gpu-0", 32, 400))
    assert await steerer.order() == (1, 0)
    claims.deallocate("uid-a")
    assert await steerer.order() == (0, 1)
    assert claims.pool_lists == 3


async def test_the_steerer_raises_what_the_port_raises() -> None:
    claims = FakeResourceClaimSource()
    claims.fail_lists = True
    with pytest.raises(ConnectionError):
        await DeviceSteerer(two_cards(), "d", NODE, claims, WORKLOAD, CPU).order()


# ------------------------------------------------------------------- the driver's loop
async def _until(condition: Callable[[], bool]) -> None:
    await wait_until_async(condition, timeout_s=WAIT_S, what="the driver's loop to get there")


async def test_the_driver_republishes_its_slice_in_the_steered_order_when_it_changes(
    node: Node,
) -> None:
    inventory = two_cards()
    sink = FakeResourceSliceSink()
    steerer = DeviceSteerer(inventory, node.settings.driver, NODE, node.claims, WORKLOAD, CPU)
    task, stop = await serve_node(
        node, sink, inventory=inventory, steer=steerer.order, steer_interval_s=0.01
    )
    key = (NODE, node.settings.driver)
    assert names(sink.slices[key]) == ["gpu-0", "gpu-1"]
    assert sink.applies == 1

    # The scheduler allocates a 40 % share of gpu-0: the next share should go to gpu-1 first.
    node.claims.allocate(ClaimRef("ns", "a", "uid-a"), shared("gpu-0", 32, 400))
    await _until(lambda: names(sink.slices[key]) == ["gpu-1", "gpu-0"])
    assert sink.applies == 2
    # Polls that find the same order write nothing.
    lists = node.claims.pool_lists
    await _until(lambda: node.claims.pool_lists >= lists + 3)
    assert sink.applies == 2

    # The API server away: the order is kept, the driver keeps serving, and steers again
    # once it is back.
    node.claims.fail_lists = True
    lists = node.claims.pool_lists
    await _until(lambda: node.claims.pool_lists >= lists + 2)
    assert names(sink.slices[key]) == ["gpu-1", "gpu-0"]
    assert not task.done()
    node.claims.deallocate("uid-a")
    node.claims.fail_lists = False
    await _until(lambda: names(sink.slices[key]) == ["gpu-0", "gpu-1"])
    assert sink.slices[key][0]["spec"]["pool"]["generation"] == 3
    stop.set()
    assert await task is False


async def test_without_steering_the_driver_never_reads_the_pools_claims(node: Node) -> None:
    sink = FakeResourceSliceSink()
    task, stop = await serve_node(node, sink)
    stop.set()
    await task
    assert node.claims.pool_lists == 0
