"""Keeps a node's GPU labels current: relabel when a fact changes, and re-assert periodically.

Each tick reads the inventory (cheap for the fake, one NVML pass for the real backend) and the
health map, computes the labels and writes them when they differ from what was last written
(ignoring the timestamp), or when ``resync_s`` has passed since the last write: someone may
have edited the Node or deleted the feature file, and GFD likewise rewrites every interval.
:meth:`Labeller.notify` wakes the loop at once (the health feed calls it on every event).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.labels.catalogue import TIMESTAMP, SharingSummary, compute_labels
from kubegpu.labels.sinks import LabelSink

log = logging.getLogger(__name__)


class Labeller:
    def __init__(
        self,
        *,
        inventory: Callable[[], NodeInventory],
        sink: LabelSink,
        health: Callable[[], Mapping[GpuUuid, bool]] = dict,
        sharing: SharingSummary | None = None,
        clock: Callable[[], float] = time.time,
        timestamp: bool = True,
        poll_s: float = 10.0,
        resync_s: float = 60.0,
    ) -> None:
        self._inventory = inventory
        self._sink = sink
        self._health = health
        self.sharing = sharing or SharingSummary()
        self._clock = clock
        self._timestamp = timestamp
        self.poll_s = poll_s
        self.resync_s = resync_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_facts: dict[str, str] | None = None
        self._last_write: float | None = None
        self.writes = 0

    def current_labels(self) -> dict[str, str]:
        return compute_labels(
            self._inventory(),
            health=self._health(),
            sharing=self.sharing,
            now=self._clock() if self._timestamp else None,
        )

    def refresh_once(self, *, force: bool = False) -> bool:
        """Compute and, if anything changed (or a resync is due, or ``force``), write the
        labels. ``True`` when the sink was written."""
        labels = self.current_labels()
        facts = {k: v for k, v in labels.items() if k != TIMESTAMP}
        now = self._clock()
        due = self._last_write is None or now - self._last_write >= self.resync_s
        if not force and not due and facts == self._last_facts:
            return False
        changed = sorted(
            k
            for k in set(facts) | set(self._last_facts or {})
            if facts.get(k) != (self._last_facts or {}).get(k)
        )
        self._sink.apply(labels)
        self._last_facts, self._last_write = facts, now
        self.writes += 1
        if self.writes == 1:
            log.info("wrote %d labels", len(labels))
        elif changed:
            log.info("labels changed: %s", ", ".join(changed))
        return True

    def notify(self) -> None:
        """Something changed (health, config): relabel now instead of at the next tick."""
        self._wake.set()

    def run(self) -> None:
        """Label until :meth:`stop`. A failed write is logged and retried on the next tick."""
        while not self._stop.is_set():
            try:
                self.refresh_once()
            except Exception:
                log.exception("labelling failed; retrying in %.0fs", self.poll_s)
                self._last_write = None  # make the retry write even if facts are unchanged
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
