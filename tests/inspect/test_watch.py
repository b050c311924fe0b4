"""``kubegpu inspect --watch`` as a real process: re-renders on API events, stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubegpu.kube.list_watch import RawPod
from kubegpu.testing.apiserver import ServerThread
from tests.inspect import mixed_cluster as mc

DEADLINE_S = 30.0


@contextmanager
def watching(
    kubeconfig: Path, *args: str
) -> Iterator[tuple[subprocess.Popen[str], queue.Queue[str]]]:
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kubegpu",
            "inspect",
            "--watch",
            "--kubeconfig",
            str(kubeconfig),
            "--no-usage",
            "--refresh-interval",
            "0.1",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        yield process, lines
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        reader.join(timeout=5)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def next_doc(lines: queue.Queue[str], until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first rendered document for which ``until`` holds (fails after DEADLINE_S)."""
    while True:
        line = lines.get(timeout=DEADLINE_S)
        doc: dict[str, Any] = json.loads(line)
        if until(doc):
            return doc


def pods_on(doc: dict[str, Any], node: str, index: int) -> list[str]:
    for view in doc["nodes"]:
        if view["name"] == node:
            return [p["name"] for p in view["cards"][index]["pods"]]
    return []


def test_watch_renders_new_and_deleted_pods_and_stops_cleanly_on_ctrl_c(
    apiserver: ServerThread, kubeconfig: Path
) -> None:
    with watching(kubeconfig, "-o", "json", "--node", "sick") as (process, lines):
        first = next_doc(lines, lambda d: True)
        assert pods_on(first, "sick", 0) == []
        assert pods_on(first, "sick", 1) == ["stuck"]
        with apiserver.client() as client:
            client.create(RawPod(mc.shared_pod("late", "ml", "sick", 0, 4096, 250)))
            seen = next_doc(lines, lambda d: pods_on(d, "sick", 0) == ["late"])
            assert seen["nodes"][0]["cards"][0]["allocatedMemoryMiB"] == 4096
            # A dropped watch is resumed: later changes still arrive.
            apiserver.drop_watches()
            client.delete(RawPod, "stuck", namespace="ml")
            gone = next_doc(lines, lambda d: pods_on(d, "sick", 1) == [])
            assert gone["nodes"][0]["cards"][1]["allocatedMemoryMiB"] == 0
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=DEADLINE_S) == 0
        assert process.stderr is not None
        assert "Traceback" not in process.stderr.read()


def test_watch_in_table_mode_separates_renders(apiserver: ServerThread, kubeconfig: Path) -> None:
    with watching(kubeconfig, "--node", "mixed") as (process, lines):
        first = lines.get(timeout=DEADLINE_S)
        assert first.startswith("--- ")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=DEADLINE_S) == 0


def test_watch_exits_1_when_the_cluster_cannot_be_read(tmp_path: Path) -> None:
    from kubegpu.testing.kubeconfig import write_kubeconfig
    from tests.inspect.test_cli import free_port

    path = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{free_port()}")
    with watching(path) as (process, _):
        assert process.wait(timeout=DEADLINE_S) == 1
        assert process.stderr is not None
        assert "cannot reach the Kubernetes API server" in process.stderr.read()
