"""The exporter inside the supervisor, in-process: what a reload that cannot bind leaves behind
(threads, PodResources channels), which a separate process cannot show."""

from __future__ import annotations

import asyncio
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu.config import load_config
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.kubelet.agent import AgentSettings, Event
from kubegpu.kubelet.pod_resources import KubeletPodResources
from kubegpu.roles.node_agent import build_agent
from kubegpu.testing.kubelet import KubeletEmulator
from tests.kubelet.conftest import RESOURCE, short_tempdir, wait_until

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

EXPORTER_THREADS = ("kubegpu-refresher", "kubegpu-exporter-http")


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def channels(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many PodResources clients the exporter opened and closed."""
    counts = {"opened": 0, "closed": 0}
    real_init, real_close = KubeletPodResources.__init__, KubeletPodResources.close

    def init(self: KubeletPodResources, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        counts["opened"] += 1

    def close(self: KubeletPodResources) -> None:
        real_close(self)
        counts["closed"] += 1

    monkeypatch.setattr(KubeletPodResources, "__init__", init)
    monkeypatch.setattr(KubeletPodResources, "close", close)
    return counts


def exporter_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in EXPORTER_THREADS]


def write_config(path: Path, root: Path, listen: str, enabled: bool = True) -> None:
    path.write_text(
        "version: v1\n"
        "exporter:\n"
        f"  enabled: {'true' if enabled else 'false'}\n"
        f'  listen: "{listen}"\n'
        f"  podResourcesSocket: {root / 'pr.sock'}\n"
    )


async def test_reloads_onto_a_taken_port_leave_no_thread_or_channel_behind(
    root: Path, channels: dict[str, int]
) -> None:
    kubelet_dir = root / "dp"
    kubelet = KubeletEmulator(kubelet_dir)
    kubelet.start()
    backend = FakeGpuBackend.from_spec("4xT4")
    config_path = root / "config.yaml"
    write_config(config_path, root, "127.0.0.1:0")
    settings = AgentSettings(kubelet_dir, "unit", config_path=config_path)
    agent = build_agent(settings, load_config(config_path), backend)
    run = asyncio.create_task(agent.run())
    taken = socket.socket()
    try:
        await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20)
        await wait_until(lambda: agent.exporter is not None)
        assert sorted(exporter_threads()) == sorted(EXPORTER_THREADS)
        assert channels == {"opened": 1, "closed": 0}

        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for attempt in range(3):
            # Each a change (the address alternates), so each is applied and fails to bind.
            listen = f"127.0.0.1:{port}" if attempt % 2 == 0 else f"localhost:{port}"
            write_config(config_path, root, listen)
            agent.events.put_nowait(Event.RELOAD)
            await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20, count=2 + attempt)
            assert agent.exporter is None
        assert exporter_threads() == []
        assert channels == {"opened": 4, "closed": 4}

        # Turning it off and on again works and balances too.
        write_config(config_path, root, "127.0.0.1:0", enabled=False)
        agent.events.put_nowait(Event.RELOAD)
        await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20, count=5)
        write_config(config_path, root, "127.0.0.1:0")
        agent.events.put_nowait(Event.RELOAD)
        await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20, count=6)
        assert agent.exporter is not None
        assert sorted(exporter_threads()) == sorted(EXPORTER_THREADS)
    finally:
        taken.close()
        agent.events.put_nowait(Event.STOP)
        assert await asyncio.wait_for(run, 30) == 0
        await asyncio.to_thread(kubelet.stop)
        backend.close()
    assert agent.exporter is None
    assert exporter_threads() == []
    assert channels == {"opened": 5, "closed": 5}
