"""The DRA driver's composition root: ``kubegpu dra-driver`` wired from its settings.

Picks the real collaborators of the DRA kubelet-plugin edge (:mod:`kubegpu.dra`): the inventory
edge's backend and health monitor (the device plugin's Xid policy, through the core's
:class:`~kubegpu.core.health_feed.HealthFeed`), the kube edge's claim source and slice sink,
and under ``dra.enforcement: mps`` the MPS control daemon supervisor the device plugin uses.
The edge republishes the node's ResourceSlices whenever the feed's verdicts change, so an
unhealthy GPU is tainted ``NoSchedule`` and untainted when the policy says it recovered.
With ``health_listen`` set it also serves ``/healthz`` and ``/readyz`` (:mod:`kubegpu.probes`
answering from :class:`~kubegpu.dra.probes.DriverProbes`) from before the first publish until
it has stopped.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.config.health import health_policy
from kubegpu.config.model import AgentConfig, Dra
from kubegpu.core.backend import GpuBackend, MigPartitioner
from kubegpu.core.dra import DEFAULT_DRIVER_NAME, KUBEGPU_NAMING, DraNaming
from kubegpu.core.dra_ports import (
    PoolAllocationSource,
    ResourceClaimReader,
    ResourceSliceSink,
    WatchedPoolAllocationSource,
)
from kubegpu.core.gpu import GpuUuid
from kubegpu.core.health_feed import HealthFeed
from kubegpu.dra.checkpoint import Checkpoint, CheckpointError
from kubegpu.dra.driver import DriverSettings
from kubegpu.dra.probes import DriverProbes
from kubegpu.dra.registration import SocketPaths, foreign_server
from kubegpu.dra.server import (
    SlicePublishError,
    serve_dra_driver,
    wait_for_sockets,
)
from kubegpu.dra.slices import pool_name
from kubegpu.dra.steering import DeviceSteerer
from kubegpu.httpd import HttpThread
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.probes import start_probe_server
from kubegpu.roles.health import judge_health
from kubegpu.socket_claim import SocketClaim

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"


@dataclass(frozen=True)
class DraDriverSettings:
    """Where the driver's files go; every path injectable (tests use temp dirs)."""

    node_name: str
    kubelet_dir: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = Path("/var/run/cdi")
    state_dir: Path = Path("/var/lib/kubegpu/dra")
    dev_root: str = "/"
    # The config's dra.naming: gpu.kubegpu.io, or NVIDIA's gpu.nvidia.com (docs/dra.md).
    naming: DraNaming = KUBEGPU_NAMING
    env: Mapping[str, str] = field(default_factory=dict)
    # Set (from dra.steering.workloadFile): the devices are published in the steered order.
    steering_workload: TypicalWorkload | None = None
    # The node's CPU, all taken as free by the steering cost (the driver sees no pods' CPU).
    cpu_milli: int = 1000
    # (host, port) for /healthz and /readyz (--health-listen); None: not served.
    health_listen: tuple[str, int] | None = None

    @property
    def driver(self) -> str:
        return self.naming.driver

    @property
    def sockets(self) -> SocketPaths:
        return socket_paths(self.kubelet_dir, self.driver)

    @property
    def checkpoint_path(self) -> Path:
        return self.state_dir / CHECKPOINT_FILE

    def driver_settings(self, shares: Dra) -> DriverSettings:
        return DriverSettings(
            naming=self.naming,
            node_name=self.node_name,
            cdi_dir=self.cdi_dir,
            checkpoint_path=self.checkpoint_path,
            dev_root=self.dev_root,
            shares=shares,
            dynamic_mig=shares.mig == "dynamic",
        )


def socket_paths(kubelet_dir: Path, driver: str = DEFAULT_DRIVER_NAME) -> SocketPaths:
    """The kubelet's plugin watcher dir and its per-plugin dir, under ``kubelet_dir``."""
    return SocketPaths.for_driver(driver, kubelet_dir / "plugins_registry", kubelet_dir / "plugins")


async def run_dra_driver(
    settings: DraDriverSettings,
    config: AgentConfig,
    backend: GpuBackend,
    kube_config: Any,
    *,
    stop: asyncio.Event | None = None,
) -> int:
    """Run the driver until SIGTERM/SIGINT (or ``stop``); the exit code: 1 when it could not
    start (the slices not published, the checkpoint not trusted, a kubelet refusal), 0 when
    stopped, also while it waited for another driver on the kubelet folder to exit. Raises
    :class:`~kubegpu.probes.ProbeServerError` when ``settings.health_listen`` cannot be
    served."""
    from kubegpu.kube.dra_api import DraApi

    api = DraApi(kube_config)
    try:
        return await run_with_ports(
            settings,
            config,
            backend,
            api.claims,
            api.slices,
            stop=stop,
            pool_watch=api.pool_watch(settings.driver),
        )
    finally:
        await api.close()


async def run_with_ports(
    settings: DraDriverSettings,
    config: AgentConfig,
    backend: GpuBackend,
    claims: ResourceClaimReader,
    slices: ResourceSliceSink,
    *,
    stop: asyncio.Event | None = None,
    pool_watch: WatchedPoolAllocationSource | None = None,
) -> int:
    """:func:`run_dra_driver` with the API ports given (a test passes fakes). With steering on
    and ``pool_watch``, the steerer reads its pool's allocations from that watch and the slice
    is re-steered as soon as they change; without it, ``claims`` is polled every interval."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    node = settings.node_name
    inventory = backend.snapshot()
    partitioner = backend if isinstance(backend, MigPartitioner) else None
    if config.dra.mig == "dynamic" and partitioner is None:
        log.error(
            "node %s: dra.mig: dynamic needs a GPU backend that creates MIG instances; the %s "
            "backend cannot",
            settings.node_name,
            backend.name,
        )
        return 1
    feed = HealthFeed(policy=health_policy(config.health, settings.env))
    changed = asyncio.Event()

    def on_verdict_flip(gpu: GpuUuid, healthy: bool, reason: str) -> None:
        # Called on the monitor's thread for a GPU turning (un)healthy, not for every Xid it
        # counts; the loop republishes the slices with the taints ``unhealthy()`` now gives.
        loop.call_soon_threadsafe(changed.set)

    def unhealthy() -> dict[str, str]:
        return {str(uuid): reason for uuid, reason in feed.unhealthy().items()}

    feed.subscribe(on_verdict_flip)
    steerer = None
    steer_wake: asyncio.Event | None = None
    if settings.steering_workload is not None:
        allocations: PoolAllocationSource = claims
        if pool_watch is not None:
            allocations = pool_watch
            steer_wake = pool_watch.changed(pool_name(node))
        steerer = DeviceSteerer(
            inventory,
            settings.driver,
            pool_name(node),
            allocations,
            settings.steering_workload,
            settings.cpu_milli,
        )
    judge_health(feed, backend, inventory, node_name=node)
    mps_daemon = None
    probes = DriverProbes(node, settings.driver)
    probe_server: HttpThread | None = None
    claim: SocketClaim | None = None
    try:
        if settings.health_listen is not None:
            # First: the startup probe reads "starting" rather than a refused connection while
            # the MPS daemon starts and the first publish waits for the API server.
            probe_server = start_probe_server(
                settings.health_listen,
                probes,
                loop,
                node=node,
                role="kubegpu DRA driver",
                thread_name="kubegpu-dra-probes",
            )
        # Before anything another driver on this kubelet folder owns (its sockets, checkpoint,
        # slices and MPS daemon): while one runs, this one only answers its probes.
        claim = await wait_for_sockets(settings.sockets, stop, node, on_wait=probes.waiting)
        if claim is None:
            log.info("node %s: stopped while another DRA driver served; it is untouched", node)
            return 0
        foreign = await loop.run_in_executor(None, foreign_server, settings.sockets)
        if foreign is not None:
            log.error(
                "node %s: another DRA driver named %s already serves this node (%s answers, "
                "and no kubegpu driver holds it): two drivers with one name cannot share a "
                "node. Remove that driver from the node (NVIDIA's: the DaemonSet "
                "dra-driver-nvidia-gpu-kubelet-plugin) or keep dra.naming: kubegpu",
                node,
                settings.driver,
                foreign,
            )
            return 1
        probes.waiting(None)  # starting now: the probes say so until both sockets answer
        # After the claim: until then the file was the other driver's to change.
        checkpoint = Checkpoint(settings.checkpoint_path)
        if config.dra.enforcement == "mps":
            from kubegpu.enforcement.mps import MpsDaemon, mps_spec_for

            spec = mps_spec_for(config.dra.mps, [gpu.uuid for gpu in inventory.gpus])
            mps_daemon = MpsDaemon(spec, node=node)
            await mps_daemon.start()
        log.info(
            "node %s: DRA driver %s for %d GPU(s), enforcement %s, %s, sockets %s and %s",
            node,
            settings.driver,
            len(inventory.gpus),
            config.dra.enforcement,
            "devices steered" if steerer is not None else "devices in index order",
            settings.sockets.registration,
            settings.sockets.dra,
        )
        if steer_wake is not None and pool_watch is not None:
            pool_watch.start()  # until it has listed, the steerer keeps index order
        refused = await serve_dra_driver(
            settings.driver_settings(config.dra),
            inventory,
            claims,
            slices,
            settings.sockets,
            stop,
            unhealthy=unhealthy,
            health_changed=changed,
            steer=steerer.order if steerer is not None else None,
            steer_interval_s=config.dra.steering.interval_s,
            steer_wake=steer_wake,
            probes=probes,
            checkpoint=checkpoint,
            claim=claim,
            partitioner=partitioner,
        )
    except CheckpointError as exc:
        log.error("node %s: %s; move the file away to start afresh", node, exc)
        return 1
    except OSError as exc:  # the lock file beside the DRA socket cannot be made
        log.error("node %s: cannot claim %s: %s", node, settings.sockets.dra, exc)
        return 1
    except SlicePublishError as exc:
        log.error("%s; is the API server reachable, and may kubegpu-dra-driver write them?", exc)
        return 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if probe_server is not None:
            # stop() waits for the serving thread to notice: off the loop, which the thread's
            # in-flight requests may be waiting on.
            await loop.run_in_executor(None, probe_server.stop)
        await loop.run_in_executor(None, feed.close)
        if pool_watch is not None:
            await pool_watch.close()
        if mps_daemon is not None:
            await mps_daemon.stop()
        if claim is not None:
            # Last: a successor may start its MPS daemon on the same pipes once it has it.
            claim.release()
    if refused:
        log.error("node %s: the kubelet refused the DRA driver; exiting to be restarted", node)
        return 1
    log.info("node %s: DRA driver stopped", node)
    return 0
