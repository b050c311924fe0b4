"""kubegpu's DRA driver side for every KWOK node of the scale replay, in one process.

KWOK nodes run no kubelet, so no `kubegpu dra-driver` can register with one; what the replay
needs of the driver is what the scheduler sees of it: each node's ResourceSlices and, with
steering, their device order. This process gives every node exactly that with the driver's own
code: the inventory the fake backend reads from the node's fake-GPU spec (``fleet.gpu_spec``),
the slices of :func:`kubegpu.dra.slices.build_resource_slices` written by the driver's
:class:`~kubegpu.dra.publisher.ResourceSlicePublisher` through its lightkube sink, and with
``--steer`` the driver's :class:`~kubegpu.dra.steering.DeviceSteerer` per node:

* ``--steer poll``: the driver's mechanism as shipped before issue 27 (each node's steerer
  lists every ResourceClaim each ``--interval`` and re-publishes when its order changed), one
  loop per node as each node's driver would run it;
* ``--steer watch``: :class:`~kubegpu.dra.steering.WatchedPoolAllocations`, one list + watch of
  the claims shared by every node here (each driver keeps its own), each node's order
  recomputed and re-published as soon as its pool's allocations change.

Run as ``python -m kubegpu_e2e.scale.dra_fleet --nodes NODES.json --kubeconfig K [...]``;
``NODES.json`` maps each node name to ``{"spec": <fake-GPU YAML>, "cpuMilli": <cpu>}``. Once
every node's slices are published it writes ``--ready`` (a file).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
from pathlib import Path
from typing import Any

import lightkube

from kubegpu.config.extender import load_workload
from kubegpu.core.dra import DEFAULT_DRIVER_NAME, KUBEGPU_NAMING
from kubegpu.core.gpu import NodeInventory
from kubegpu.dra.publisher import ResourceSlicePublisher
from kubegpu.dra.slices import pool_name
from kubegpu.dra.steering import DeviceSteerer
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.inventory.spec import parse_fake_spec
from kubegpu.kube.client import load_kubeconfig_file
from kubegpu.kube.resource_claims import LightkubeResourceClaimSource
from kubegpu.kube.resource_slices import LightkubeResourceSliceSink
from kubegpu.placement.fragmentation import TypicalWorkload

log = logging.getLogger("kubegpu_e2e.scale.dra_fleet")


def inventory_of(name: str, spec: str) -> NodeInventory:
    return FakeGpuBackend(parse_fake_spec(spec, name=name, source=f"replay node {name}")).snapshot()


class NodeDriver:
    """One node's slices, published as its driver would."""

    def __init__(
        self,
        name: str,
        inventory: NodeInventory,
        client: lightkube.AsyncClient,
        steerer: DeviceSteerer | None,
    ) -> None:
        self.name = name
        self.inventory = inventory
        self.publisher = ResourceSlicePublisher(
            name, KUBEGPU_NAMING, LightkubeResourceSliceSink(client)
        )
        self.steerer = steerer
        self.order: tuple[int, ...] | None = None
        self.publishes = 0

    async def publish(self) -> None:
        if self.steerer is not None:
            try:
                self.order = await self.steerer.order()
            except Exception as exc:  # the driver keeps its order when claims can't be read
                log.warning("node %s: claims not read (order kept): %s", self.name, exc)
        if await self.publisher.publish(self.inventory, None, self.order):
            self.publishes += 1


async def run(args: argparse.Namespace) -> None:
    nodes: dict[str, dict[str, Any]] = json.loads(Path(args.nodes).read_text())
    client = lightkube.AsyncClient(
        load_kubeconfig_file(Path(args.kubeconfig)), field_manager="kubegpu-dra-driver"
    )
    workload: TypicalWorkload | None = (
        load_workload(Path(args.workload_file)) if args.steer != "off" else None
    )
    watched = None
    if args.steer == "watch":
        from kubegpu.kube.pool_allocations import WatchedPoolAllocations

        watched = WatchedPoolAllocations(client, DEFAULT_DRIVER_NAME)
        watched.start()
        await watched.synced.wait()
    drivers: list[NodeDriver] = []
    for name, node in sorted(nodes.items()):
        inventory = inventory_of(name, node["spec"])
        steerer = None
        if workload is not None:
            source = watched if watched is not None else LightkubeResourceClaimSource(client)
            steerer = DeviceSteerer(
                inventory, DEFAULT_DRIVER_NAME, pool_name(name), source, workload, node["cpuMilli"]
            )
        drivers.append(NodeDriver(name, inventory, client, steerer))
    gate = asyncio.Semaphore(16)

    async def first(driver: NodeDriver) -> None:
        async with gate:
            await driver.publish()

    await asyncio.gather(*(first(d) for d in drivers))
    Path(args.ready).write_text(f"{len(drivers)} nodes published\n")
    log.info("published the slices of %d nodes (steering: %s)", len(drivers), args.steer)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.steer == "poll":
        # Each node's driver polls on its own clock (serve_dra_driver's loop).
        tasks = [asyncio.create_task(_poll(d, args.interval, stop)) for d in drivers]
    elif args.steer == "watch":
        assert watched is not None
        tasks = [
            asyncio.create_task(
                _on_change(d, watched.changed(pool_name(d.name)), args.interval, stop)
            )
            for d in drivers
        ]
    else:
        tasks = []
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    total = sum(d.publishes for d in drivers)
    log.info("stopping: %d slice publishes in all", total)
    if watched is not None:
        await watched.close()
    await client.close()


async def _poll(driver: NodeDriver, interval_s: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.sleep(interval_s)
        await driver.publish()


async def _on_change(
    driver: NodeDriver, changed: asyncio.Event, interval_s: float, stop: asyncio.Event
) -> None:
    # As the driver's loop with a watch: re-steer as soon as the pool's allocations change,
    # and at least every interval.
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), interval_s)
        changed.clear()
        await driver.publish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--steer", choices=["off", "poll", "watch"], default="off")
    parser.add_argument("--workload-file")
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # The steerer logs each node's order on every change: thousands of lines at scale.
    logging.getLogger("kubegpu.dra.steering").setLevel(logging.WARNING)
    logging.getLogger("kubegpu.dra.publisher").setLevel(logging.WARNING)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
