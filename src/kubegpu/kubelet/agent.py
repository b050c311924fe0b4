"""The node agent's supervisor: one event loop that owns every task, socket and thread, and
sequences its collaborators through start, events and stop.

It does no work of its own: the device plugins are a :class:`~kubegpu.kubelet.plugin_set.
PluginSet`, GPU sharing (with MPS) a :class:`~kubegpu.kubelet.sharing_runtime.SharingRuntime`,
the CDI spec a :class:`~kubegpu.kubelet.cdi.CdiSpecFile`, the exporter an
:class:`~kubegpu.kubelet.exporter_slot.ExporterSlot`, the inventory annotation an
:class:`~kubegpu.kubelet.inventory_publisher.InventoryPublisher`, and what a reload changes is
read by :func:`~kubegpu.kubelet.reload.read_change`. :mod:`kubegpu.roles.node_agent` builds
them (the composition root) and hands them over as :class:`AgentParts`.

What the supervisor owns is order and events. The kubelet deletes every socket in its directory
when it restarts and recreates ``kubelet.sock``, so we watch the directory (a cheap ``stat``
poll, which also works on filesystems without inotify) and post an event on a new
``kubelet.sock`` or a missing socket of ours. Signals arrive as events on the same queue:
SIGHUP reloads the config, SIGTERM/SIGINT stop everything and remove what we created. With
``flags.healthListen`` set the plugin set also answers ``/healthz`` and ``/readyz``.

Health has one record, the :class:`~kubegpu.core.health_feed.HealthFeed` the health judge (a
port, :class:`HealthJudge`) writes: the device plugin's streams watch it through the
:class:`~kubegpu.kubelet.board.DeviceBoard`, the inventory annotation and the exporter read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kubegpu.config.health import health_policy
from kubegpu.config.load import render_config
from kubegpu.config.model import AgentConfig, parse_listen_address
from kubegpu.core.backend import GpuBackend
from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.core.health_feed import HealthFeed
from kubegpu.httpd import HttpThread
from kubegpu.kubelet.board import DeviceBoard
from kubegpu.kubelet.cdi import CdiSpecFile
from kubegpu.kubelet.exporter_slot import ExporterSlot, RunningService
from kubegpu.kubelet.inventory_publisher import InventoryPublisher
from kubegpu.kubelet.plans import all_gpus, all_migs
from kubegpu.kubelet.plugin import DevicePluginServicer, PluginServer
from kubegpu.kubelet.plugin_set import PluginSet
from kubegpu.kubelet.reload import ConfigChange, ReloadRejected, read_change
from kubegpu.kubelet.resources import ResourcePlan
from kubegpu.kubelet.retry import RetryBackoff, Sleep
from kubegpu.kubelet.sharing_runtime import SharingRuntime
from kubegpu.probes import ProbeServerError, start_probe_server
from kubegpu.socket_claim import SocketInUse, socket_identity

log = logging.getLogger(__name__)


class Event(enum.Enum):
    STOP = "stop"
    RELOAD = "reload"
    KUBELET_RESTARTED = "kubelet-restarted"
    SOCKET_LOST = "socket-lost"


class HealthJudge(Protocol):
    """Starts judging ``inventory``'s GPUs into ``feed`` (its policy, this node's name in log
    lines) until ``feed.close()``: the inventory edge's health monitor, wired by the role."""

    def __call__(
        self, feed: HealthFeed, backend: GpuBackend, inventory: NodeInventory, node_name: str
    ) -> None: ...


def no_health_judge(
    feed: HealthFeed, backend: GpuBackend, inventory: NodeInventory, node_name: str
) -> None:
    """For an agent wired without a monitor (tests of other parts): every GPU stays Healthy."""


@dataclass(frozen=True)
class AgentSettings:
    kubelet_dir: Path
    node_name: str = ""
    config_path: Path | None = None
    # Flag and environment values, applied over the file again on every reload.
    overrides: Mapping[str, object] = field(default_factory=dict)
    poll_interval_s: float = 0.1
    backoff: RetryBackoff = field(default_factory=RetryBackoff)
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentParts:
    """The collaborators the composition root builds for one agent."""

    inventory: NodeInventory
    health: HealthFeed  # the one health record
    board: DeviceBoard  # what the ListAndWatch streams watch (reads ``health``)
    plugins: PluginSet
    exporter: ExporterSlot
    cdi: CdiSpecFile
    health_judge: HealthJudge = no_health_judge
    sharing: SharingRuntime | None = None  # None: no API access
    publisher: InventoryPublisher | None = None  # None: no API access or node name


class Agent:
    """Serves every resource plan of the node until told to stop; ``run()`` returns 0."""

    def __init__(
        self,
        settings: AgentSettings,
        config: AgentConfig,
        backend: GpuBackend,
        plans: list[ResourcePlan],
        parts: AgentParts,
        *,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self.config = config
        self.backend = backend
        self.node = settings.node_name or "-"
        self.inventory = parts.inventory
        self.health = parts.health
        self.board = parts.board
        self.plugins = parts.plugins
        self.plugins.plans = plans
        self.publisher = parts.publisher
        self.sharing = parts.sharing
        self.cdi = parts.cdi
        self._exporter = parts.exporter
        self._health_judge = parts.health_judge
        self._sleep = sleep
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.probes: HttpThread | None = None
        self._kubelet_socket: tuple[int, int] | None = None
        self._delayed: set[asyncio.Task[None]] = set()

    @property
    def plans(self) -> list[ResourcePlan]:
        return self.plugins.plans

    @property
    def servers(self) -> list[PluginServer]:
        return self.plugins.servers

    @property
    def registered_count(self) -> int:
        return self.plugins.registered_count

    @property
    def exporter(self) -> RunningService | None:
        return self._exporter.running

    @property
    def kubelet_socket(self) -> Path:
        return self.plugins.kubelet_socket

    # -- public entry ----------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        signals = {
            signal.SIGTERM: Event.STOP,
            signal.SIGINT: Event.STOP,
            signal.SIGHUP: Event.RELOAD,
        }
        for sig, event in signals.items():
            loop.add_signal_handler(sig, self.events.put_nowait, event)
        watcher = asyncio.create_task(self._watch(), name="watch-kubelet-dir")
        try:
            self._start_probes()
            # Before anything another agent on this node would fight over (its MPS daemon's
            # pipes above all): while one owns the sockets, this one only answers its probes.
            if await self._claim_sockets():
                await self._exporter.start(self.config.exporter)
                self.board.on_flip(self._on_health_flip)
                self._start_health()
                if self.publisher is not None:
                    self.publisher.start()
                else:
                    log.info(
                        "node %s: no API access; the GPU inventory is not published", self.node
                    )
                await self._start_sharing()
                self.cdi.write(self.config, all_gpus(self.plans), all_migs(self.plans))
                self._kubelet_socket = socket_identity(self.kubelet_socket)
                await self.plugins.start(self._servicer)
            else:
                self.events.put_nowait(Event.STOP)
            await self._serve_events()
        finally:
            await self._stop_probes()
            await self._exporter.stop()
            for task in [watcher, *self._delayed]:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self.plugins.stop()
            self.plugins.release_claims(keep=())
            if self.sharing is not None:
                await self.sharing.stop()
            if self.publisher is not None:
                await self.publisher.stop()
            await self._stop_health()
            self.board.close()
            # The CDI spec stays: containers restarted while the agent is down or rolling out
            # resolve their CDI names through it (the next start rewrites it atomically).
        return 0

    async def _serve_events(self) -> None:
        failures = 0
        while True:
            pending = {await self.events.get()}
            while not self.events.empty():
                pending.add(self.events.get_nowait())
            if Event.STOP in pending:
                log.info("node %s: stopping", self.node)
                return
            try:
                await self._handle(pending)
                failures = 0
            except (OSError, RuntimeError) as err:
                # E.g. the directory vanished under us: try again later, never give up.
                delay = self.settings.backoff.delay(failures)
                failures += 1
                log.error(
                    "node %s: handling %s failed: %s; retrying in %.2fs",
                    self.node,
                    sorted(e.value for e in pending),
                    err,
                    delay,
                )
                self._later(delay, Event.KUBELET_RESTARTED)

    async def _handle(self, pending: set[Event]) -> None:
        # Several events may arrive together; a reload that restarted everything covers a
        # kubelet restart and a lost socket, and a full restart covers a lost socket.
        if Event.RELOAD in pending and await self._reload():
            return
        if Event.KUBELET_RESTARTED in pending:
            log.info("node %s: kubelet restarted; re-registering", self.node)
            await self.plugins.restart(self._servicer)
        elif Event.SOCKET_LOST in pending:
            await self.plugins.restart_lost(self._servicer)

    def _later(self, delay_s: float, event: Event) -> None:
        async def post() -> None:
            await self._sleep(delay_s)
            self.events.put_nowait(event)

        task = asyncio.create_task(post(), name=f"later {event.value}")
        self._delayed.add(task)
        task.add_done_callback(self._delayed.discard)

    def _servicer(self, plan: ResourcePlan) -> DevicePluginServicer:
        hooks = self.sharing.coordinator if self.sharing is not None else None
        return DevicePluginServicer(
            plan, self.inventory, self.config, self.board, self.node, hooks=hooks
        )

    # -- watching ----------------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.poll_interval_s)
            try:
                self._observe()
            except OSError as err:  # a stat that fails oddly must not end the watch
                log.error("node %s: cannot watch %s: %s", self.node, self.kubelet_socket, err)

    def _observe(self) -> None:
        current = socket_identity(self.kubelet_socket)
        if current != self._kubelet_socket:
            self._kubelet_socket = current
            if current is not None:
                self.events.put_nowait(Event.KUBELET_RESTARTED)
                return
            log.warning("node %s: %s disappeared; waiting", self.node, self.kubelet_socket)
        if self.plugins.any_socket_lost():
            self.events.put_nowait(Event.SOCKET_LOST)

    async def _claim_sockets(self) -> bool:
        """Claim every plan's socket, waiting while another node agent owns one (the old pod of
        a rolling update, until it exits); False when told to stop meanwhile. Only events that
        need the servers running are dropped while waiting: a reload is kept for afterwards."""
        plugins = self.plugins
        attempt = 0
        deferred: set[Event] = set()
        try:
            while True:
                try:
                    plugins.claim_all()
                    return True
                except SocketInUse as err:
                    # Not even the stale-socket cleanup: the owner's socket is live.
                    if plugins.waiting_for != str(err):
                        plugins.waiting_for = str(err)
                        log.warning("node %s: %s; waiting for it to exit", self.node, err)
                delay = self.settings.backoff.delay(attempt)
                attempt += 1
                try:
                    event = await asyncio.wait_for(self.events.get(), delay)
                except TimeoutError:
                    continue
                if event is Event.STOP:
                    return False
                if event is Event.RELOAD:
                    deferred.add(event)
        finally:
            if plugins.waiting_for is not None and plugins.claims:
                log.info("node %s: the other node agent is gone; serving", self.node)
            plugins.waiting_for = None
            for event in deferred:
                self.events.put_nowait(event)

    # -- probes: /healthz and /readyz, answered by the plugin set ---------------------------------

    def _start_probes(self) -> None:
        """Raises ProbeServerError when the address cannot be served."""
        listen = self.config.flags.health_listen
        if listen:
            self.probes = start_probe_server(
                parse_listen_address(listen),
                self.plugins,
                asyncio.get_running_loop(),
                node=self.node,
            )

    async def _stop_probes(self) -> None:
        probes, self.probes = self.probes, None
        if probes is not None:
            # stop() waits for the serving thread to notice: off the loop, which the thread's
            # in-flight requests may be waiting on.
            await asyncio.get_running_loop().run_in_executor(None, probes.stop)

    # -- health ----------------------------------------------------------------------------------

    def _start_health(self) -> None:
        self.health.policy = health_policy(self.config.health, self.settings.env)
        self._health_judge(self.health, self.backend, self.inventory, self.node)

    def _on_health_flip(self, uuid: GpuUuid, healthy: bool, reason: str) -> None:
        if self.publisher is not None:
            self.publisher.changed()
        # A MIG device's own verdict reaches only its ids; its card's reaches them all.
        ids = [d.device_id for p in self.plans for d in p.devices if uuid in d.health_keys]
        resources = sorted(
            {p.resource_name for p in self.plans if any(uuid in d.health_keys for d in p.devices)}
        )
        log.log(
            logging.INFO if healthy else logging.WARNING,
            "node %s resource %s: %s %s is %s (%s); devices %s",
            self.node,
            ",".join(resources) or "-",
            "MIG device" if uuid.startswith("MIG-") else "GPU",
            uuid,
            "Healthy" if healthy else "Unhealthy",
            reason,
            ",".join(ids),
        )

    async def _stop_health(self) -> None:
        # Joins the judge's threads: off the loop, which their last hand-overs may wait on.
        await asyncio.get_running_loop().run_in_executor(None, self.health.close)

    # -- sharing ---------------------------------------------------------------------------------

    async def _start_sharing(self) -> None:
        if self.sharing is not None:
            await self.sharing.start(self.config, self.plans)

    # -- reload ----------------------------------------------------------------------------------

    async def _reload(self) -> bool:
        """Re-read the config; True when it changed and every server was restarted."""
        try:
            change = read_change(
                self.config,
                self.settings.config_path,
                self.settings.overrides,
                self.inventory,
                api=self.sharing is not None,  # the role gives sharing exactly the API access
                node_name=self.settings.node_name,
            )
        except ReloadRejected as err:
            log.error(
                "node %s: config reload rejected, keeping the running config: %s", self.node, err
            )
            return False
        if change is None:
            log.info("node %s: config reloaded; unchanged", self.node)
            return False
        await self._apply(change)
        return True

    async def _apply(self, change: ConfigChange) -> None:
        log.info(
            "node %s: config changed; restarting with %s", self.node, render_config(change.config)
        )
        await self.plugins.stop()
        if self.sharing is not None:
            await self.sharing.stop(keep_mps=change.keep_mps)
        self.config, self.plugins.plans = change.config, change.plans
        if self.publisher is not None:
            self.publisher.config = change.config
        if change.health:
            await self._stop_health()
            self._start_health()
        if change.probes:
            await self._stop_probes()
            try:
                self._start_probes()
            except ProbeServerError as err:
                # The probes then fail and the kubelet restarts us, which reports it again.
                log.error("node %s: %s; health endpoints are off until restart", self.node, err)
        if change.exporter:
            await self._exporter.restart(change.config.exporter, self.node)
        await self._start_sharing()
        self.cdi.write(self.config, all_gpus(self.plans), all_migs(self.plans))
        await self.plugins.start(self._servicer)
