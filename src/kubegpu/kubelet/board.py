"""What the ``ListAndWatch`` streams watch: GPU health from the node's one record, and the cards
GPU sharing withdraws.

Health is not kept here: the board reads every verdict from the
:class:`~kubegpu.core.health_feed.HealthFeed` the health monitor writes, and subscribes to it
only to wake the streams (on the agent's event loop) when one flips. What the board does own is
the other reason a device is offered as Unhealthy although its GPU is fine: the sharing
coordinator withdraws a card from one resource while the other resource holds it (whole vs
shared; see :mod:`~kubegpu.kubelet.coordinator`). Every stream of every resource waits on the
same board, so a change reaches all of them at once and every id of a GPU (replicas, share
slots) flips together.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.health_feed import HealthFeed

# Told on the loop of each verdict that flipped (after the streams were woken).
FlipListener = Callable[[GpuUuid, bool, str], None]


class DeviceBoard:
    """The streams' view of device availability; lives on one event loop.

    It subscribes to ``health`` when first used on a running loop (the version a stream reads
    before its first list), so no flip after that is missed; :meth:`close` ends the
    subscription."""

    def __init__(self, health: HealthFeed) -> None:
        self.health = health
        # Per resource: cards whose ids are withdrawn (reported Unhealthy) although the GPU is
        # fine, because the card is in use the other way (whole vs shared; see coordinator).
        self.blocked: dict[str, frozenset[GpuUuid]] = {}
        self._version = 0
        self._changed = asyncio.Event()
        self._unsubscribe: Callable[[], None] | None = None
        self._flip_listeners: list[FlipListener] = []

    @property
    def unhealthy(self) -> Mapping[GpuUuid, str]:
        """Every GPU the health record holds unhealthy now, with why (read, not copied)."""
        return self.health.unhealthy()

    @property
    def version(self) -> int:
        self._subscribe()
        return self._version

    def on_flip(self, listener: FlipListener) -> None:
        """Also tell ``listener`` (on the loop) of each verdict that flips."""
        self._subscribe()
        self._flip_listeners.append(listener)

    def unusable(self, resource: str) -> set[GpuUuid]:
        return set(self.unhealthy) | self.blocked.get(resource, frozenset())

    def set_blocked(self, resource: str, uuids: frozenset[GpuUuid]) -> bool:
        if self.blocked.get(resource, frozenset()) == uuids:
            return False
        self.blocked[resource] = uuids
        self._bump()
        return True

    async def wait_for_change(self, seen_version: int) -> int:
        self._subscribe()
        while self._version == seen_version:
            await self._changed.wait()
        return self._version

    def close(self) -> None:
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    def _subscribe(self) -> None:
        if self._unsubscribe is not None:
            return
        loop = asyncio.get_running_loop()

        def flipped(uuid: GpuUuid, healthy: bool, reason: str) -> None:
            # On the judge's thread: hand over to the loop. A loop already closed (the agent
            # stopped before its judge) has no stream left to wake.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._flipped, uuid, healthy, reason)

        self._unsubscribe = self.health.subscribe(flipped)

    def _flipped(self, uuid: GpuUuid, healthy: bool, reason: str) -> None:
        self._bump()
        for listener in self._flip_listeners:
            listener(uuid, healthy, reason)

    def _bump(self) -> None:
        self._version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
