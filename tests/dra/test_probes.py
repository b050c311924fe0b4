"""The DRA driver's ``/healthz`` and ``/readyz`` checks (:class:`DriverProbes`), fed by
``serve_dra_driver`` over the real sockets; the endpoints over HTTP against the real process are
in tests/deploy/test_probes.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kubegpu.core.dra_ports import FakeResourceSliceSink
from kubegpu.dra.api.pluginregistration.v1 import api_pb2 as reg
from kubegpu.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubegpu.dra.probes import DriverProbes
from kubegpu.dra.server import claim_sockets, wait_for_sockets
from kubegpu.socket_claim import lock_path_of
from kubegpu.testing.waiting import wait_until_async
from kubegpu.unix_channels import unix_aio_channel

from .conftest import NODE, Node, serve_node

DRIVER = "gpu.kubegpu.io"


async def _notify(node: Node, registered: bool, error: str = "") -> None:
    async with unix_aio_channel(node.sockets.registration) as channel:
        await reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=registered, error=error), timeout=10
        )


async def test_ready_only_once_published_and_registered_and_alive_while_serving(
    node: Node,
) -> None:
    probes = DriverProbes(NODE, DRIVER)
    assert not (await probes.liveness()).ok
    assert (await probes.liveness()).reason.startswith("starting:")
    task, stop = await serve_node(node, FakeResourceSliceSink(), probes=probes)

    alive = await probes.liveness()
    assert alive.ok, alive.reason
    assert str(node.sockets.registration) in alive.reason
    ready = await probes.readiness()
    assert not ready.ok
    assert "not registered" in ready.reason and "NotifyRegistrationStatus" in ready.reason

    await _notify(node, registered=True)
    ready = await probes.readiness()
    assert ready.ok, ready.reason
    # Generation 1, or 2 once the republish that registration asks for is through.
    assert f"ResourceSlices of node {NODE} published (generation " in ready.reason

    stop.set()
    assert await task is False
    assert (await probes.liveness()).reason.startswith("stopping:")
    assert not (await probes.readiness()).ok


async def test_a_kubelet_refusal_is_named_by_readiness(node: Node) -> None:
    probes = DriverProbes(NODE, DRIVER)
    task, _ = await serve_node(node, FakeResourceSliceSink(), probes=probes)
    await _notify(node, registered=False, error="version not supported")
    assert await task is True
    ready = await probes.readiness()
    assert not ready.ok
    assert ready.reason == f"not registered: the kubelet refused {DRIVER}: version not supported"


async def test_a_republish_after_registration_shows_its_generation(node: Node) -> None:
    # The kubelet's registration makes the driver write its slices again (a new generation).
    sink = FakeResourceSliceSink()
    probes = DriverProbes(NODE, DRIVER)
    task, stop = await serve_node(node, sink, probes=probes)
    sink.slices.clear()  # a starting kubelet's wipe
    await _notify(node, registered=True)
    await wait_until_async(lambda: sink.applies == 2, timeout_s=20, what="the slices written again")
    ready = await probes.readiness()
    assert ready.ok and "(generation 2)" in ready.reason, ready.reason
    stop.set()
    await task


async def test_liveness_fails_naming_a_socket_that_stopped_answering(node: Node) -> None:
    probes = DriverProbes(NODE, DRIVER, ping_timeout_s=1.0)
    task, stop = await serve_node(node, FakeResourceSliceSink(), probes=probes)
    node.sockets.dra.unlink()  # the server runs on, but nothing can reach it any more
    alive = await probes.liveness()
    assert not alive.ok
    assert alive.reason.startswith("gRPC server not answering: DRA socket ")
    assert str(node.sockets.dra) in alive.reason
    assert "registration socket" not in alive.reason  # that one still answers
    stop.set()
    await task


async def test_slices_not_published_is_not_ready_whatever_the_kubelet_said(tmp_path: Path) -> None:
    probes = DriverProbes(NODE, DRIVER)
    probes.serving(tmp_path / "reg.sock", tmp_path / "dra.sock")
    probes.registration_status(True, "")
    ready = await probes.readiness()
    assert not ready.ok
    assert ready.reason == f"not ready: the ResourceSlices of node {NODE} are not published yet"
    probes.published(3)
    assert (await probes.readiness()).ok


async def test_while_another_driver_serves_it_waits_alive_but_not_ready(node: Node) -> None:
    holder = claim_sockets(node.sockets)  # the other driver
    probes = DriverProbes(NODE, DRIVER)
    stop = asyncio.Event()
    task = asyncio.create_task(
        wait_for_sockets(node.sockets, stop, NODE, on_wait=probes.waiting, retry_initial_s=0.01)
    )
    try:

        async def waiting() -> bool:
            return (await probes.liveness()).reason.startswith("waiting: ")

        await wait_until_async(waiting, timeout_s=20, what="the driver waiting")
        alive, ready = await probes.liveness(), await probes.readiness()
        assert alive.ok and not ready.ok
        for result in (alive, ready):
            assert result.reason.startswith(f"waiting: {node.sockets.dra} is served by another")
        assert not task.done()
    finally:
        holder.release()
    claim = await asyncio.wait_for(task, 30)
    assert claim is not None and claim.held
    claim.release()
    probes.waiting(None)  # what the role says once it holds the claim
    assert (await probes.liveness()).reason.startswith("starting:")


async def test_stopped_while_waiting_it_claims_nothing(node: Node) -> None:
    holder = claim_sockets(node.sockets)
    stop = asyncio.Event()
    task = asyncio.create_task(wait_for_sockets(node.sockets, stop, NODE))
    await asyncio.sleep(0)  # let it try once and find the owner
    stop.set()
    assert await asyncio.wait_for(task, 30) is None
    assert holder.held and lock_path_of(node.sockets.dra).exists()
    holder.release()
