"""One demo run: its options, the nodes and processes it started, and how it is undone.

:class:`DemoRun` is the state the start-up (:mod:`kubegpu.demo.startup`), the replay
(:mod:`kubegpu.demo.replay`) and the command (:mod:`kubegpu.demo.command`) share; its
:meth:`~DemoRun.close` stops every emulator and child and removes the work directory. Separate so
each stage imports what a run is without importing the other stages.
"""

from __future__ import annotations

import contextlib
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click

from kubegpu.demo.processes import Child, Supervisor
from kubegpu.demo.scenario import DemoNode
from kubegpu.sharing.resources import ResourceNames
from kubegpu.testing.kubelet import KubeletEmulator

START_TIMEOUT_S = 60.0
POLL_S = 0.1


class DemoError(Exception):
    """The demo cannot go on; the message says which component and why."""


@dataclass(frozen=True)
class DemoOptions:
    nodes: int = 4
    pods: int | None = None
    trace: Path | None = None
    policy: str = "kubegpu"
    seed: int = 0
    keep_running: bool = False
    summary_json: Path | None = None
    pid_file: Path | None = None
    work_dir: Path | None = None
    slots_per_card: int = 8
    timeout_s: float = 180.0
    child_log_level: str = "info"


@dataclass
class NodeRuntime:
    spec: DemoNode
    directory: Path
    emulator: KubeletEmulator
    agent: Child | None = None


@dataclass
class DemoRun:
    """Everything one demo run started; :meth:`close` undoes all of it."""

    options: DemoOptions
    root: Path
    supervisor: Supervisor
    names: ResourceNames = field(default_factory=ResourceNames)
    kubeconfig: Path | None = None
    api_url: str = ""
    extender_url: str = ""
    nodes: list[NodeRuntime] = field(default_factory=list)

    def close(self) -> list[str]:
        """Stop emulators and children, remove the work directory; returns leftover sockets
        (there should be none) for the caller to report."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.emulator.stop()
        self.supervisor.stop_all()
        leftovers = [str(p) for p in sockets_under(self.root)]
        shutil.rmtree(self.root, ignore_errors=True)
        return leftovers


def sockets_under(root: Path) -> Iterator[Path]:
    """Every unix socket below ``root`` (what a clean shutdown must leave none of)."""
    if not root.exists():
        return
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                yield path


def echo(message: str) -> None:
    """One line of the demo's narration on stdout."""
    click.echo(message)
