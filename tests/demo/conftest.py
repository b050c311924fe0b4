"""Running ``kubegpu demo`` as a real subprocess and checking what it leaves behind."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu.testing.waiting import wait_until


@pytest.fixture
def work_dir() -> Iterator[Path]:
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="kgdt-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class DemoProcess:
    """``python -m kubegpu demo ...`` with its output collected on a thread."""

    def __init__(
        self,
        work_dir: Path,
        *args: str,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.work_dir = work_dir
        self.pid_file = work_dir.parent / f"{work_dir.name}.pids"
        self.summary_json = work_dir.parent / f"{work_dir.name}.summary.json"
        command = [
            sys.executable,
            "-m",
            "kubegpu",
            "demo",
            "--work-dir",
            str(work_dir),
            "--pid-file",
            str(self.pid_file),
            "--summary-json",
            str(self.summary_json),
            *args,
        ]
        env = {
            **os.environ,
            "NO_PROXY": "127.0.0.1,localhost",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=cwd,
        )
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def wait_for_output(self, text: str, timeout_s: float = 45.0) -> None:
        def printed() -> bool:
            if text in self.output:
                return True
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                if text in self.output:
                    return True
                raise AssertionError(
                    f"demo exited {self.proc.returncode} before {text!r}:\n{self.output}"
                )
            return False

        wait_until(printed, timeout_s=timeout_s, what=lambda: f"{text!r} printed:\n{self.output}")

    def wait(self, timeout_s: float = 100.0) -> int:
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"demo did not finish in {timeout_s} s:\n{self.output}") from None
        self._reader.join(timeout=5)
        return code

    def interrupt(self, signum: int = signal.SIGINT) -> None:
        self.proc.send_signal(signum)

    def child_pids(self) -> dict[int, str]:
        pids: dict[int, str] = {}
        for line in self.pid_file.read_text().splitlines():
            pid, name = line.split(maxsplit=1)
            pids[int(pid)] = name
        return pids

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.pid_file.unlink(missing_ok=True)
        self.summary_json.unlink(missing_ok=True)


def alive_kubegpu_processes(pids: dict[int, str]) -> list[str]:
    """Those of ``pids`` still running a kubegpu command (a reused pid would not be one)."""
    alive = []
    for pid, name in pids.items():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"kubegpu" in cmdline:
            alive.append(f"{name} (pid {pid})")
    return alive


def sockets_under(root: Path) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        try:
            if stat.S_ISSOCK(path.lstat().st_mode):
                found.append(path)
        except OSError:
            continue
    return found


@pytest.fixture
def demo_process(work_dir: Path) -> Iterator[type[DemoProcess]]:
    started: list[DemoProcess] = []

    class Tracked(DemoProcess):
        def __init__(
            self,
            work_dir: Path,
            *args: str,
            cwd: Path | None = None,
            env: dict[str, str] | None = None,
        ) -> None:
            super().__init__(work_dir, *args, cwd=cwd, env=env)
            started.append(self)

    try:
        yield Tracked
    finally:
        for demo in started:
            demo.close()
