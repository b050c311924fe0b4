"""Keeps a node's GPU labels current: relabel when a fact changes, and re-assert periodically.

Each tick reads the inventory (cheap for the fake, one NVML pass for the real backend) and the
health map, computes the labels and hands them to the sink when they differ from what was last
written, or when ``resync_s`` has passed since the last write: someone may have edited the
Node or deleted the feature file, and GFD likewise re-asserts every interval. A resync finds
nothing to do when nothing changed (the Node sink sends no patch, the NFD sink leaves the file
as it is). :meth:`Labeller.notify` wakes the loop at once (the health feed calls it on every
event).

The timestamp (``nvidia.com/gfd.timestamp``, GFD's name) is **when the other labels last
changed**, not when the labeller last ran as in GFD. With GFD's meaning every node would patch
itself every interval although nothing changed: about 17 Node writes a second on a 1,000-node
cluster at the 60 s default, each one a watch event for every Node watcher (``kubectl gpu
inspect --watch`` included). After a restart the labeller keeps the timestamp it finds on the
sink when the other labels there are the ones it would write. ``timestamp=False``
(``--no-timestamp``) leaves the label out (and removes it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.labels.catalogue import (
    RETIRED_KEYS,
    TIMESTAMP,
    HostFacts,
    SharingSummary,
    compute_labels,
    owns_label,
)
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
        host: HostFacts | None = None,
        clock: Callable[[], float] = time.time,
        timestamp: bool = True,
        poll_s: float = 10.0,
        resync_s: float = 60.0,
    ) -> None:
        self._inventory = inventory
        self._sink = sink
        self._health = health
        self.sharing = sharing or SharingSummary()
        self._host = host or HostFacts()
        self._clock = clock
        self._timestamp = timestamp
        self.poll_s = poll_s
        self.resync_s = resync_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_facts: dict[str, str] | None = None
        self._last_write: float | None = None
        self._changed_at: float | None = None  # when the facts last changed: the timestamp
        self.writes = 0

    def current_facts(self) -> dict[str, str]:
        """Every label but the timestamp."""
        return compute_labels(
            self._inventory(), health=self._health(), sharing=self.sharing, host=self._host
        )

    def refresh_once(self, *, force: bool = False) -> bool:
        """Compute the labels and, if anything changed (or a resync is due, or ``force``), hand
        them to the sink. ``True`` when the sink was asked to apply them."""
        facts = self.current_facts()
        now = self._clock()
        if self._last_facts is None:
            self._changed_at = self._stamp_on_sink(facts) or now
        elif facts != self._last_facts:
            self._changed_at = now
        due = self._last_write is None or now - self._last_write >= self.resync_s
        if not force and not due and facts == self._last_facts:
            return False
        changed = sorted(
            k
            for k in set(facts) | set(self._last_facts or {})
            if facts.get(k) != (self._last_facts or {}).get(k)
        )
        labels = dict(facts)
        if self._timestamp and self._changed_at is not None:
            labels[TIMESTAMP] = str(int(self._changed_at))
        self._sink.apply(dict(sorted(labels.items())))
        self._last_facts, self._last_write = facts, now
        self.writes += 1
        if self.writes == 1:
            log.info("wrote %d labels", len(labels))
        elif changed:
            log.info("labels changed: %s", ", ".join(changed))
        return True

    def _stamp_on_sink(self, facts: Mapping[str, str]) -> float | None:
        """The timestamp already on the sink when the rest of what it holds of ours is
        ``facts`` (a restart with nothing changed keeps it); else ``None``."""
        if not self._timestamp:
            return None
        held = self._sink.current()
        if held is None or TIMESTAMP not in held:
            return None
        ours = {
            k: v
            for k, v in held.items()
            if owns_label(k) and k != TIMESTAMP and k not in RETIRED_KEYS
        }
        if ours != facts:
            return None
        try:
            return float(held[TIMESTAMP])
        except ValueError:
            return None

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
