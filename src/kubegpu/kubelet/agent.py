"""The node agent's lifecycle: one supervisor that owns every task, socket and thread.

It serves each resource, registers it, and keeps it registered: when the kubelet restarts it
deletes every socket in its directory and recreates ``kubelet.sock``, and never reconnects on
its own, so we watch the directory (a cheap ``stat`` poll, which also works on filesystems
without inotify) and, on a new ``kubelet.sock`` or a missing socket of ours, stop the old
server (ending its stream), bind a fresh socket and register again. Registration failures are
retried with a bounded exponential backoff given as data. Signals arrive as events on the same
queue: SIGHUP reloads the config, SIGTERM/SIGINT stop everything and remove what we created.
With ``flags.healthListen`` set it also serves ``/healthz`` and ``/readyz``
(:mod:`~kubegpu.kubelet.probes`), answered from what this supervisor knows: which servers
answer on their sockets, and which resources are registered with the kubelet running now.
With ``exporter.enabled`` it also runs the Prometheus exporter (the same ``/metrics`` as
``kubegpu exporter``) on this process's GPU backend, reading GPU health and Xid counts from the
same :class:`~kubegpu.core.health_feed.HealthFeed` as the device plugin: one health record, one
NVML event set.

The supervisor knows its collaborators only by the ports declared here and in
:mod:`~kubegpu.kubelet.cluster` (a health judge, an exporter starter, the API server, the
kubelet's PodResources); :mod:`kubegpu.roles.node_agent` wires the real ones, so this edge
imports neither the inventory edge, the exporter nor lightkube.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from kubegpu.config.health import health_policy
from kubegpu.config.load import ConfigError, load_config, render_config
from kubegpu.config.model import AgentConfig, parse_listen_address
from kubegpu.config.model import Exporter as ExporterConfig
from kubegpu.core.backend import GpuBackend
from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.core.health_feed import HealthFeed
from kubegpu.httpd import HttpThread
from kubegpu.kubelet import cdi
from kubegpu.kubelet.plugin import (
    KUBELET_SOCKET,
    DevicePluginServicer,
    HealthBoard,
    PluginServer,
    SocketClaim,
    SocketInUse,
    socket_identity,
)
from kubegpu.kubelet.probes import ProbeResult, ProbeServerError, ping_all, start_probe_server
from kubegpu.kubelet.resources import PlanError, ResourcePlan, all_gpus, build_plans

if TYPE_CHECKING:
    # Imported where used: API access (lightkube) and card-level sharing are optional, and a
    # node agent serving whole GPUs should not pay their memory (the RSS target in
    # docs/benchmarks.md).
    from kubegpu.enforcement.mps import MpsDaemon
    from kubegpu.kubelet.cluster import NodeApi, PodResourcesApi
    from kubegpu.kubelet.coordinator import SharingCoordinator

log = logging.getLogger(__name__)

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class RetryBackoff:
    """Delay before retry ``attempt``, counted from 0: ``initial_s * factor**attempt``, capped.
    (The extender's watch counts failures from 1 instead: :class:`kubegpu.kube.view.Backoff`.)"""

    initial_s: float = 0.1
    factor: float = 2.0
    max_s: float = 5.0

    def delay(self, attempt: int) -> float:
        return min(self.max_s, self.initial_s * self.factor ** min(attempt, 64))


async def retry_with_backoff(
    operation: Callable[[], Awaitable[T]],
    backoff: RetryBackoff,
    *,
    describe: str,
    sleep: Sleep = asyncio.sleep,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
) -> T:
    """Run ``operation`` until it succeeds, sleeping ``backoff.delay(n)`` after failure n.

    Never gives up: a node agent that stops trying leaves the node without GPUs; the delay is
    bounded so a kubelet that comes back is noticed within ``max_s``.
    """
    attempt = 0
    while True:
        try:
            return await operation()
        except retry_on as err:
            delay = backoff.delay(attempt)
            log.warning(
                "%s failed (attempt %d): %s; retrying in %.2fs",
                describe,
                attempt + 1,
                _short(err),
                delay,
            )
            await sleep(delay)
            attempt += 1


def _short(err: BaseException) -> str:
    details = getattr(err, "details", None)
    text = details() if callable(details) else str(err)
    return str(text).splitlines()[0] if text else type(err).__name__


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


class RunningService(Protocol):
    def stop(self) -> None: ...


# Starts the exporter (its config, the metrics' node label, the health record it reads) on the
# agent's backend; raises OSError when its address cannot be served. None: the role has none.
ExporterStarter = Callable[[ExporterConfig, str, HealthFeed], RunningService]


class ExporterServerError(Exception):
    """``exporter.listen`` cannot be served (the port is taken, or not this host's address)."""


def no_health_judge(
    feed: HealthFeed, backend: GpuBackend, inventory: NodeInventory, node_name: str
) -> None:
    """For an agent wired without a monitor (tests of other parts): every GPU stays Healthy."""


def check_api_access(config: AgentConfig, *, api: bool, node_name: str) -> None:
    """Raise PlanError for a setting that needs API access the agent was not given."""
    if config.sharing.gpu_share.enabled and (not api or not node_name):
        raise PlanError(
            "sharing.gpuShare.enabled needs API access (--kubeconfig or in-cluster) and "
            "--node-name: share slots are served from the extender's pod annotations"
        )
    exporter = config.exporter
    if exporter.enabled and exporter.pod_directory == "api" and (not api or not node_name):
        raise PlanError(
            "exporter.podDirectory: api needs API access (--kubeconfig or in-cluster) and "
            "--node-name; use logs to name pods from the kubelet's log directory"
        )


@dataclass(frozen=True)
class AgentSettings:
    kubelet_dir: Path
    node_name: str = ""
    config_path: Path | None = None
    # Flag and environment values, applied over the file again on every reload.
    overrides: Mapping[str, object] = field(default_factory=dict)
    poll_interval_s: float = 0.1
    backoff: RetryBackoff = RetryBackoff()
    env: Mapping[str, str] = field(default_factory=dict)


class Agent:
    """Serves every resource plan of the node until told to stop; ``run()`` returns 0."""

    def __init__(
        self,
        settings: AgentSettings,
        config: AgentConfig,
        backend: GpuBackend,
        *,
        health_judge: HealthJudge = no_health_judge,
        start_exporter: ExporterStarter | None = None,
        sleep: Sleep = asyncio.sleep,
        api: NodeApi | None = None,
        pod_resources: PodResourcesApi | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_api_access(config, api=api is not None, node_name=settings.node_name)
        self.settings = settings
        self.api = api
        self.pod_resources = pod_resources
        self.config = config
        self.backend = backend
        self.node = settings.node_name or "-"
        self._health_judge = health_judge
        self._start_exporter_service = start_exporter
        self._sleep = sleep
        self._clock = clock
        self.inventory = backend.snapshot()
        self.plans: list[ResourcePlan] = build_plans(config, self.inventory)
        # The one record of GPU health; the board below mirrors its verdicts on the loop for
        # the ListAndWatch streams to wake on (and adds the cards blocked by sharing).
        self.health = HealthFeed(
            (gpu.uuid for gpu in self.inventory.gpus),
            health_policy(config.health, settings.env),
        )
        self.board = HealthBoard()
        self.servers: list[PluginServer] = []
        # socket path -> our claim on it, held from the first start to the final stop (kept
        # across server restarts, so another agent never slips in between).
        self.claims: dict[Path, SocketClaim] = {}
        self.waiting_for: str | None = None  # why no server runs yet: another agent owns one
        # resource -> (losses of its socket in a row, when it was last re-created).
        self._losses: dict[str, tuple[int, float]] = {}
        self.registrations: dict[str, asyncio.Task[None]] = {}
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self._judging = False
        self._cdi_spec: Path | None = None  # the CDI spec file this agent last wrote
        self._kubelet_socket: tuple[int, int] | None = None
        self.registered_count = 0  # successful Register calls, for logs and tests
        # resource -> identity of the kubelet.sock it was registered through (readiness).
        self.registered: dict[str, tuple[int, int] | None] = {}
        self.probes: HttpThread | None = None
        self._delayed: set[asyncio.Task[None]] = set()
        self.coordinator: SharingCoordinator | None = None
        self._coordinator_task: asyncio.Task[None] | None = None
        self.mps: MpsDaemon | None = None
        self._inventory_task: asyncio.Task[None] | None = None
        self._inventory_changed: asyncio.Event | None = None
        self.inventory_publications = 0
        self.exporter: RunningService | None = None

    @property
    def kubelet_socket(self) -> Path:
        return self.settings.kubelet_dir / KUBELET_SOCKET

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
                await self._start_exporter()
                self._start_health()
                self._start_inventory_publisher()
                await self._start_sharing()
                self._write_cdi()
                self._kubelet_socket = socket_identity(self.kubelet_socket)
                await self._start_servers()
            else:
                self.events.put_nowait(Event.STOP)
            failures = 0
            while True:
                pending = {await self.events.get()}
                while not self.events.empty():
                    pending.add(self.events.get_nowait())
                if Event.STOP in pending:
                    log.info("node %s: stopping", self.node)
                    break
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
        finally:
            await self._stop_probes()
            await self._stop_exporter()
            for task in [watcher, *self._delayed]:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self._stop_servers()
            self._release_claims(keep=())
            await self._stop_sharing()
            await self._stop_inventory_publisher()
            await self._stop_health()
            # The CDI spec stays: containers restarted while the agent is down or rolling out
            # resolve their CDI names through it (the next start rewrites it atomically).
        return 0

    async def _handle(self, pending: set[Event]) -> None:
        # Several events may arrive together; a reload that restarted everything covers a
        # kubelet restart and a lost socket, and a full restart covers a lost socket.
        if Event.RELOAD in pending and await self._reload():
            return
        if Event.KUBELET_RESTARTED in pending:
            log.info("node %s: kubelet restarted; re-registering", self.node)
            await self._restart_servers()
        elif Event.SOCKET_LOST in pending:
            await self._restart_lost_servers()

    def _later(self, delay_s: float, event: Event) -> None:
        async def post() -> None:
            await self._sleep(delay_s)
            self.events.put_nowait(event)

        task = asyncio.create_task(post(), name=f"later {event.value}")
        self._delayed.add(task)
        task.add_done_callback(self._delayed.discard)

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
        if any(not s.socket_intact() for s in self.servers):
            self.events.put_nowait(Event.SOCKET_LOST)

    # -- servers -------------------------------------------------------------------------------

    def _servicer(self, plan: ResourcePlan) -> DevicePluginServicer:
        return DevicePluginServicer(
            plan, self.inventory, self.config, self.board, self.node, hooks=self.coordinator
        )

    def _socket_path(self, plan: ResourcePlan) -> Path:
        return self.settings.kubelet_dir / plan.socket_name

    def _claim(self, plan: ResourcePlan) -> SocketClaim:
        """Our claim on the plan's socket, taken now if not held; raises SocketInUse."""
        path = self._socket_path(plan)
        claim = self.claims.get(path)
        if claim is None:
            claim = self.claims[path] = SocketClaim.acquire(path)
        return claim

    def _release_claims(self, keep: Iterable[Path]) -> None:
        for path in set(self.claims) - set(keep):
            self.claims.pop(path).release()

    async def _claim_sockets(self) -> bool:
        """Claim every plan's socket, waiting while another node agent owns one (the old pod of
        a rolling update, until it exits); False when told to stop meanwhile. Only events that
        need the servers running are dropped while waiting: a reload is kept for afterwards."""
        attempt = 0
        deferred: set[Event] = set()
        try:
            while True:
                try:
                    for plan in self.plans:
                        self._claim(plan)
                    return True
                except SocketInUse as err:
                    # Not even the stale-socket cleanup: the owner's socket is live.
                    self._release_claims(keep=())
                    if self.waiting_for != str(err):
                        self.waiting_for = str(err)
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
            if self.waiting_for is not None and self.claims:
                log.info("node %s: the other node agent is gone; serving", self.node)
            self.waiting_for = None
            for event in deferred:
                self.events.put_nowait(event)

    async def _start_servers(self) -> None:
        if not self.plans:
            log.warning("node %s: no GPU matches any resource; advertising nothing", self.node)
        for plan in self.plans:
            claim = self._claim(plan)
            server = PluginServer(self._servicer(plan), self.settings.kubelet_dir, claim=claim)
            await server.start()
            self.servers.append(server)
            self._register_later(server)
        # Sockets a reload stopped serving.
        self._release_claims(keep=[self._socket_path(p) for p in self.plans])

    def _register_later(self, server: PluginServer) -> None:
        old = self.registrations.pop(server.resource_name, None)
        if old is not None:
            old.cancel()

        async def register() -> None:
            if not self.kubelet_socket.exists():
                # Nothing to retry against; the directory watch registers us when it appears.
                log.info(
                    "node %s resource %s: waiting for %s",
                    self.node,
                    server.resource_name,
                    self.kubelet_socket,
                )
                return

            async def attempt() -> tuple[int, int] | None:
                # Which kubelet we register with: a restart before the reply leaves us not
                # ready (and re-registering) rather than ready with the old one.
                kubelet = socket_identity(self.kubelet_socket)
                await server.register()
                return kubelet

            kubelet = await retry_with_backoff(
                attempt,
                self.settings.backoff,
                describe=f"node {self.node} resource {server.resource_name}: register",
                sleep=self._sleep,
            )
            self.registered[server.resource_name] = kubelet
            self.registered_count += 1

        self.registrations[server.resource_name] = asyncio.create_task(
            register(), name=f"register {server.resource_name}"
        )

    async def _stop_servers(self) -> None:
        tasks = list(self.registrations.values())
        self.registrations.clear()
        self.registered.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        servers, self.servers = self.servers, []
        for server in servers:
            await server.stop()

    async def _restart_servers(self) -> None:
        # Stop (closing the old stream), fresh socket, register: the order the kubelet needs.
        await self._stop_servers()
        await self._start_servers()

    async def _restart_lost_servers(self) -> None:
        """Re-create each server whose socket is gone, with a backoff when it keeps going:
        the first loss is re-created at once, the next ones (each within a while of the one
        before) only after ``backoff.delay`` of the streak; the watch re-posts the loss on
        every poll, so a re-creation not yet due is simply left for a later one."""
        now = self._clock()
        for i, server in enumerate(self.servers):
            if server.socket_intact():
                continue
            streak, last = self._losses.get(server.resource_name, (0, -math.inf))
            if now - last > 4 * self.settings.backoff.max_s:
                streak = 0  # it held long enough: a fresh loss, not a fight
            if streak and now - last < self.settings.backoff.delay(streak - 1):
                continue
            self._losses[server.resource_name] = (streak + 1, now)
            log.warning(
                "node %s resource %s: socket %s was removed; recreating and re-registering%s",
                self.node,
                server.resource_name,
                server.socket_path,
                f" (lost {streak + 1} times in a row)" if streak else "",
            )
            task = self.registrations.pop(server.resource_name, None)
            if task is not None:
                task.cancel()
            self.registered.pop(server.resource_name, None)
            await server.stop()
            fresh = PluginServer(
                self._servicer(server.servicer.plan),
                self.settings.kubelet_dir,
                claim=self._claim(server.servicer.plan),
            )
            await fresh.start()
            self.servers[i] = fresh
            self._register_later(fresh)

    # -- probes: /healthz and /readyz ------------------------------------------------------------

    async def liveness(self) -> ProbeResult:
        """Alive when this runs at all (the loop turns) and every resource's server answers
        ``GetDevicePluginOptions`` on its socket."""
        if self.waiting_for is not None:
            # Alive and doing what it should (a rolling update's overlap): not restarted.
            return ProbeResult(True, f"waiting: {self.waiting_for}")
        serving = {s.resource_name for s in self.servers}
        missing = [p.resource_name for p in self.plans if p.resource_name not in serving]
        if missing:
            # Between stopping and starting servers (a reload or kubelet restart), briefly.
            return ProbeResult(False, f"not serving: {', '.join(missing)}")
        failures = await ping_all((s.resource_name, s.socket_path) for s in self.servers)
        if failures:
            return ProbeResult(False, f"gRPC server not answering: {failures}")
        names = ", ".join(s.resource_name for s in self.servers)
        return ProbeResult(True, f"ok: serving {names or 'nothing (no GPU matches any resource)'}")

    async def readiness(self) -> ProbeResult:
        """Ready when every resource is registered through the kubelet.sock that exists now."""
        if not self.plans:
            return ProbeResult(True, "ok: no GPU matches any resource; nothing to register")
        current = socket_identity(self.kubelet_socket)
        if current is None:
            return ProbeResult(False, f"not registered: no kubelet socket at {self.kubelet_socket}")
        missing = [
            p.resource_name for p in self.plans if self.registered.get(p.resource_name) != current
        ]
        if missing:
            return ProbeResult(False, f"not registered with the kubelet: {', '.join(missing)}")
        return ProbeResult(True, f"ok: registered {', '.join(p.resource_name for p in self.plans)}")

    def _start_probes(self) -> None:
        """Raises ProbeServerError when the address cannot be served."""
        listen = self.config.flags.health_listen
        if listen:
            self.probes = start_probe_server(
                parse_listen_address(listen), self, asyncio.get_running_loop(), node=self.node
            )

    async def _stop_probes(self) -> None:
        probes, self.probes = self.probes, None
        if probes is not None:
            # stop() waits for the serving thread to notice: off the loop, which the thread's
            # in-flight requests may be waiting on.
            await asyncio.get_running_loop().run_in_executor(None, probes.stop)

    # -- health --------------------------------------------------------------------------------

    def _start_health(self) -> None:
        loop = asyncio.get_running_loop()
        if not self._judging:
            # Called from a judge's thread (verdicts and Xid counts alike); the board lives on
            # the loop. Once per agent: the feed outlives a reload's restart of the judge.
            def mirror_on_loop() -> None:
                loop.call_soon_threadsafe(self._mirror_health)

            self.health.add_listener(mirror_on_loop)
        self.health.policy = health_policy(self.config.health, self.settings.env)
        self._health_judge(self.health, self.backend, self.inventory, self.node)
        self._judging = True

    def _mirror_health(self) -> None:
        verdicts = self.health.unhealthy()
        changed = [u for u in self.board.unhealthy if u not in verdicts]
        changed += [u for u in verdicts if self.board.unhealthy.get(u) != verdicts[u]]
        for uuid in changed:
            healthy = uuid not in verdicts
            reason = verdicts.get(uuid, "recovered")
            if not self.board.set(uuid, healthy, reason):
                continue
            if self._inventory_changed is not None:
                self._inventory_changed.set()
            self._log_health(uuid, healthy, reason)

    def _log_health(self, uuid: GpuUuid, healthy: bool, reason: str) -> None:
        ids = [d.device_id for p in self.plans for d in p.devices if d.gpu.uuid == uuid]
        resources = sorted(
            {p.resource_name for p in self.plans if any(g.uuid == uuid for g in p.gpus)}
        )
        log.log(
            logging.INFO if healthy else logging.WARNING,
            "node %s resource %s: GPU %s is %s (%s); devices %s",
            self.node,
            ",".join(resources) or "-",
            uuid,
            "Healthy" if healthy else "Unhealthy",
            reason,
            ",".join(ids),
        )

    async def _stop_health(self) -> None:
        # Joins the judge's threads: off the loop, which their last hand-overs may wait on.
        await asyncio.get_running_loop().run_in_executor(None, self.health.close)

    # -- exporter: /metrics ------------------------------------------------------------------

    async def _start_exporter(self) -> None:
        """Raises ExporterServerError when ``exporter.listen`` cannot be served; nothing of the
        exporter is left running then."""
        config = self.config.exporter
        if not config.enabled:
            return
        starter = self._start_exporter_service
        if starter is None:
            # A wiring mistake of the role, not a setting the admin can fix.
            raise RuntimeError("exporter.enabled, but this agent was wired without an exporter")

        def start() -> RunningService:
            # The metrics' node label: a node name is what dashboards join on.
            return starter(config, self.settings.node_name or socket.gethostname(), self.health)

        try:
            # Off the loop: it reads the backend once and opens the PodResources channel.
            self.exporter = await asyncio.get_running_loop().run_in_executor(None, start)
        except OSError as err:
            raise ExporterServerError(
                f"cannot serve the exporter's /metrics on {config.listen}: {err.strerror or err}"
            ) from err

    async def _stop_exporter(self) -> None:
        exporter, self.exporter = self.exporter, None
        if exporter is not None:
            # Joins its HTTP and refresher threads (the refresher waits out an NVML read).
            await asyncio.get_running_loop().run_in_executor(None, exporter.stop)

    # -- cluster: inventory annotation, sharing, MPS ------------------------------------------

    def _start_inventory_publisher(self) -> None:
        if self.api is None or not self.settings.node_name:
            log.info("node %s: no API access; the GPU inventory is not published", self.node)
            return
        self._inventory_changed = asyncio.Event()
        self._inventory_task = asyncio.create_task(
            self._publish_inventory(self.api, self._inventory_changed), name="publish-inventory"
        )

    async def _publish_inventory(self, api: NodeApi, changed: asyncio.Event) -> None:
        from kubegpu.kubelet.cluster import inventory_records
        from kubegpu.kubelet.peer_compat import publish_peer_capacity

        # The whole document from what we see now, on start, on every health change and
        # periodically (so a Node re-created or edited by hand gets it back).
        failures = 0
        while True:
            changed.clear()
            try:
                records = inventory_records(self.inventory, self.health.unhealthy().keys())
                await api.publish_inventory(records)
                # Re-asserted with it: the kubelet drops patched figures when it re-registers.
                await publish_peer_capacity(
                    api, self.config, [g.memory_total_mib for g in self.inventory.gpus]
                )
                self.inventory_publications += 1
                failures = 0
                wait_s = self.config.sharing.gpu_share.inventory_interval_s
            except Exception as err:  # API down: keep trying with the backoff
                wait_s = self.settings.backoff.delay(failures)
                failures += 1
                log.warning(
                    "node %s: publishing the GPU inventory failed: %s; retrying in %.1fs",
                    self.node,
                    _short(err),
                    wait_s,
                )
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns normally when the
            # event is set as the task is cancelled, and this loop would outlive its stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await changed.wait()

    async def _stop_inventory_publisher(self) -> None:
        task, self._inventory_task = self._inventory_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _start_sharing(self) -> None:
        share = self.config.sharing.gpu_share
        if not share.enabled or self.api is None:
            return
        from kubegpu.enforcement.mps import MpsDaemon, mps_spec_for
        from kubegpu.kubelet.coordinator import SharingCoordinator
        from kubegpu.kubelet.shares import MpsPaths

        slot_cards = [str(g.uuid) for p in self.plans if p.share_slots for g in p.gpus]
        paths = None
        if share.enforcement == "mps":
            spec = mps_spec_for(
                share.mps.control_command,
                share.mps.control_args,
                share.mps.host_dir,
                slot_cards,
                share.mps.restart_initial_s,
                share.mps.restart_max_s,
            )
            paths = MpsPaths(str(spec.pipe_dir), str(spec.log_dir))
            if self.mps is not None and self.mps.spec != spec:
                await self._stop_mps()
            if self.mps is None:
                self.mps = MpsDaemon(spec, node=self.node, sleep=self._sleep)
                await self.mps.start()
        else:
            await self._stop_mps()
        self.coordinator = SharingCoordinator(
            self.node,
            self.config,
            self.api,
            self.board,
            pod_resources=self.pod_resources,
            mps=paths,
        )
        self.coordinator.set_plans(self.plans)
        self._coordinator_task = asyncio.create_task(self.coordinator.run(), name="gpu-share")
        log.info(
            "node %s: GPU sharing on: %d slots on each of %d cards as %s, enforcement %s",
            self.node,
            share.slots_per_card,
            len(slot_cards),
            share.resource_name,
            share.enforcement,
        )

    async def _stop_sharing(self, *, keep_mps: bool = False) -> None:
        """Stop the coordinator; the MPS daemon too unless ``keep_mps`` (a reload keeps it
        when its settings are unchanged: restarting it would cut off running CUDA clients)."""
        task, self._coordinator_task = self._coordinator_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.coordinator = None
        if not keep_mps:
            await self._stop_mps()

    async def _stop_mps(self) -> None:
        mps, self.mps = self.mps, None
        if mps is not None:
            await mps.stop()

    # -- CDI -------------------------------------------------------------------------------------

    def _write_cdi(self) -> None:
        """Write the CDI spec of the current config (atomically: never absent, never half).

        A spec this agent wrote under another kind or directory (before a reload) is removed:
        its names are no longer handed out, and an old kind may clash with another vendor's.
        """
        plugin = self.config.flags.plugin
        path: Path | None = None
        if self.config.uses_cdi:
            spec = cdi.cdi_spec(
                all_gpus(self.plans), plugin.cdi_kind, plugin.device_id_strategy, plugin.dev_root
            )
            path = cdi.write_spec(Path(plugin.cdi_dir), spec)
            log.info(
                "node %s: wrote CDI spec %s (%d GPUs)", self.node, path, len(spec["devices"]) - 1
            )
        previous, self._cdi_spec = self._cdi_spec, path
        if previous is not None and previous != path:
            previous.unlink(missing_ok=True)
            log.info("node %s: removed CDI spec %s of the previous config", self.node, previous)

    # -- reload ----------------------------------------------------------------------------------

    async def _reload(self) -> bool:
        """Re-read the config; True when it changed and every server was restarted."""
        try:
            new = load_config(self.settings.config_path, self.settings.overrides)
            plans = build_plans(new, self.inventory)
            check_api_access(new, api=self.api is not None, node_name=self.settings.node_name)
        except (ConfigError, PlanError) as err:
            log.error(
                "node %s: config reload rejected, keeping the running config: %s", self.node, err
            )
            return False
        if new == self.config:
            log.info("node %s: config reloaded; unchanged", self.node)
            return False
        log.info("node %s: config changed; restarting with %s", self.node, render_config(new))
        await self._stop_servers()
        health_changed = new.health != self.config.health
        probes_changed = new.flags.health_listen != self.config.flags.health_listen
        exporter_changed = new.exporter != self.config.exporter
        await self._stop_sharing(keep_mps=new.sharing.gpu_share.enabled)
        self.config, self.plans = new, plans
        if health_changed:
            await self._stop_health()
            self._start_health()
        if probes_changed:
            await self._stop_probes()
            try:
                self._start_probes()
            except ProbeServerError as err:
                # The probes then fail and the kubelet restarts us, which reports it again.
                log.error("node %s: %s; health endpoints are off until restart", self.node, err)
        if exporter_changed:
            await self._stop_exporter()
            try:
                await self._start_exporter()
            except ExporterServerError as err:
                log.error(
                    "node %s: %s; the exporter is off until the next config change or restart",
                    self.node,
                    err,
                )
        await self._start_sharing()
        self._write_cdi()
        await self._start_servers()
        return True
