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
        "settings:\n  policy: binpack\n  bind-attempts: 7\n  port: 1\n"
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
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError):
                    pass
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                assert time.monotonic() < deadline, "extender never became ready"
                time.sleep(0.1)
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
