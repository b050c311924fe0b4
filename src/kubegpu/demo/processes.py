"""Child processes of the demo: start them, find out when they are up, stop every one of them.

Owns the demo's promise to leave nothing behind: each child runs in its own session (so a
terminal's Ctrl-C reaches only the demo, which then stops children in reverse start order), logs
to a file in the demo's work directory (its tail goes into any error naming the component), and
is stopped with SIGTERM, a bounded wait, then SIGKILL. Pids are appended to an optional pid
file as children start, so a test can check afterwards that none survived.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0


class ComponentError(Exception):
    """A component did not come up; the message names it and ends with its log tail."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM arrived; the argument is the signal's name."""


class InterruptGuard:
    """SIGINT/SIGTERM raise :class:`Interrupted`, except inside :meth:`critical`, where the
    signal is held until the section ends: a signal landing between fork and the bookkeeping
    of a new child would otherwise leave that child unknown, and so never stopped."""

    def __init__(self) -> None:
        self._depth = 0
        self._pending: str | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._depth:
            self._pending = self._pending or name
            return
        raise Interrupted(name)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if not self._depth and self._pending is not None:
            name, self._pending = self._pending, None
            raise Interrupted(name)


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self, limit: int = 3000) -> str:
        self.log_file.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return text[-limit:] if text.strip() else "(no output)"

    def failure(self, what: str) -> ComponentError:
        return ComponentError(f"{self.name}: {what}\n--- {self.name} log tail ---\n{self.tail()}")


def kubegpu_command(*args: str, log_level: str = "info") -> list[str]:
    """``python -m kubegpu`` with the current interpreter, so a venv without scripts works."""
    return [sys.executable, "-m", "kubegpu", "--log-level", log_level, *args]


class Supervisor:
    """Owns every child it started; :meth:`stop_all` is safe to call more than once."""

    def __init__(
        self, log_dir: Path, pid_file: Path | None = None, guard: InterruptGuard | None = None
    ) -> None:
        self.log_dir = log_dir
        self.pid_file = pid_file
        self.guard = guard or InterruptGuard()
        self.children: list[Child] = []

    def start(self, name: str, command: Sequence[str], env: dict[str, str] | None = None) -> Child:
        log_path = self.log_dir / f"{name}.log"
        with self.guard.critical():
            log_file = log_path.open("wb")
            try:
                process = subprocess.Popen(
                    list(command),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, **(env or {})},
                )
            except OSError as exc:
                log_file.close()
                raise ComponentError(f"{name}: cannot start {command[0]}: {exc}") from None
            child = Child(name, process, log_path, log_file)
            self.children.append(child)
            if self.pid_file is not None:
                with self.pid_file.open("a", encoding="utf-8") as handle:
                    handle.write(f"{process.pid} {name}\n")
        log.info("started %s (pid %d)", name, process.pid)
        return child

    def check_alive(self) -> None:
        """Raise for the first child that exited on its own."""
        for child in self.children:
            code = child.process.poll()
            if code is not None:
                raise child.failure(f"exited with code {code}")

    def wait_for(
        self,
        child: Child,
        ready: Callable[[], bool],
        what: str,
        timeout_s: float,
        poll_s: float = 0.05,
    ) -> None:
        """Poll ``ready`` until true; fail early (with the log tail) when ``child`` exits."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            code = child.process.poll()
            if code is not None:
                raise child.failure(f"exited with code {code} before {what}")
            if time.monotonic() > deadline:
                raise child.failure(f"not {what} after {timeout_s:g} s")
            time.sleep(poll_s)

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> dict[str, int]:
        """SIGTERM every child (newest first), wait up to ``grace_s`` in all, SIGKILL the rest.
        Returns name -> exit code."""
        codes: dict[str, int] = {}
        alive = [c for c in reversed(self.children) if c.process.poll() is None]
        for child in alive:
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in alive:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) ignored SIGTERM; killing it", child.name, child.pid)
                child.process.kill()
                child.process.wait()
        for child in self.children:
            codes[child.name] = child.process.wait()
            child.log_file.close()
        self.children.clear()
        return codes
