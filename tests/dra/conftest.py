"""Fixtures for the DRA driver tests: a fake inventory, short socket dirs, a served driver."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.dra import DEFAULT_DRIVER_NAME
from kubegpu.core.dra_ports import FakeResourceClaimSource, ResourceSliceSink
from kubegpu.core.gpu import GpuDevice, GpuUuid, NodeInventory
from kubegpu.dra.driver import ClaimPreparer, DriverSettings
from kubegpu.dra.registration import SocketPaths
from kubegpu.dra.server import DraPluginServer, serve_dra_driver

NODE = "node-a"


def gpu(
    index: int,
    memory_mib: int = 81920,
    compute_capability: tuple[int, int] | None = None,
    numa_node: int | None = None,
) -> GpuDevice:
    return GpuDevice(
        index=index,
        uuid=GpuUuid(f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd"),
        product_name="NVIDIA A100-SXM4-80GB",
        memory_total_mib=memory_mib,
        pci_bus_id=f"00000000:{0x10 + index:02X}:00.0",
        minor_number=index,
        compute_capability=compute_capability,
        numa_node=numa_node,
    )


@pytest.fixture
def inventory() -> NodeInventory:
    return NodeInventory(
        gpus=(
            gpu(0, compute_capability=(8, 0), numa_node=0),
            gpu(1, compute_capability=(8, 0), numa_node=1),
        ),
        driver_version="535.104.05",
    )


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="kg-dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class Node:
    settings: DriverSettings
    sockets: SocketPaths
    claims: FakeResourceClaimSource
    inventory: NodeInventory

    def preparer(self) -> ClaimPreparer:
        return ClaimPreparer(self.settings, self.inventory, self.claims)


@pytest.fixture
def node(short_dir: Path, inventory: NodeInventory) -> Node:
    return Node(
        settings=DriverSettings(
            node_name=NODE,
            cdi_dir=short_dir / "cdi",
            checkpoint_path=short_dir / "state" / "checkpoint.json",
        ),
        sockets=SocketPaths.for_driver(
            DEFAULT_DRIVER_NAME, short_dir / "plugins_registry", short_dir / "plugins"
        ),
        claims=FakeResourceClaimSource(),
        inventory=inventory,
    )


@pytest.fixture
async def served(node: Node) -> AsyncIterator[DraPluginServer]:
    async with DraPluginServer(node.preparer(), node.sockets) as server:
        yield server


async def serve_node(
    node: Node,
    sink: ResourceSliceSink,
    *,
    inventory: NodeInventory | None = None,
    **options: Any,
) -> tuple[asyncio.Task[bool], asyncio.Event]:
    """``serve_dra_driver`` for ``node`` (its inventory unless ``inventory``) in a task, handed
    back once its slices are published and both sockets answer, with the event that stops it.
    ``options``: the rest of ``serve_dra_driver``'s keyword arguments."""
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        serve_dra_driver(
            node.settings,
            inventory or node.inventory,
            node.claims,
            sink,
            node.sockets,
            stop,
            started=started,
            **options,
        )
    )
    await started.wait()
    return task, stop
