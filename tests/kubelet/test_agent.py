"""The supervisor in-process: event handling and registration retries, with recorded sleeps."""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu.config import load_config
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.kubelet.agent import AgentSettings, Event
from kubegpu.kubelet.retry import RetryBackoff
from kubegpu.roles.node_agent import build_agent
from kubegpu.testing.kubelet import KubeletEmulator
from tests.kubelet.conftest import RESOURCE, short_tempdir, wait_until

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_queued_reload_and_kubelet_restart_together_still_reregister(root: Path) -> None:
    kubelet_dir = root / "dp"
    kubelet = KubeletEmulator(kubelet_dir)
    kubelet.start()
    backend = FakeGpuBackend.from_spec("4xT4")
    # The watch never fires on its own here, so only the queued events drive the agent.
    settings = AgentSettings(kubelet_dir, "unit", poll_interval_s=3600)
    agent = build_agent(settings, load_config(None), backend)
    run = asyncio.create_task(agent.run())
    try:
        await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20)
        await asyncio.to_thread(kubelet.restart)
        # An unchanged reload arrives in the same batch as the restart notice.
        agent.events.put_nowait(Event.RELOAD)
        agent.events.put_nowait(Event.KUBELET_RESTARTED)
        await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20, count=2)
        await asyncio.to_thread(kubelet.wait_for_devices, RESOURCE, lambda d: len(d) == 4, 20)
    finally:
        agent.events.put_nowait(Event.STOP)
        assert await asyncio.wait_for(run, 30) == 0
        await asyncio.to_thread(kubelet.stop)
        backend.close()
    assert not list(kubelet_dir.glob("kubegpu-*.sock"))


async def test_registration_against_a_dead_kubelet_socket_backs_off_then_succeeds(
    root: Path,
) -> None:
    kubelet_dir = root / "dp"
    kubelet_dir.mkdir()
    # A socket file nobody accepts on: what a crashed kubelet leaves behind.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(kubelet_dir / "kubelet.sock"))
    dead.close()

    requested: list[float] = []

    kubelet_started = asyncio.Event()

    async def recorded_sleep(seconds: float) -> None:
        # Fake time: the backoff's delay is recorded, not waited. Past the five delays the
        # test reads, the retries wait for the kubelet the test starts rather than spin.
        requested.append(seconds)
        if len(requested) >= 5:
            await kubelet_started.wait()

    backend = FakeGpuBackend.from_spec("4xT4")
    settings = AgentSettings(
        kubelet_dir, "unit", poll_interval_s=0.05, backoff=RetryBackoff(0.5, 2.0, 4.0)
    )
    agent = build_agent(settings, load_config(None), backend, sleep=recorded_sleep)
    run = asyncio.create_task(agent.run())
    kubelet = KubeletEmulator(kubelet_dir)
    try:
        await wait_until(lambda: len(requested) >= 5)
        assert agent.registered_count == 0
        assert requested[:5] == [0.5, 1.0, 2.0, 4.0, 4.0]
        # A real kubelet start wipes the directory (our socket too) and serves a new
        # kubelet.sock; the watch notices, serves a fresh socket and registers.
        await asyncio.to_thread(kubelet.start)
        kubelet_started.set()
        await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20)
        await wait_until(lambda: agent.registered_count >= 1)
    finally:
        agent.events.put_nowait(Event.STOP)
        assert await asyncio.wait_for(run, 30) == 0
        await asyncio.to_thread(kubelet.stop)
        backend.close()


class RecordingNodeApi:
    """Counts inventory publications; the rest of NodeApi is never called here."""

    def __init__(self) -> None:
        self.published = 0

    async def publish_inventory(self, records: object) -> None:
        self.published += 1

    async def publish_mig_devices(self, devices: object) -> None:
        pass


async def test_inventory_publisher_stops_when_a_change_lands_with_the_stop(root: Path) -> None:
    # A health change (the event set) in the same loop tick as the agent stopping (the task
    # cancelled): asyncio.wait_for on Python 3.11 returned normally there, swallowing the
    # cancellation, and the publisher went on publishing forever while stop() waited for it.
    api = RecordingNodeApi()
    backend = FakeGpuBackend.from_spec("4xT4")
    settings = AgentSettings(root / "dp", "node-1", poll_interval_s=3600)
    config = load_config(None, {"sharing.gpuShare.inventoryIntervalS": 3600})
    agent = build_agent(settings, config, backend, api=api)  # type: ignore[arg-type]
    try:
        for _ in range(3):
            publisher = agent.publisher
            assert publisher is not None
            publisher.start()
            target = api.published + 1
            await wait_until(lambda target=target: api.published >= target)  # type: ignore[misc]
            changed = publisher._changed
            assert changed is not None
            changed.set()
            stop = asyncio.create_task(publisher.stop())
            done, _ = await asyncio.wait({stop}, timeout=10)
            assert stop in done, "the inventory publisher outlived the agent's stop"
    finally:
        backend.close()


async def test_a_socket_lost_again_and_again_is_recreated_with_a_backoff(root: Path) -> None:
    kubelet_dir = root / "dp"
    kubelet = KubeletEmulator(kubelet_dir)
    kubelet.start()
    now = [1000.0]
    looks = [0]  # how often the agent has read the clock: once per loss it weighs

    def clock() -> float:
        looks[0] += 1
        return now[0]

    backend = FakeGpuBackend.from_spec("4xT4")
    settings = AgentSettings(
        kubelet_dir, "unit", poll_interval_s=0.01, backoff=RetryBackoff(1.0, 2.0, 8.0)
    )
    agent = build_agent(settings, load_config(None), backend, clock=clock)
    run = asyncio.create_task(agent.run())
    try:
        await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20)
        sock = agent.servers[0].socket_path
        # The first loss is a real one (someone removed it): re-created at once.
        sock.unlink()
        await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20, count=2)
        # Lost again at once: a fight, not an accident. With the clock standing still the
        # agent waits out its backoff, however often its watch sees the socket missing.
        looked = looks[0]
        sock.unlink()
        # Its watch reports the loss on every poll; let it weigh (and decline) it a few times.
        await wait_until(lambda: looks[0] >= looked + 5)
        assert not sock.exists()
        assert sum(r.resource_name == RESOURCE for r in kubelet.registrations) == 2
        now[0] += 1.0  # backoff.delay(0)
        await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20, count=3)
        assert sock.is_socket()
    finally:
        agent.events.put_nowait(Event.STOP)
        assert await asyncio.wait_for(run, 30) == 0
        await asyncio.to_thread(kubelet.stop)
        backend.close()
