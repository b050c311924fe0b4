"""The node's device plugins as one set: a gRPC server per resource plan, its socket claim, its
registration with the kubelet, and the probes' view of all of them.

The kubelet deletes every socket in its directory when it restarts and never reconnects on its
own, so the set is restarted as a whole on a new ``kubelet.sock`` (stop the old servers, ending
their streams, bind fresh sockets, register again) and server by server when one of our sockets
is removed. Registration is retried with the agent's bounded backoff. The set answers
``/healthz`` and ``/readyz`` (:mod:`~kubegpu.kubelet.probes`) from what it knows: which servers
answer on their sockets, and which resources are registered with the kubelet running now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from kubegpu.kubelet.plugin import KUBELET_SOCKET, ROLE, DevicePluginServicer, PluginServer
from kubegpu.kubelet.probes import ping_all
from kubegpu.kubelet.resources import ResourcePlan
from kubegpu.kubelet.retry import RetryBackoff, Sleep, retry_with_backoff
from kubegpu.probes import ProbeResult
from kubegpu.socket_claim import SocketClaim, socket_identity

log = logging.getLogger(__name__)

# Makes the servicer of one plan from the agent's current config, board and sharing hooks.
ServicerFactory = Callable[[ResourcePlan], DevicePluginServicer]


class PluginSet:
    """Serves and registers every plan in ``plans``; also the probe server's target."""

    def __init__(
        self,
        kubelet_dir: Path,
        node: str,
        backoff: RetryBackoff,
        *,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kubelet_dir = kubelet_dir
        self.node = node
        self.backoff = backoff
        self._sleep = sleep
        self._clock = clock
        self.plans: list[ResourcePlan] = []
        self.servers: list[PluginServer] = []
        # socket path -> our claim on it, held from the first start to the final stop (kept
        # across server restarts, so another agent never slips in between).
        self.claims: dict[Path, SocketClaim] = {}
        self.waiting_for: str | None = None  # why no server runs yet: another agent owns one
        # resource -> (losses of its socket in a row, when it was last re-created).
        self._losses: dict[str, tuple[int, float]] = {}
        self.registrations: dict[str, asyncio.Task[None]] = {}
        self.registered_count = 0  # successful Register calls, for logs and tests
        # resource -> identity of the kubelet.sock it was registered through (readiness).
        self.registered: dict[str, tuple[int, int] | None] = {}

    @property
    def kubelet_socket(self) -> Path:
        return self.kubelet_dir / KUBELET_SOCKET

    # -- socket claims ---------------------------------------------------------------------

    def _socket_path(self, plan: ResourcePlan) -> Path:
        return self.kubelet_dir / plan.socket_name

    def claim(self, plan: ResourcePlan) -> SocketClaim:
        """Our claim on the plan's socket, taken now if not held; raises SocketInUse."""
        path = self._socket_path(plan)
        claim = self.claims.get(path)
        if claim is None:
            claim = self.claims[path] = SocketClaim.acquire(path, role=ROLE)
        return claim

    def claim_all(self) -> None:
        """Claim every plan's socket, or none (raises SocketInUse naming the owner)."""
        try:
            for plan in self.plans:
                self.claim(plan)
        except BaseException:
            self.release_claims(keep=())
            raise

    def release_claims(self, keep: Iterable[Path]) -> None:
        for path in set(self.claims) - set(keep):
            self.claims.pop(path).release()

    # -- servers ---------------------------------------------------------------------------

    async def start(self, make_servicer: ServicerFactory) -> None:
        if not self.plans:
            log.warning("node %s: no GPU matches any resource; advertising nothing", self.node)
        for plan in self.plans:
            server = PluginServer(make_servicer(plan), self.kubelet_dir, claim=self.claim(plan))
            await server.start()
            self.servers.append(server)
            self._register_later(server)
        # Sockets a reload stopped serving.
        self.release_claims(keep=[self._socket_path(p) for p in self.plans])

    async def stop(self) -> None:
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

    async def restart(self, make_servicer: ServicerFactory) -> None:
        # Stop (closing the old stream), fresh socket, register: the order the kubelet needs.
        await self.stop()
        await self.start(make_servicer)

    def any_socket_lost(self) -> bool:
        return any(not s.socket_intact() for s in self.servers)

    async def restart_lost(self, make_servicer: ServicerFactory) -> None:
        """Re-create each server whose socket is gone, with a backoff when it keeps going:
        the first loss is re-created at once, the next ones (each within a while of the one
        before) only after ``backoff.delay`` of the streak; the watch re-posts the loss on
        every poll, so a re-creation not yet due is simply left for a later one."""
        now = self._clock()
        for i, server in enumerate(self.servers):
            if server.socket_intact():
                continue
            streak, last = self._losses.get(server.resource_name, (0, -math.inf))
            if now - last > 4 * self.backoff.max_s:
                streak = 0  # it held long enough: a fresh loss, not a fight
            if streak and now - last < self.backoff.delay(streak - 1):
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
            plan = server.servicer.plan
            fresh = PluginServer(make_servicer(plan), self.kubelet_dir, claim=self.claim(plan))
            await fresh.start()
            self.servers[i] = fresh
            self._register_later(fresh)

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
                self.backoff,
                describe=f"node {self.node} resource {server.resource_name}: register",
                sleep=self._sleep,
            )
            self.registered[server.resource_name] = kubelet
            self.registered_count += 1

        self.registrations[server.resource_name] = asyncio.create_task(
            register(), name=f"register {server.resource_name}"
        )

    # -- probes: /healthz and /readyz --------------------------------------------------------

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
