"""The extender's cyclic garbage collection: young generations between verbs, the rest frozen.

Python's collector runs a generation when its *net* count of new containers passes a
threshold. The extender's steady churn is one-for-one replacement: the watch brings a pod and
the view drops the old copy, a decision parses a claim and a bind replaces it. The counter
then barely moves while the young generations fill with survivors. Issue 32's soak at 5,000
nodes found 26,000-49,000 young objects at each automatic generation-1 collection, every
10-20 s, and each took 8-37 ms on whichever thread allocated next, most often the event
loop's inside a verb: the soak's slowest decisions away from an engine swap.

So the extender collects the young generations itself (:func:`collect_between_verbs`), every
:data:`COLLECT_EVERY_S`, at a moment when no verb is in flight (waiting at most
:data:`COLLECT_WAIT_MAX_S` for one). A quarter second of churn is a few hundred objects, well
under a millisecond to scan. The automatic trigger stays, raised to :data:`SAFETY_THRESHOLD`,
for the case where the loop cannot run this task.

What survives goes to the old generation, which no collection scans: once synced, and then
every :data:`REFREEZE_S`, it is frozen. Full collections of the heap (the view's pods and
nodes, parsed JSON that holds no cycles and is freed by reference count) cost 100-580 ms
every few minutes at 5,000 nodes before the freeze. The cost: a cycle that becomes garbage
after reaching the old generation is never collected. A replaced placement engine is retired
explicitly, not left to the collector. ``kubegpu_extender_heap_frozen_objects`` shows the
frozen set's size, so a leak would be seen.

Not while a workload refresh builds an engine in its thread: it pauses the collector
(:func:`kubegpu.extender.refresh.collector_paused`) and freezes what its build leaves. A
collection here then would scan the build's objects on the event loop, so it waits for the
build to end.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

# How often the young generations are collected, and how long a collection waits for a moment
# with no verb in flight before it runs anyway (a loop busy without pause still collects).
COLLECT_EVERY_S = 0.25
COLLECT_WAIT_MAX_S = 1.0
IDLE_POLL_S = 0.005
# How often the old generation is frozen.
REFREEZE_S = 60.0
# The automatic young collection's net count while this runs (CPython's default is 700).
SAFETY_THRESHOLD = 50_000


async def collect_between_verbs(idle: Callable[[], bool], stopped: asyncio.Future[Any]) -> None:
    """Collect the young generations between verbs and freeze the old one, until ``stopped``.

    ``idle`` says whether no verb is being served now. The automatic thresholds are restored
    on return."""
    thresholds = gc.get_threshold()
    gc.set_threshold(SAFETY_THRESHOLD, *thresholds[1:])
    try:
        frozen_at: float | None = None
        while not stopped.done():
            due = time.monotonic() + COLLECT_WAIT_MAX_S
            while not idle() and time.monotonic() < due and not stopped.done():
                await asyncio.sleep(IDLE_POLL_S)
            if stopped.done():
                return
            if gc.isenabled():  # not while a refresh builds: its end freezes what it left
                gc.collect(1)
                if frozen_at is None or time.monotonic() - frozen_at >= REFREEZE_S:
                    gc.freeze()
                    frozen_at = time.monotonic()
            await asyncio.sleep(COLLECT_EVERY_S)
    finally:
        gc.set_threshold(*thresholds)
