"""Supervising the CUDA MPS control daemon for the node's shared GPUs.

The agent runs one ``nvidia-cuda-mps-control`` for all shared cards, in the foreground (``-f``)
so that its death is seen at once, with ``CUDA_MPS_PIPE_DIRECTORY`` and
``CUDA_MPS_LOG_DIRECTORY`` under a host directory that every sharing container mounts. Clients
(the containers) connect through the pipe directory and are held to the limits their
environment names (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``,
set by the node agent's ``Allocate``). A daemon that exits is restarted after a bounded,
doubling delay (reset once it has stayed up for the longest delay). Stopping asks it to
``quit`` the way an operator would (the same command in client mode, ``quit`` on stdin), then
terminates and finally kills it if it does not go, all within a few seconds. The command is
injectable: tests run a fake daemon script.

What the node must provide (not done here): the agent's container sees the GPUs and the MPS
binaries and has ``host_dir`` mounted at the same path; MPS clients talk to the server through
POSIX shared memory too, so sharing pods need the host IPC namespace (``hostIPC: true``) or the
same ``/dev/shm``. Limits are per client process and cooperative at the CUDA level: a pod that
unsets the variables escapes them, which is why ``mps`` is enforcement against mistakes, not a
security boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kubegpu.config.model import MpsSettings
from kubegpu.core.container import MpsDirs

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]

# How long stop() gives the daemon to go (quit, then SIGTERM), and then a SIGKILL to take.
STOP_GRACE_S = 5.0
KILL_WAIT_S = 2.0


@dataclass(frozen=True)
class MpsSpec:
    """Everything needed to run the daemon; ``gpus`` are the UUIDs it may use."""

    command: str
    args: tuple[str, ...]
    host_dir: Path
    gpus: tuple[str, ...]
    restart_initial_s: float = 0.5
    restart_max_s: float = 30.0
    extra_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def pipe_dir(self) -> Path:
        return Path(MpsDirs.under(self.host_dir).pipe_dir)

    @property
    def log_dir(self) -> Path:
        return Path(MpsDirs.under(self.host_dir).log_dir)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_dir)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_dir)
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        return env


class MpsDaemon:
    """One supervised MPS control daemon; ``start()`` then ``stop()`` (idempotent)."""

    def __init__(self, spec: MpsSpec, *, node: str = "-", sleep: Sleep = asyncio.sleep) -> None:
        self.spec = spec
        self.node = node
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._stopping = False
        self.starts = 0
        self.restart_delays: list[float] = []
        self._started = asyncio.Event()

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    async def start(self) -> None:
        for directory in (self.spec.pipe_dir, self.spec.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self._stopping = False
        self._task = asyncio.create_task(self._supervise(), name="mps-control-daemon")
        await self._started.wait()

    async def _supervise(self) -> None:
        failures = 0
        while not self._stopping:
            began = time.monotonic()
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    self.spec.command,
                    *self.spec.args,
                    env=self.spec.env(),
                    stdin=asyncio.subprocess.DEVNULL,
                )
            except OSError as err:
                log.error(
                    "node %s: cannot start MPS control daemon %s: %s",
                    self.node,
                    self.spec.command,
                    err,
                )
                self._proc = None
            else:
                self.starts += 1
                log.info(
                    "node %s: MPS control daemon started (pid %d, pipes in %s, GPUs %s)",
                    self.node,
                    self._proc.pid,
                    self.spec.pipe_dir,
                    ",".join(self.spec.gpus) or "all",
                )
            self._started.set()
            if self._proc is not None:
                code = await self._proc.wait()
                if self._stopping:
                    return
                log.warning("node %s: MPS control daemon exited with %s", self.node, code)
            if time.monotonic() - began >= self.spec.restart_max_s:
                failures = 0  # it ran fine for a good while: start the backoff afresh
            delay = min(self.spec.restart_max_s, self.spec.restart_initial_s * 2**failures)
            failures = min(failures + 1, 32)
            self.restart_delays.append(delay)
            log.warning("node %s: restarting MPS control daemon in %.1f s", self.node, delay)
            await self._sleep(delay)

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the daemon within about ``grace_s`` (plus ``KILL_WAIT_S`` for a SIGKILL):
        ``quit`` first (half the grace, the client killed if it hangs on a daemon that no
        longer answers), then SIGTERM for the rest, then SIGKILL. Bounded so the agent's
        whole shutdown fits well inside the pod's terminationGracePeriodSeconds (30 s)."""
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            loop = asyncio.get_running_loop()
            quit_by = loop.time() + grace_s / 2
            term_by = loop.time() + grace_s
            await self._ask_to_quit(grace_s / 2)
            if not await _exited(proc, quit_by - loop.time()):
                log.warning("node %s: MPS control daemon ignored quit; terminating", self.node)
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                if not await _exited(proc, term_by - loop.time()):
                    log.warning(
                        "node %s: MPS control daemon ignored SIGTERM; killing it", self.node
                    )
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    if not await _exited(proc, KILL_WAIT_S):
                        log.error(
                            "node %s: MPS control daemon (pid %d) survived SIGKILL; leaving it",
                            self.node,
                            proc.pid,
                        )
            log.info("node %s: MPS control daemon stopped", self.node)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _ask_to_quit(self, timeout_s: float) -> None:
        """Send ``quit`` through the control client; a client still running after
        ``timeout_s`` (stuck on a daemon that does not answer) is killed, never left behind."""
        try:
            client = await asyncio.create_subprocess_exec(
                self.spec.command,
                env=self.spec.env(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
        except OSError as err:
            log.warning("node %s: could not send quit to the MPS daemon: %s", self.node, err)
            return
        try:
            async with asyncio.timeout(timeout_s):
                await client.communicate(b"quit\n")
        except TimeoutError:
            log.warning(
                "node %s: the MPS quit client did not finish in %.1f s; killing it",
                self.node,
                timeout_s,
            )
            with contextlib.suppress(ProcessLookupError):
                client.kill()
            await _exited(client, KILL_WAIT_S)


async def _exited(proc: asyncio.subprocess.Process, within_s: float) -> bool:
    """Wait up to ``within_s`` for ``proc`` to exit; True when it has."""
    try:
        async with asyncio.timeout(max(0.0, within_s)):
            await proc.wait()
    except TimeoutError:
        return proc.returncode is not None
    return True


def mps_spec_for(settings: MpsSettings, gpus: Sequence[str]) -> MpsSpec:
    """The daemon ``settings`` (``sharing.gpuShare.mps`` or ``dra.mps``) ask for, on ``gpus``."""
    return MpsSpec(
        settings.control_command,
        tuple(settings.control_args),
        Path(settings.host_dir),
        tuple(gpus),
        settings.restart_initial_s,
        settings.restart_max_s,
    )
