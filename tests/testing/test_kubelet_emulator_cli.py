"""``kubegpu emulate-node`` end to end: the emulator plus a real ``kubegpu device-plugin``
process on the fake backend, run as the README runs it."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu.inventory.fake import send_fake_gpu_command

COMMAND = [sys.executable, "-m", "kubegpu", "emulate-node"]
UUID = r"GPU-[0-9a-f-]+"


def run_once(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, "--once", *args], capture_output=True, text=True, timeout=100, check=False
    )


def session_dir(stdout: str) -> Path:
    match = re.search(r"^kubelet emulator: (\S+)/kubelet\.sock$", stdout, re.MULTILINE)
    assert match, stdout
    return Path(match.group(1))


def plugin_pid(stdout: str) -> int:
    match = re.search(r"^device plugin: pid (\d+):", stdout, re.MULTILINE)
    assert match, stdout
    return int(match.group(1))


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_once_registers_lists_devices_allocates_and_cleans_up() -> None:
    result = run_once("--fake-gpus", "8xA100-80GB-NVLink")

    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "registered nvidia.com/gpu on " in out
    rows = re.findall(rf"^nvidia\.com/gpu\s+({UUID})\s+(\w+)\s+(\S+)$", out, re.MULTILINE)
    assert len(rows) == 8
    assert {health for _, health, _ in rows} == {"Healthy"}
    assert {numa for _, _, numa in rows} == {"0", "1"}
    allocated = re.search(rf"^allocated 2 x nvidia\.com/gpu .*: ({UUID}) ({UUID})$", out, re.M)
    assert allocated, out
    chosen = set(allocated.groups())
    assert chosen <= {uuid for uuid, _, _ in rows}
    assert "GetPreferredAllocation chose:" in out
    env = re.search(r"^    env NVIDIA_VISIBLE_DEVICES=(\S+)$", out, re.MULTILINE)
    assert env, out
    assert set(env.group(1).split(",")) == chosen
    # Nothing left behind: the plugin process is gone, the temporary dir with all sockets too.
    assert not is_running(plugin_pid(out))
    assert not session_dir(out).exists()


def test_a_given_kubelet_dir_is_left_without_sockets() -> None:
    directory = Path(tempfile.mkdtemp(prefix="kg-node-"))
    try:
        result = run_once(
            "--fake-gpus",
            "4xT4",
            "--allocate",
            "1",
            "--kubelet-dir",
            str(directory / "device-plugins"),
            "--pod-resources-socket",
            str(directory / "pod-resources.sock"),
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"pod resources API: {directory / 'pod-resources.sock'}" in result.stdout
        assert re.search(r"^allocated 1 x nvidia\.com/gpu", result.stdout, re.MULTILINE)
        assert [p.name for p in directory.rglob("*") if p.is_socket()] == []
        assert "sockets left" not in result.stderr
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_plugin_that_cannot_start_is_reported_with_its_output() -> None:
    result = run_once(
        "--fake-gpus", "4xT4", "--plugin-arg=--config=/no-such-config.yaml", "--timeout", "30"
    )

    assert result.returncode == 1
    assert "device plugin exited with code" in result.stderr
    assert "--- device plugin output ---" in result.stderr
    assert "no-such-config.yaml" in result.stderr.split("--- device plugin output ---")[1]
    assert not session_dir(result.stdout).exists()


def test_a_fake_spec_that_does_not_load_is_refused_before_the_plugin_starts() -> None:
    result = run_once("--fake-gpus", "no-such-preset")

    assert result.returncode == 2
    assert "Invalid value for '--fake-gpus': no-such-preset" in result.stderr
    assert "device plugin: pid" not in result.stdout


@pytest.fixture
def watching() -> Iterator[tuple[subprocess.Popen[str], queue.Queue[str]]]:
    process = subprocess.Popen(
        [*COMMAND, "--fake-gpus", "4xT4", "--allocate", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.rstrip("\n"))

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    try:
        yield process, lines
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        pumper.join(timeout=10)
        assert process.stdout is not None
        process.stdout.close()


def read_until(lines: queue.Queue[str], pattern: str, seen: list[str]) -> re.Match[str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match
    raise AssertionError(f"no line matching {pattern!r} in {seen}")


def test_watch_mode_prints_health_changes_and_stops_cleanly_on_sigterm(
    watching: tuple[subprocess.Popen[str], queue.Queue[str]],
) -> None:
    process, lines = watching
    seen: list[str] = []
    control = Path(read_until(lines, r"^fake GPU control socket: (\S+)$", seen).group(1))
    read_until(lines, r"^watching device health", seen)

    reply = send_fake_gpu_command(control, "xid", gpu=0, xid=79)
    assert reply["ok"], reply
    broken = reply["gpu"]["uuid"]
    read_until(lines, rf"nvidia\.com/gpu {re.escape(broken)} Healthy -> Unhealthy$", seen)

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    read_until(lines, r"^device plugin pid \d+ exited", seen)
    assert not is_running(plugin_pid("\n".join(seen)))
    assert not session_dir("\n".join(seen)).exists()
