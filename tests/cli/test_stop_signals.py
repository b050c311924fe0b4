"""SIGTERM stops every long-running ``kubegpu`` command at any moment of its start-up.

Real processes, signalled at several moments: as each announces that it runs (the moment the
peer webhook lost its SIGTERM: the handler was installed only after that line, and the wait
took a lock the handler needed) and at moments during start-up. A signal that came after the
command installed its handler must end it cleanly (exit 0); one that came before, during the
interpreter's own start, may end it by the signal's default action. Never may it keep running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STOP_WITHIN_S = 15.0
FAKE = ["--backend", "fake", "--fake-gpus", "4xT4"]


@dataclass(frozen=True)
class Command:
    args: list[str]
    announces: str  # a line it writes once it runs: handler installed, port open


COMMANDS = {
    "peer-webhook": Command(
        ["peer-webhook", "--peer-compat", "volcano", "--host", "127.0.0.1", "--port", "0"],
        "peer webhook serving",
    ),
    "exporter": Command(
        ["exporter", *FAKE, "--listen", "127.0.0.1:0", "--no-pod-resources"], "serving http"
    ),
    "labels": Command(["labels", *FAKE, "--poll", "0.2"], "labels settings"),
}


@dataclass(frozen=True)
class Result:
    what: str
    returncode: int | None  # None: still running after STOP_WITHIN_S (then killed)
    announced: bool
    output: str


def _start(args: list[str], home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kubegpu", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("KUBEGPU_")},
            "HOME": str(home),
        },
    )


def _stop(process: subprocess.Popen[str], what: str, lines: list[str], announced: bool) -> Result:
    process.send_signal(signal.SIGTERM)
    try:
        returncode: int | None = process.wait(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        returncode = None
    return Result(what, returncode, announced, "".join(lines[-5:]))


def _drain(
    process: subprocess.Popen[str], lines: list[str], seen: threading.Event, mark: str
) -> None:
    assert process.stderr is not None
    for line in process.stderr:
        lines.append(line)
        if mark in line:
            seen.set()


def signalled(name: str, home: Path, *, announce_delay_s: float = -1, after_s: float = 0) -> Result:
    """Start the command; SIGTERM ``announce_delay_s`` after its announcement (when not
    negative) or ``after_s`` after its start."""
    command = COMMANDS[name]
    process = _start(command.args, home)
    lines: list[str] = []
    seen = threading.Event()
    reader = threading.Thread(target=_drain, args=(process, lines, seen, command.announces))
    reader.start()
    try:
        if announce_delay_s >= 0:
            seen.wait(timeout=60)
            time.sleep(announce_delay_s)
            what = f"{name}: SIGTERM {announce_delay_s} s after {command.announces!r}"
        else:
            time.sleep(after_s)
            what = f"{name}: SIGTERM {after_s} s after start"
        return _stop(process, what, lines, seen.is_set())
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(timeout=10)
        assert process.stderr is not None
        process.stderr.close()


def test_sigterm_as_the_command_announces_it_runs_stops_it_cleanly(tmp_path: Path) -> None:
    jobs = [(name, delay) for name in COMMANDS for delay in (0.0, 0.0, 0.002, 0.02)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda j: signalled(j[0], tmp_path, announce_delay_s=j[1]), jobs))
    wrong = [
        f"{r.what}: {'still running' if r.returncode is None else f'exit {r.returncode}'}"
        f"\n    {r.output}"
        for r in results
        if not r.announced or r.returncode != 0
    ]
    assert not wrong, "\n".join(wrong)


def test_sigterm_at_any_moment_of_start_up_ends_the_command(tmp_path: Path) -> None:
    jobs = [(name, after) for name in COMMANDS for after in (0.2, 0.6, 1.2)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda j: signalled(j[0], tmp_path, after_s=j[1]), jobs))
    # Before its handler is in (the interpreter still starting), the default action ends it.
    wrong = [
        f"{r.what}: {'still running' if r.returncode is None else f'exit {r.returncode}'}"
        f"\n    {r.output}"
        for r in results
        if r.returncode not in (0, -signal.SIGTERM)
    ]
    assert not wrong, "\n".join(wrong)
