"""``serve_dra_driver``: the whole node edge, as the ``kubegpu dra-driver`` role will run it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from kubegpu.core.dra import AllocatedDevice, ClaimRef
from kubegpu.core.dra_ports import FakeResourceSliceSink
from kubegpu.dra.api.dra.v1 import api_pb2 as v1
from kubegpu.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from kubegpu.dra.api.pluginregistration.v1 import api_pb2 as reg
from kubegpu.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubegpu.testing.waiting import wait_until_async
from kubegpu.unix_channels import unix_aio_channel

from .conftest import NODE, Node, serve_node

WAIT_S = 20.0

CLAIM = ClaimRef("team-a", "train", "bbbbbbbb-0000-4000-8000-000000000001")


async def test_publishes_serves_and_cleans_up_on_stop(node: Node) -> None:
    sink = FakeResourceSliceSink()
    sick = node.inventory.gpus[0].uuid
    task, stop = await serve_node(node, sink, unhealthy=lambda: {sick: "xid-79"})
    (published,) = sink.slices[(NODE, node.settings.driver)]
    assert "taints" in published["spec"]["devices"][0]

    node.claims.allocate(CLAIM, AllocatedDevice("gpu", NODE, "gpu-1"))
    async with unix_aio_channel(node.sockets.dra) as channel:
        response = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
            v1.NodePrepareResourcesRequest(
                claims=[v1.Claim(namespace=CLAIM.namespace, name=CLAIM.name, uid=CLAIM.uid)]
            ),
            timeout=10,
        )
    assert response.claims[CLAIM.uid].devices[0].device_name == "gpu-1"

    stop.set()
    await task
    assert not node.sockets.registration.exists()
    assert not node.sockets.dra.exists()


async def test_a_kubelet_refusal_ends_the_driver(node: Node) -> None:
    task, stop = await serve_node(node, FakeResourceSliceSink())
    async with unix_aio_channel(node.sockets.registration) as channel:
        stub = reg_grpc.RegistrationStub(channel)
        await stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True))
        assert not stop.is_set()
        await stub.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=False, error="plugin validation failed")
        )
    await task
    assert stop.is_set()
    assert not node.sockets.registration.exists()


async def _until(condition: Callable[[], bool]) -> None:
    await wait_until_async(condition, timeout_s=WAIT_S, what="the driver's loop to get there")


async def test_republishes_the_taint_when_health_changes_and_drops_it_on_recovery(
    node: Node,
) -> None:
    sink = FakeResourceSliceSink()
    changed = asyncio.Event()
    sick: dict[str, str] = {}
    task, stop = await serve_node(node, sink, unhealthy=lambda: dict(sick), health_changed=changed)

    def taints() -> list[str]:
        (published,) = sink.slices[(NODE, node.settings.driver)]
        return [d["name"] for d in published["spec"]["devices"] if "taints" in d]

    assert taints() == []
    sick[node.inventory.gpus[1].uuid] = "Xid 48"
    changed.set()
    await _until(lambda: taints() == ["gpu-1"])
    applies = sink.applies
    changed.set()  # a change that changes no device (an Xid counted) writes nothing
    await _until(lambda: not changed.is_set())
    sick.clear()
    changed.set()
    await _until(lambda: taints() == [])
    assert sink.applies == applies + 1
    stop.set()
    assert await task is False


class FlakySink(FakeResourceSliceSink):
    """Fails the writes after the first ``failures`` times, like an API server gone away."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0

    async def apply_slices(
        self, node_name: str, driver: str, slices: Sequence[dict[str, Any]]
    ) -> None:
        if self.applies and self.failures:
            self.failures -= 1
            raise ConnectionError("API server unreachable")
        await super().apply_slices(node_name, driver, slices)


async def test_a_failed_republish_is_retried_until_it_goes_through(node: Node) -> None:
    sink = FlakySink()
    changed = asyncio.Event()
    sick: dict[str, str] = {}
    task, stop = await serve_node(
        node, sink, unhealthy=lambda: dict(sick), health_changed=changed, retry_s=0.01
    )
    sink.failures = 3
    sick[node.inventory.gpus[0].uuid] = "Xid 79"
    changed.set()  # one change only: the retries come from the driver, not from new events
    await _until(lambda: sink.applies == 2)
    assert sink.failures == 0
    (published,) = sink.slices[(NODE, node.settings.driver)]
    assert "taints" in published["spec"]["devices"][0]
    stop.set()
    await task


async def test_slices_the_kubelet_wiped_are_written_again_when_it_registers_the_driver(
    node: Node,
) -> None:
    sink = FakeResourceSliceSink()
    task, stop = await serve_node(node, sink)
    (first,) = sink.slices.pop((NODE, node.settings.driver))  # a starting kubelet's wipe
    async with unix_aio_channel(node.sockets.registration) as channel:
        stub = reg_grpc.RegistrationStub(channel)
        await stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True))
    await _until(lambda: (NODE, node.settings.driver) in sink.slices)
    (again,) = sink.slices[(NODE, node.settings.driver)]
    assert again["spec"]["devices"] == first["spec"]["devices"]
    assert again["spec"]["pool"]["generation"] > first["spec"]["pool"]["generation"]
    stop.set()
    assert await task is False
