"""GPU health has one record in the node agent: the feed its judge writes, which the device
plugin's streams, the inventory annotation and the exporter all read (no copies to seed)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu.config import load_config
from kubegpu.config.model import Exporter as ExporterConfig
from kubegpu.core.backend import GpuBackend
from kubegpu.core.gpu import NodeInventory
from kubegpu.core.health_feed import HealthFeed
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.kubelet.agent import AgentSettings, Event
from kubegpu.kubelet.exporter_slot import RunningService
from kubegpu.roles.node_agent import build_agent
from kubegpu.testing.kubelet import KubeletEmulator
from tests.kubelet.conftest import RESOURCE, short_tempdir, wait_until

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Judge:
    """Stands in for the health monitor: the test hands down verdicts through the feed."""

    def __init__(self) -> None:
        self.feeds: list[HealthFeed] = []

    def __call__(
        self, feed: HealthFeed, backend: GpuBackend, inventory: NodeInventory, node_name: str
    ) -> None:
        self.feeds.append(feed)
        feed.attach_judge(lambda _timeout_s: None)


class Exporters:
    """Stands in for the exporter: records the health record each start was handed."""

    def __init__(self) -> None:
        self.started: list[tuple[str, HealthFeed, bool]] = []

    def __call__(
        self, config: ExporterConfig, node_name: str, health: HealthFeed
    ) -> RunningService:
        outer = self

        class Running:
            def stop(self) -> None:
                outer.started.append(("stopped", health, True))

        uuid = next(iter(health.gpus))
        self.started.append((config.listen, health, health.tally().healthy(uuid)))
        return Running()


def write_config(path: Path, listen: str) -> None:
    path.write_text(f'version: v1\nexporter:\n  enabled: true\n  listen: "{listen}"\n')


async def test_a_verdict_reaches_the_kubelet_and_an_exporter_started_after_it(root: Path) -> None:
    kubelet_dir = root / "dp"
    kubelet = KubeletEmulator(kubelet_dir)
    kubelet.start()
    backend = FakeGpuBackend.from_spec("4xT4")
    first_gpu = backend.snapshot().gpus[0]
    config_path = root / "config.yaml"
    write_config(config_path, "127.0.0.1:9400")
    judge, exporters = Judge(), Exporters()
    settings = AgentSettings(kubelet_dir, "unit", config_path=config_path)
    agent = build_agent(
        settings,
        load_config(config_path),
        backend,
        health_judge=judge,
        start_exporter=exporters,
    )
    run = asyncio.create_task(agent.run())
    try:
        await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20)
        assert judge.feeds == [agent.health]
        # From another thread, as the monitor's verdicts arrive.
        await asyncio.to_thread(agent.health.set_healthy, first_gpu.uuid, False, "Xid 79")
        await asyncio.to_thread(
            kubelet.wait_for_devices,
            RESOURCE,
            lambda d: not d[str(first_gpu.uuid)].healthy,
            20,
        )
        assert dict(agent.board.unhealthy) == {first_gpu.uuid: "Xid 79"}

        # A reload moves the exporter: the new one reads the same record, verdict included.
        write_config(config_path, "127.0.0.1:9401")
        agent.events.put_nowait(Event.RELOAD)
        await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20, count=2)
        await wait_until(lambda: len(exporters.started) == 3)
    finally:
        agent.events.put_nowait(Event.STOP)
        assert await asyncio.wait_for(run, 30) == 0
        await asyncio.to_thread(kubelet.stop)
        backend.close()
    assert exporters.started[0] == ("127.0.0.1:9400", agent.health, True)
    assert exporters.started[1] == ("stopped", agent.health, True)
    assert exporters.started[2] == ("127.0.0.1:9401", agent.health, False)
