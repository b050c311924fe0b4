"""A stand-in for ``nvidia-cuda-mps-control`` that behaves like it where the agent can tell.

Daemon mode (``-f`` foreground, as the agent runs it): creates ``$CUDA_MPS_PIPE_DIRECTORY``
with a ``control`` FIFO and a pid file, appends ``started <pid>`` to
``$CUDA_MPS_LOG_DIRECTORY/control.log``, and serves commands from the FIFO until ``quit``
(then logs ``quit <pid>``, removes the FIFO and exits 0). Client mode (no arguments): sends
each stdin line to the running daemon through the FIFO, as the real client does; exits 1
when no daemon listens. Tests copy it next to a ``#!`` line naming their Python.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path


def _dirs() -> tuple[Path, Path]:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    log = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    return pipe, log


def _log(log_dir: Path, line: str) -> None:
    with (log_dir / "control.log").open("a") as handle:
        handle.write(line + "\n")


def daemon() -> int:
    pipe_dir, log_dir = _dirs()
    pipe_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    control = pipe_dir / "control"
    control.unlink(missing_ok=True)
    # Logged before the pipe appears: a test that waits for the pipe then finds the line.
    _log(log_dir, f"started {os.getpid()} gpus={os.environ.get('CUDA_VISIBLE_DEVICES', '')}")
    os.mkfifo(control)
    (pipe_dir / "nvidia-cuda-mps-control.pid").write_text(str(os.getpid()))
    while True:
        with control.open() as fifo:  # blocks until a client opens it for writing
            for line in fifo:
                command = line.strip()
                if command == "quit":
                    _log(log_dir, f"quit {os.getpid()}")
                    control.unlink(missing_ok=True)
                    return 0
                _log(log_dir, f"command {command}")


def client() -> int:
    pipe_dir, _ = _dirs()
    try:
        fd = os.open(pipe_dir / "control", os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ENOENT):
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        raise
    with os.fdopen(fd, "w") as pipe:
        for line in sys.stdin:
            pipe.write(line)
    return 0


if __name__ == "__main__":
    sys.exit(daemon() if {"-f", "-d"} & set(sys.argv[1:]) else client())
