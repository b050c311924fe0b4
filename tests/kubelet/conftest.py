"""Shared harness: a real ``kubegpu device-plugin`` subprocess against the kubelet emulator."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from kubegpu.testing.kubelet import KubeletEmulator
from kubegpu.testing.waiting import wait_until as poll_until
from kubegpu.testing.waiting import wait_until_async

RESOURCE = "nvidia.com/gpu"


def short_tempdir() -> Path:
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
    return Path(tempfile.mkdtemp(prefix="kg-", dir="/tmp"))


class PluginProcess:
    """``kubegpu device-plugin --backend fake …`` started as a separate process.

    ``backend="nvml"`` runs it on the machine's real GPUs instead (``-m gpu`` tests only);
    ``preset`` and the fake control socket are then unused.
    """

    def __init__(
        self,
        kubelet_dir: Path,
        *,
        preset: str = "8xA100-80GB-NVLink",
        config: Path | None = None,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        backend: str = "fake",
        tag: str = "plugin",
    ) -> None:
        """``tag`` names this process's log and fake-control socket beside ``kubelet_dir``:
        give two processes on one kubelet directory different tags."""
        self.kubelet_dir = kubelet_dir
        suffix = "" if tag == "plugin" else f"-{tag}"
        self.control = kubelet_dir.parent / f"{kubelet_dir.name}{suffix}-fake.sock"
        self.log_path = kubelet_dir.parent / f"{kubelet_dir.name}-{tag}.log"
        args = [
            sys.executable,
            "-m",
            "kubegpu",
            "--log-level",
            "debug",
            "device-plugin",
            "--backend",
            backend,
            *(
                ("--fake-gpus", preset, "--fake-control", str(self.control))
                if backend == "fake"
                else ()
            ),
            "--kubelet-dir",
            str(kubelet_dir),
            "--node-name",
            "test-node",
            *(("--config", str(config)) if config is not None else ()),
            *extra,
        ]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEGPU_")}
        full_env.update(env or {})
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=full_env)

    def send(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._log.close()
        return rc

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout_s: float = 10.0) -> None:
        poll_until(
            lambda: text in self.log(),
            timeout_s=timeout_s,
            what=lambda: f"{text!r} logged; log:\n{self.log()[-3000:]}",
        )


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll ``predicate`` on the running loop until it holds; TimeoutError after ``timeout_s``.

    For state of the agent that nothing announces (its counters, what a real kubelet
    emulator thread or plugin process has done)."""
    await wait_until_async(predicate, timeout_s=timeout_s, what="condition")


@pytest.fixture
def tempdir() -> Iterator[Path]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Node:
    """An emulated kubelet plus the plugin process registered with it."""

    def __init__(self, root: Path, **plugin_args: object) -> None:
        self.root = root
        self.kubelet_dir = root / "dp"
        self.kubelet = KubeletEmulator(self.kubelet_dir)
        self.kubelet.start()
        self.plugin = PluginProcess(self.kubelet_dir, **plugin_args)  # type: ignore[arg-type]

    def close(self) -> int:
        rc = self.plugin.stop()
        self.kubelet.stop()
        return rc


@pytest.fixture(scope="module")
def a100_node() -> Iterator[Node]:
    """One plugin process on the 8×A100 NVLink preset, shared by the tests that only read or
    that release what they allocate (starting a process costs about a second)."""
    root = short_tempdir()
    node = Node(root)
    try:
        node.kubelet.wait_for_registration(RESOURCE, timeout_s=30)
        node.kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 8, timeout_s=30)
        yield node
    finally:
        node.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def no_leftover_tasks() -> AsyncIterator[None]:
    """Fail an async test that leaves tasks running (an orphaned stream or retry loop)."""
    yield
    current = asyncio.current_task()
    leftover = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    if leftover:  # let cancelled tasks finish unwinding
        await asyncio.wait(leftover, timeout=0.5)
        leftover = [t for t in leftover if not t.done()]
    if leftover:
        pytest.fail(f"tasks left running: {[t.get_name() for t in leftover]}")
