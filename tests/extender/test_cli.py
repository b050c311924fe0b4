"""``kubegpu extender`` as a real process against the fake API server: it becomes ready, takes
settings from file < environment < flag, and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kubegpu.testing.apiserver import FakeApiServer
from kubegpu.testing.waiting import wait_until
from tests.extender.cluster import gpu_node

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_serves_until_sigterm_with_flag_over_env_over_file(tmp_path: Path) -> None:
    settings = tmp_path / "extender.yaml"
    settings.write_text(
        "apiVersion: kubegpu.io/v1alpha1\nkind: ExtenderConfig\n"
        "settings:\n  policy: binpack\n  bind-attempts: 7\n  port: 1\n  leader-lease: none\n"
    )
    port = free_port()
    with FakeApiServer().run_in_thread() as api:
        api.store.put("nodes", gpu_node("node-a"))
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        env = {**os.environ, "KUBEGPU_EXTENDER_POLICY": "spread", "NO_PROXY": "*"}
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubegpu",
                "extender",
                "--config",
                str(settings),
                "--kubeconfig",
                str(kubeconfig),
                "--port",
                str(port),
            ],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError):
                pass
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            return False

        try:
            wait_until(ready, timeout_s=60, what="the extender ready", poll_s=0.1)
        finally:
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    # Flag (port) beats the file; the environment (policy) beats the file; the file fills in
    # what neither sets (bind attempts).
    assert f"port={port}" in stderr
    assert "policy='spread'" in stderr
    assert "bind_attempts=7" in stderr
    assert "kubegpu extender stopped" in stderr


def run_extender(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEGPU_")}
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", "extender", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "NO_PROXY": "*"},
    )


def settings_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "extender.yaml"
    path.write_text(f"apiVersion: kubegpu.io/v1alpha1\nkind: ExtenderConfig\nsettings:\n{body}")
    return path


@pytest.mark.parametrize(
    ("line", "key", "nearest"),
    [
        ("  polcy: binpack\n", "polcy", "policy"),
        ("  leader-leese: kube-system/kube-scheduler\n", "leader-leese", "leader-lease"),
        ("  leader_leese: kube-system/kube-scheduler\n", "leader_leese", "leader-lease"),
        ("  bind-attemps: 3\n", "bind-attemps", "bind-attempts"),
    ],
)
def test_an_unknown_settings_key_is_refused_naming_the_nearest_one(
    tmp_path: Path, line: str, key: str, nearest: str
) -> None:
    result = run_extender("--config", str(settings_file(tmp_path, f"  leader-lease: none\n{line}")))
    assert result.returncode == 2, result.stderr
    assert f"unknown key {key!r} (did you mean {nearest!r}?)" in result.stderr
    assert "Traceback" not in result.stderr


def test_without_a_leader_lease_the_extender_refuses_to_start(tmp_path: Path) -> None:
    # Unguarded, two extenders both bind and hand out every card twice: that needs saying.
    with FakeApiServer().run_in_thread() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        result = run_extender("--kubeconfig", str(kubeconfig), "--port", "0")
    assert result.returncode == 2, result.stderr
    assert "leader-lease is not set" in result.stderr
    assert "'none'" in result.stderr


def test_leader_lease_none_runs_one_unguarded_extender(tmp_path: Path) -> None:
    port = free_port()
    with FakeApiServer().run_in_thread() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEGPU_")}
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubegpu",
                "extender",
                f"--kubeconfig={kubeconfig}",
                f"--port={port}",
                "--leader-lease=none",
                # One minor older than the fake API server's v1.31: allowed.
                "--scheduler-version=v1.30.9",
            ],
            env={**env, "NO_PROXY": "*"},
            stderr=subprocess.PIPE,
            text=True,
        )
        seen: list[str] = []
        try:
            deadline = time.monotonic() + 60
            while "kubegpu extender on" not in (
                line := process.stderr.readline() if process.stderr else ""
            ):
                seen.append(line)
                assert line or process.poll() is None, "extender exited"
                assert time.monotonic() < deadline
        finally:
            process.send_signal(signal.SIGTERM)
            _, rest = process.communicate(timeout=30)
    assert "binds whenever asked (no leader-lease)" in line
    assert any("kube-scheduler v1.30.9 fits the API server v1.31" in s for s in seen), seen
    assert process.returncode == 0, rest


def test_a_kube_scheduler_newer_than_the_api_server_is_refused_at_start(tmp_path: Path) -> None:
    # The fake API server answers /version as v1.31.
    with FakeApiServer().run_in_thread() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        result = run_extender(
            f"--kubeconfig={kubeconfig}",
            "--port=0",
            "--leader-lease=none",
            "--scheduler-version=v1.34.2",
        )
    assert result.returncode == 2, result.stderr
    assert "kube-scheduler v1.34 is newer than the API server v1.31" in result.stderr
    assert "images: newTag of registry.k8s.io/kube-scheduler" in result.stderr
    assert "Traceback" not in result.stderr
