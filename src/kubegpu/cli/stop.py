"""SIGTERM and SIGINT as a stop request that no moment of a command's start-up can lose.

Two ways the threaded commands lost a SIGTERM sent as their port opened:

* the handler was installed after start-up, so a signal during it met Python's default
  action (or, worse, a handler of a library) instead of a clean stop;
* the main thread waited without a timeout (``threading.Event().wait()``) while the handler
  called ``Event.set()``. A signal handler runs in the main thread between two bytecodes, and
  ``Event`` guards its flag with a plain ``Lock``: arriving while the main thread held that
  lock (entering or leaving the wait) the handler blocked on it forever; and a signal the
  kernel delivered to a serving thread left the main thread asleep in a wait that no one
  would end.

So the handler only sets a plain attribute (no lock), it is installed first thing, and the
main thread polls it with a short sleep, which a signal cuts short and which returns on its own
in any case.
"""

from __future__ import annotations

import signal
import time
from types import FrameType

POLL_S = 0.1


class StopRequest:
    """Install at the start of a command: ``stop.requested`` tells whether SIGTERM or SIGINT
    came; ``stop.wait()`` returns once one has (at once if one came during start-up)."""

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)):
        self.signal: int | None = None
        for signum in signals:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signal = signum  # a plain store: nothing here may take a lock

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def wait(self, poll_s: float = POLL_S) -> None:
        while self.signal is None:
            time.sleep(poll_s)
