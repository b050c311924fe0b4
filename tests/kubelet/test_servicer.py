"""The gRPC servicer in-process, over a real unix socket, with a plain gRPC client."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc import aio

from kubegpu.config import load_config
from kubegpu.core.health_feed import HealthFeed
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.kubelet.board import DeviceBoard
from kubegpu.kubelet.plans import build_plans
from kubegpu.kubelet.plugin import DevicePluginServicer, PluginServer
from tests.kubelet.conftest import short_tempdir

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

INV = resolve_fake_spec("8xV100-32GB-HybridCubeMesh").inventory


class Served:
    def __init__(self, server: PluginServer, stub: Any, board: DeviceBoard) -> None:
        self.server = server
        self.stub = stub
        self.board = board
        self.health = board.health


async def serve(**overrides: Any) -> tuple[PluginServer, aio.Channel, DeviceBoard]:
    config = load_config(None, overrides)
    (plan,) = build_plans(config, INV)
    board = DeviceBoard(HealthFeed(gpu.uuid for gpu in INV.gpus))
    server = PluginServer(
        DevicePluginServicer(plan, INV, config, board, "unit-node"), short_tempdir()
    )
    await server.start()
    channel = aio.insecure_channel(f"unix://{server.socket_path}")
    return server, channel, board


@pytest.fixture
async def whole() -> AsyncIterator[Served]:
    server, channel, board = await serve()
    yield Served(server, api_pb2_grpc.DevicePluginStub(channel), board)
    await channel.close()
    await server.stop()
    assert not server.socket_path.exists()
    shutil.rmtree(server.kubelet_dir, ignore_errors=True)


@pytest.fixture
async def replicated() -> AsyncIterator[Served]:
    server, channel, board = await serve(
        **{
            "sharing.timeSlicing.resources": [{"name": "nvidia.com/gpu", "replicas": 2}],
            "flags.plugin.preStartContainer": True,
        }
    )
    yield Served(server, api_pb2_grpc.DevicePluginStub(channel), board)
    await channel.close()
    await server.stop()
    shutil.rmtree(server.kubelet_dir, ignore_errors=True)


async def test_options_advertise_preferred_allocation_and_prestart_per_config(
    whole: Served, replicated: Served
) -> None:
    plain = await whole.stub.GetDevicePluginOptions(api_pb2.Empty())
    assert plain.get_preferred_allocation_available and not plain.pre_start_required
    shared = await replicated.stub.GetDevicePluginOptions(api_pb2.Empty())
    assert shared.pre_start_required
    await replicated.stub.PreStartContainer(
        api_pb2.PreStartContainerRequest(devices_ids=[f"{INV.gpus[0].uuid}::0"])
    )


async def test_allocate_answers_every_container_request_in_order(whole: Served) -> None:
    u = [g.uuid for g in INV.gpus]
    response = await whole.stub.Allocate(
        api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=[u[3]]),
                api_pb2.ContainerAllocateRequest(devices_ids=[u[5], u[1]]),
            ]
        )
    )
    visible = [r.envs["NVIDIA_VISIBLE_DEVICES"] for r in response.container_responses]
    assert visible == [u[3], f"{u[1]},{u[5]}"]


async def test_preferred_allocation_answers_each_container_with_must_include(
    whole: Served,
) -> None:
    u = [g.uuid for g in INV.gpus]
    response = await whole.stub.GetPreferredAllocation(
        api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=u, must_include_deviceIDs=[u[6]], allocation_size=2
                ),
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=u[:4], allocation_size=4
                ),
            ]
        )
    )
    first, second = (list(r.deviceIDs) for r in response.container_responses)
    assert u[6] in first and len(first) == 2
    assert sorted(second) == sorted(u[:4])


async def test_preferred_allocation_larger_than_available_is_invalid_argument(
    whole: Served,
) -> None:
    u = [g.uuid for g in INV.gpus]
    with pytest.raises(aio.AioRpcError) as err:
        await whole.stub.GetPreferredAllocation(
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=u[:2], allocation_size=3
                    )
                ]
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_stream_sends_a_full_list_on_every_health_change(replicated: Served) -> None:
    stream = replicated.stub.ListAndWatch(api_pb2.Empty())
    first = await asyncio.wait_for(stream.read(), 10)
    assert len(first.devices) == 16
    assert all(d.health == "Healthy" for d in first.devices)
    assert {d.topology.nodes[0].ID for d in first.devices} == {0, 1}

    bad = INV.gpus[5].uuid
    replicated.health.set_healthy(bad, False, "Xid 79")
    second = await asyncio.wait_for(stream.read(), 10)
    assert len(second.devices) == 16
    assert {d.ID for d in second.devices if d.health == "Unhealthy"} == {f"{bad}::0", f"{bad}::1"}

    replicated.health.set_healthy(bad, True, "recovered")
    third = await asyncio.wait_for(stream.read(), 10)
    assert all(d.health == "Healthy" for d in third.devices)
    stream.cancel()


async def test_unary_calls_are_answered_while_streams_are_open(whole: Served) -> None:
    streams = [whole.stub.ListAndWatch(api_pb2.Empty()) for _ in range(20)]
    for s in streams:
        await asyncio.wait_for(s.read(), 10)
    options = await asyncio.wait_for(whole.stub.GetDevicePluginOptions(api_pb2.Empty()), 10)
    assert options.get_preferred_allocation_available
    for s in streams:
        s.cancel()


# -- what the servicer refuses: each one a status with a short message, never a wrong answer --

U = [g.uuid for g in INV.gpus]
HUGE_ID = "GPU-" + "x" * 100_000


def allocate_request(*containers: list[str]) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=c) for c in containers]
    )


def preferred_request(
    available: list[str], must: list[str] | None = None, size: int = 1
) -> api_pb2.PreferredAllocationRequest:
    return api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available,
                must_include_deviceIDs=must or [],
                allocation_size=size,
            )
        ]
    )


async def refused(call: Any) -> aio.AioRpcError:
    with pytest.raises(aio.AioRpcError) as err:
        await call
    details = err.value.details() or ""
    assert len(details) < 1024, f"{len(details)} characters of status message"
    return err.value


async def test_allocate_refuses_a_device_id_listed_twice(whole: Served, replicated: Served) -> None:
    err = await refused(whole.stub.Allocate(allocate_request([U[1], U[2], U[1]])))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{U[1]!r} is listed twice" in (err.details() or "")
    err = await refused(replicated.stub.Allocate(allocate_request([f"{U[0]}::1", f"{U[0]}::1"])))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Two replicas of one card are two devices, not a duplicate.
    response = await replicated.stub.Allocate(allocate_request([f"{U[0]}::0", f"{U[0]}::1"]))
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == U[0]


async def test_allocate_refuses_an_unhealthy_device_naming_it_and_why(whole: Served) -> None:
    whole.health.set_healthy(U[3], False, "Xid 79")
    err = await refused(whole.stub.Allocate(allocate_request([U[2], U[3]])))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert U[3] in (err.details() or "") and "Xid 79" in (err.details() or "")
    whole.health.set_healthy(U[3], True, "recovered")
    await whole.stub.Allocate(allocate_request([U[2], U[3]]))


async def test_preferred_allocation_never_offers_an_unhealthy_device(whole: Served) -> None:
    whole.health.set_healthy(U[0], False, "Xid 48")
    response = await whole.stub.GetPreferredAllocation(preferred_request(U[:3], size=2))
    assert sorted(response.container_responses[0].deviceIDs) == sorted(U[1:3])
    err = await refused(whole.stub.GetPreferredAllocation(preferred_request(U[:3], size=3)))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    err = await refused(whole.stub.GetPreferredAllocation(preferred_request(U[:3], [U[0]], 2)))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert U[0] in (err.details() or "")


async def test_preferred_allocation_refuses_a_must_include_id_not_available(
    whole: Served,
) -> None:
    err = await refused(whole.stub.GetPreferredAllocation(preferred_request(U[:4], [U[6]], 2)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert U[6] in (err.details() or "") and "available" in (err.details() or "")


@pytest.mark.parametrize(
    ("available", "must", "size"),
    [
        ([U[0], U[1], U[0]], [], 2),
        (U[:4], [U[1], U[1]], 2),
        (U[:4], [], 0),
        (U[:4], [], -1),
    ],
    ids=["duplicate-available", "duplicate-must-include", "size-0", "size-negative"],
)
async def test_preferred_allocation_refuses_a_malformed_request(
    whole: Served, available: list[str], must: list[str], size: int
) -> None:
    err = await refused(whole.stub.GetPreferredAllocation(preferred_request(available, must, size)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_pre_start_refuses_an_unknown_or_repeated_device_id(replicated: Served) -> None:
    err = await refused(
        replicated.stub.PreStartContainer(
            api_pb2.PreStartContainerRequest(devices_ids=["GPU-not-here::0"])
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GPU-not-here::0" in (err.details() or "")
    twice = [f"{U[0]}::0", f"{U[0]}::0"]
    err = await refused(
        replicated.stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=twice))
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_an_id_of_any_length_is_cut_short_in_the_status(
    whole: Served, replicated: Served
) -> None:
    calls = [
        whole.stub.Allocate(allocate_request([HUGE_ID])),
        whole.stub.Allocate(allocate_request([U[0], HUGE_ID, HUGE_ID])),
        whole.stub.GetPreferredAllocation(preferred_request([HUGE_ID], size=1)),
        whole.stub.GetPreferredAllocation(preferred_request(U[:2], [HUGE_ID], 1)),
        replicated.stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=[HUGE_ID])),
        # Thousands of unknown ids: the message names a few and counts the rest.
        whole.stub.Allocate(allocate_request([f"GPU-unknown-{i:05d}" for i in range(5000)])),
    ]
    for call in calls:
        err = await refused(call)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert "GPU-xxxx" in (err.details() or "") or "GPU-unknown-00000" in (err.details() or "")
