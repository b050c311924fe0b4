"""The one record of GPU health on a node: verdicts (with why), Xid counts, and who to tell.

Health has one rule in kubegpu: the health monitor (:class:`~kubegpu.inventory.health.
HealthMonitor`, applying :class:`~kubegpu.core.health.HealthCheckPolicy`) judges, and writes
its verdicts and every event it reads here. Everything that shows health reads this record
rather than keeping a copy: the device plugin's ``ListAndWatch`` streams, the
``kubegpu.io/gpu-inventory`` annotation, the exporter's ``kubegpu_gpu_healthy`` and Xid
counters, the labeller's ``kubegpu.io/gpu.healthy-count``. So they cannot disagree, and a
consumer started late (the exporter after a reload) sees the verdicts made before it.

It lives in the core because the kubelet, exporter and labels edges all read it and none may
import another. It judges nothing and does no I/O; the composition roots (:mod:`kubegpu.roles`)
attach the monitor that feeds it. Thread-safe: monitors call it from their own threads, and
listeners are called on the caller's thread after each change (the node agent's device board
hands them over to its event loop). Two kinds: :meth:`add_listener` hears every change (a
verdict or an Xid counted), :meth:`subscribe` hears each verdict that flips, with its GPU and
reason, so a consumer that acts on flips never keeps a copy of the verdicts to compare with.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Mapping

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.health import HealthCheckPolicy, HealthEvent
from kubegpu.core.metrics import HealthTally, count_xid

# Told of one verdict that flipped: (GPU, healthy now, the judge's reason).
VerdictListener = Callable[[GpuUuid, bool, str], None]


class HealthFeed:
    def __init__(
        self, gpus: Iterable[GpuUuid] = (), policy: HealthCheckPolicy | None = None
    ) -> None:
        # The policy the attached judge applies; kept here so a standalone role's judge and its
        # readers are configured in one place.
        self.policy = policy or HealthCheckPolicy()
        self._lock = threading.Lock()
        self._tally = HealthTally()
        self._reasons: dict[GpuUuid, str] = {}
        # GPUs whose Unhealthy verdict came from an Xid after which only a node restart may clear
        # it, with that Xid: kept in the record, not the judge, so that a judge restarted on it
        # (a reload of the health settings) still holds them.
        self._held_for_reboot: dict[GpuUuid, int] = {}
        self._gpus = tuple(gpus)
        self._listeners: list[Callable[[], None]] = []
        self._verdict_listeners: list[VerdictListener] = []
        self._judge_stop: Callable[[float], None] | None = None

    @property
    def gpus(self) -> tuple[GpuUuid, ...]:
        return self._gpus

    def set_gpus(self, gpus: Iterable[GpuUuid]) -> None:
        """The GPUs an Xid naming no GPU counts on (the judge's inventory)."""
        self._gpus = tuple(gpus)

    def add_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def subscribe(self, listener: VerdictListener) -> Callable[[], None]:
        """Tell ``listener`` of every verdict that flips from now on; returns the call that
        ends the subscription (a consumer that stops before the feed does, e.g. one agent's
        device board in a process that runs several)."""
        with self._lock:
            self._verdict_listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._verdict_listeners.remove(listener)

        return unsubscribe

    def count(self, event: HealthEvent) -> None:
        """Count an event's Xid, leaving health to :meth:`set_healthy`'s judge."""
        with self._lock:
            self._tally = count_xid(self._tally, event, self._gpus)
        self._notify()

    def set_healthy(self, uuid: GpuUuid, healthy: bool, reason: str = "") -> bool:
        """Take a health verdict from the judge; True (and listeners told) when it changed."""
        with self._lock:
            if healthy == self._tally.healthy(uuid):
                return False
            self._tally = self._tally.with_health(uuid, healthy)
            if healthy:
                self._reasons.pop(uuid, None)
                self._held_for_reboot.pop(uuid, None)
            else:
                self._reasons[uuid] = reason
            verdict_listeners = list(self._verdict_listeners)
        for listener in verdict_listeners:
            listener(uuid, healthy, reason)
        self._notify()
        return True

    def hold_for_reboot(self, uuid: GpuUuid, xid: int) -> None:
        """Note that Xid ``xid`` asked for a node reboot before ``uuid`` is used again (the first
        such Xid is kept until a Healthy verdict ends the hold)."""
        with self._lock:
            self._held_for_reboot.setdefault(uuid, xid)

    def held_for_reboot(self, uuid: GpuUuid) -> int | None:
        """The Xid that holds ``uuid`` until a node reboot, or None."""
        with self._lock:
            return self._held_for_reboot.get(uuid)

    def healthy(self, uuid: GpuUuid) -> bool:
        """The verdict on one GPU now (a GPU never judged is healthy)."""
        return self.tally().healthy(uuid)

    def _notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    def tally(self) -> HealthTally:
        with self._lock:
            return self._tally

    def unhealthy(self) -> Mapping[GpuUuid, str]:
        """Every GPU judged unhealthy now, with the judge's reason."""
        with self._lock:
            return dict(self._reasons)

    def healthy_map(self) -> dict[GpuUuid, bool]:
        tally = self.tally()
        return {uuid: tally.healthy(uuid) for uuid in self._gpus}

    def attach_judge(self, stop: Callable[[float], None]) -> None:
        """Record the running judge's stop, so :meth:`close` ends it (one judge per feed)."""
        if self._judge_stop is not None:
            raise RuntimeError("HealthFeed has a judge already")
        self._judge_stop = stop

    def close(self, timeout_s: float = 5.0) -> None:
        stop, self._judge_stop = self._judge_stop, None
        if stop is not None:
            stop(timeout_s)
