"""The kubelet's device-health stream (``v1alpha1.DRAResourceHealth``) over the real DRA socket:
every GPU's verdict at once, a flip pushed without waiting for the heartbeat, heartbeats that
keep the kubelet from marking devices Unknown, and streams that end with the driver."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from kubegpu.core.dra_ports import FakeResourceSliceSink
from kubegpu.core.gpu import NodeInventory
from kubegpu.dra.api.dra_health.v1alpha1 import api_pb2 as health_pb
from kubegpu.dra.api.dra_health.v1alpha1 import api_pb2_grpc as health_grpc
from kubegpu.dra.health_stream import DeviceHealthServicer, health_response
from kubegpu.unix_channels import unix_aio_channel

from .conftest import NODE, Node, gpu, serve_node

HEALTHY = health_pb.HealthStatus.HEALTHY
UNHEALTHY = health_pb.HealthStatus.UNHEALTHY


def verdicts(response: Any) -> dict[str, int]:
    return {d.device.device_name: d.health for d in response.devices}


def test_every_gpu_is_listed_in_the_node_pool_with_its_verdict() -> None:
    inventory = NodeInventory(gpus=(gpu(1), gpu(0)))
    response = health_response(inventory, NODE, {gpu(1).uuid: "Xid 48"}, 1_700_000_000, 30)
    assert [d.device.device_name for d in response.devices] == ["gpu-0", "gpu-1"]
    assert verdicts(response) == {"gpu-0": HEALTHY, "gpu-1": UNHEALTHY}
    for device in response.devices:
        assert device.device.pool_name == NODE
        assert device.last_updated_time == 1_700_000_000
        assert device.health_check_timeout_seconds == 30


def test_the_timeout_spans_several_heartbeats_and_a_bad_heartbeat_is_refused(
    inventory: NodeInventory,
) -> None:
    servicer = DeviceHealthServicer(NODE, NODE, inventory, dict, heartbeat_s=10)
    assert servicer.timeout_s == 30
    with pytest.raises(ValueError, match="heartbeat_s"):
        DeviceHealthServicer(NODE, NODE, inventory, dict, heartbeat_s=0)


async def test_the_stream_sends_at_once_on_a_flip_and_on_each_heartbeat(node: Node) -> None:
    changed = asyncio.Event()
    sick: dict[str, str] = {}
    task, stop = await serve_node(
        node, FakeResourceSliceSink(), unhealthy=lambda: dict(sick), health_changed=changed
    )
    async with unix_aio_channel(node.sockets.dra) as channel:
        stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_pb.NodeWatchResourcesRequest()
        )
        first = await asyncio.wait_for(stream.read(), 10)
        assert verdicts(first) == {"gpu-0": HEALTHY, "gpu-1": HEALTHY}
        assert all(d.health_check_timeout_seconds > 0 for d in first.devices)
        # A flip reaches the stream long before the 10 s heartbeat.
        sick[node.inventory.gpus[1].uuid] = "Xid 48"
        changed.set()
        flipped = await asyncio.wait_for(stream.read(), 5)
        assert verdicts(flipped) == {"gpu-0": HEALTHY, "gpu-1": UNHEALTHY}
        sick.clear()
        changed.set()
        recovered = await asyncio.wait_for(stream.read(), 5)
        assert verdicts(recovered) == {"gpu-0": HEALTHY, "gpu-1": HEALTHY}
        # Stopping the driver ends the stream (no wait for the server's grace period).
        stop.set()
        assert await asyncio.wait_for(stream.read(), 5) is grpc.aio.EOF
    assert await task is False


async def test_heartbeats_come_without_any_change(inventory: NodeInventory) -> None:
    ticks = iter(range(100, 200))
    servicer = DeviceHealthServicer(
        NODE, NODE, inventory, dict, heartbeat_s=0.05, clock=lambda: next(ticks)
    )
    stream = servicer.NodeWatchResources(health_pb.NodeWatchResourcesRequest(), None)
    stamps = [(await anext(stream)).devices[0].last_updated_time for _ in range(3)]
    assert stamps == [100, 101, 102]
    assert servicer.streams == 1
    servicer.close()
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    assert servicer.streams == 0
