"""Host processes of the suite: started in their own session with output to a log file, stopped
by process group, and, at the end, everything that mentions the run's folder hunted down (the
containerd shims and container processes reparent away from the processes we started)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class StartError(RuntimeError):
    """A component did not come up; the message names it and ends with its log's tail."""


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


@dataclass
class HostProcess:
    name: str
    argv: Sequence[str]
    log: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> HostProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"\n=== start {' '.join(self.argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        return self

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise StartError(
                    f"{self.name} exited (code {self.popen.returncode if self.popen else '?'}) "
                    f"before {what}; its log ({self.log}) ends:\n{log_tail(self.log)}"
                )
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.25)
        raise StartError(
            f"{self.name}: no {what} within {timeout:.0f} s; its log ({self.log}) ends:\n"
            f"{log_tail(self.log)}"
        )

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after `grace` seconds."""
        if self.popen is None:
            return
        pgid = self.popen.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            self.popen.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def pids_mentioning(marker: str) -> list[int]:
    """Processes whose command line or working directory names `marker` (the run folder)."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


def kill_all(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def built(variable: str, script: Path, *args: str) -> Path:
    """What a build script of e2e/components made: the path e2e/run exported as ``variable``,
    else the script's run now (nothing is rebuilt when its cache holds the result), which
    prints the path on its last line of stdout."""
    configured = os.environ.get(variable)
    if configured:
        return Path(configured)
    done = subprocess.run([str(script), *args], stdout=subprocess.PIPE, text=True, check=True)
    return Path(done.stdout.strip().splitlines()[-1])
