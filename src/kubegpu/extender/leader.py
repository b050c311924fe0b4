"""Binding only while the kube-scheduler next to this extender holds the scheduler's Lease.

Where kube-scheduler runs replicated (one per control-plane node, each calling the extender on
its own host), each extender keeps its reservations in memory; two extenders binding at once
could each hand out the same card's last room to different pods, and a per-pod
resourceVersion cannot stop that. kube-scheduler itself only schedules while it holds its
leader-election Lease, but a bind it started can outlive its leadership (the extender keeps
serving a request whose caller is gone). So with ``leader-lease`` set, bind asks this gate
first: the Lease's ``holderIdentity`` (kube-scheduler writes ``<hostname>_<uuid>``) must be
this extender's identity (its host name by default: the same host as its kube-scheduler), and
the Lease must be live: renewed within its ``leaseDurationSeconds`` (a holder that stopped
renewing, e.g. a kube-scheduler that hung, leads nobody).

The answer is read from the API server, at most ``max_age_s`` old, one read at a time however
many binds ask. When this extender becomes the leader's, it lists the pods again before
deciding anything: decisions the previous leader's extender recorded just before the handover
may not have reached its watch yet.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

from kubegpu.core.apiserver import ApiUnavailable, LeaseState

log = logging.getLogger(__name__)


def default_identity() -> str:
    """This host's name: what kube-scheduler on the same host puts before ``_<uuid>``."""
    return socket.gethostname()


def holds(holder: str, identity: str) -> bool:
    """Whether a Lease ``holderIdentity`` names ``identity`` (kube-scheduler's own form is
    ``<identity>_<uuid>``; a holder written as the bare identity counts too)."""
    return bool(holder) and (holder == identity or holder.startswith(identity + "_"))


class LeaseReader(Protocol):
    """The API server's Leases (the kube edge's :class:`~kubegpu.kube.leases.LightkubeLeases`)."""

    async def read_lease(self, namespace: str, name: str) -> LeaseState:
        """Raises :class:`~kubegpu.core.apiserver.ApiUnavailable` when it cannot be read."""
        ...


class LeaderGate:
    """``await gate.refusal()``: "" while this extender may bind, else why it may not."""

    def __init__(
        self,
        leases: LeaseReader,
        lease: str,
        identity: str,
        *,
        catch_up: Callable[[], Awaitable[None]],
        max_age_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.leases = leases
        self.namespace, _, self.name = lease.partition("/")
        self.identity = identity
        self._catch_up = catch_up
        self.max_age_s = max_age_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = asyncio.Lock()
        self._checked_at: float | None = None
        self._refusal = ""
        self._leading = False  # as of the last check, caught up included

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def refusal(self) -> str:
        async with self._lock:  # one read at a time; the binds waiting share its answer
            now = self._clock()
            if self._checked_at is None or now - self._checked_at > self.max_age_s:
                self._refusal = await self._check()
                self._checked_at = self._clock()
            return self._refusal

    async def _check(self) -> str:
        try:
            spec = await self.leases.read_lease(self.namespace, self.name)
        except ApiUnavailable as exc:
            return self._lost(f"cannot read lease {self.lease}: {exc}")
        holder = spec.holder
        if not holds(holder, self.identity):
            return self._lost(
                f"kubegpu extender {self.identity!r} is not next to the leading kube-scheduler "
                f"(lease {self.lease} is held by {holder or 'nobody'!r}); refusing to bind"
            )
        stale = self._stale(holder, spec)
        if stale:
            return self._lost(stale)
        if not self._leading:
            try:
                await self._catch_up()
            except (ApiUnavailable, OSError) as exc:
                return f"kubegpu extender {self.identity!r} cannot list pods to take over: {exc}"
            self._leading = True
            log.info(
                "lease %s is held by %s: this extender (%s) binds from now on",
                self.lease,
                holder,
                self.identity,
            )
        return ""

    def _stale(self, holder: str, spec: LeaseState) -> str:
        """Why a Lease naming us is no leadership: its holder stopped renewing it
        (``renewTime + leaseDurationSeconds`` is past), or it says nothing of when; else "".

        renewTime is the holder's wall clock; the holder is the kube-scheduler on this host
        (that is what holding means here), so the two clocks are one."""
        renewed, duration = spec.renew_time, spec.duration_s
        if renewed is None or duration is None:
            return (
                f"lease {self.lease} held by {holder!r} has no renewTime or "
                "leaseDurationSeconds, so it cannot be told live; refusing to bind"
            )
        expired_at = renewed + timedelta(seconds=duration)
        now = self._wall_clock()
        if expired_at >= now:
            return ""
        ago_s = (now - expired_at).total_seconds()
        return (
            f"lease {self.lease} held by {holder!r} expired at "
            f"{expired_at.strftime('%Y-%m-%dT%H:%M:%SZ')} ({ago_s:.0f} s ago): its "
            "kube-scheduler stopped renewing it; refusing to bind"
        )

    def _lost(self, why: str) -> str:
        if self._leading or self._refusal != why:
            log.warning("%s", why)
        self._leading = False
        return why
