"""The node agent's /healthz and /readyz as the kubelet's probes see them: a real
``kubegpu device-plugin`` process, the kubelet emulator coming and going, real HTTP."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from kubegpu.testing.kubelet import KubeletEmulator
from tests.kubelet.conftest import RESOURCE, PluginProcess
from tests.kubelet.test_health_endpoints import get, wait_for

HEALTH = ("--health-listen", "127.0.0.1:0")


def probe_url(plugin: PluginProcess) -> str:
    plugin.wait_for_log("health endpoints on", timeout_s=30)
    found = re.search(r"health endpoints on (http://\S+)/healthz", plugin.log())
    assert found is not None
    return found.group(1)


def test_readyz_follows_registration_with_the_kubelet_and_healthz_the_grpc_server(
    tempdir: Path,
) -> None:
    kubelet_dir = tempdir / "dp"
    kubelet = KubeletEmulator(kubelet_dir)
    plugin = PluginProcess(kubelet_dir, preset="4xT4", extra=HEALTH)
    try:
        url = probe_url(plugin)
        # Serving, but no kubelet yet: alive, not ready.
        assert wait_for(url + "/healthz", 200) == (200, f"ok: serving {RESOURCE}\n")
        status, body = get(url + "/readyz")
        assert (status, body) == (
            503,
            f"not registered: no kubelet socket at {kubelet_dir}/kubelet.sock\n",
        )

        kubelet.start()
        kubelet.wait_for_registration(RESOURCE, timeout_s=20)
        assert wait_for(url + "/readyz", 200) == (200, f"ok: registered {RESOURCE}\n")

        # The kubelet goes away (its socket with it): not ready, still alive.
        kubelet.stop()
        assert wait_for(url + "/readyz", 503)[0] == 503
        assert get(url + "/healthz")[0] == 200

        # A kubelet restart (every socket deleted, a new kubelet.sock): ready again only
        # after registering with the new one.
        kubelet.start()
        kubelet.wait_for_registration(RESOURCE, timeout_s=20, count=2)
        assert wait_for(url + "/readyz", 200)[0] == 200
        kubelet.restart()
        kubelet.wait_for_registration(RESOURCE, timeout_s=20, count=3)
        assert wait_for(url + "/readyz", 200)[0] == 200
        assert wait_for(url + "/healthz", 200)[0] == 200
        assert plugin.stop() == 0
        assert get(url + "/healthz")[0] == 0  # gone with the process
    finally:
        plugin.stop()
        kubelet.stop()


def test_an_idle_agent_without_a_gpu_backend_is_alive_and_ready(tempdir: Path) -> None:
    # failOnInitError=false on a node whose GPUs cannot be opened (here: the fake backend's
    # control socket cannot be bound; click keeps the last --fake-control): nothing to serve,
    # and a never-ready pod would stall every DaemonSet rollout.
    plugin = PluginProcess(
        tempdir / "dp",
        extra=(
            *HEALTH,
            "--fake-control",
            str(tempdir / "missing-dir" / "ctl.sock"),
            "--no-fail-on-init-error",
        ),
    )
    try:
        url = probe_url(plugin)
        status, body = get(url + "/healthz")
        assert status == 200 and body.startswith("ok: idle (GPU backend unavailable: ")
        status, body = get(url + "/readyz")
        assert status == 200 and body.startswith("ok: idle, nothing to register")
        assert plugin.stop() == 0
    finally:
        plugin.stop()


def test_a_taken_health_address_exits_1_naming_it(tempdir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "kubegpu",
                "device-plugin",
                "--backend=fake",
                "--fake-gpus=4xT4",
                f"--kubelet-dir={tempdir / 'dp'}",
                f"--health-listen=127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert f"cannot serve /healthz and /readyz on 127.0.0.1:{port}" in done.stderr


def test_a_malformed_health_address_is_an_invalid_config(tempdir: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubegpu",
            "device-plugin",
            "--backend=fake",
            "--fake-gpus=4xT4",
            f"--kubelet-dir={tempdir / 'dp'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("KUBEGPU_")},
            "KUBEGPU_HEALTH_LISTEN": "9401",
        },
    )
    assert done.returncode == 2
    assert "flags.healthListen" in done.stderr and "expected HOST:PORT" in done.stderr
