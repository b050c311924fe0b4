"""``kubegpu fake-apiserver`` as a real process, and the server over HTTPS."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import lightkube
import pytest
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Node

from kubegpu.testing.apiserver import FakeApiServer, make_node


def test_cli_serves_seeded_nodes_through_the_kubeconfig_it_writes(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    command = [
        sys.executable,
        "-m",
        "kubegpu",
        "fake-apiserver",
        "--port",
        "0",
        "--seed-nodes",
        "3",
        "--gpus-per-node",
        "8",
        "--kubeconfig",
        str(kubeconfig),
    ]
    with (
        (tmp_path / "stderr").open("w") as stderr,
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        ) as process,
    ):
        try:
            assert process.stdout is not None
            announced = [process.stdout.readline().strip() for _ in range(3)]
            assert announced[1] == f"kubeconfig written to {kubeconfig}", announced
            with lightkube.Client(KubeConfig.from_file(kubeconfig), trust_env=False) as client:
                nodes = list(client.list(Node))
            assert [n.metadata.name for n in nodes] == ["node-0", "node-1", "node-2"]
            assert {n.status.capacity["nvidia.com/gpu"] for n in nodes} == {"8"}
            process.send_signal(signal.SIGINT)
            output, _ = process.communicate(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0
    assert "fake API server stopped" in output


def test_cli_refuses_plain_http_on_a_non_loopback_address() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kubegpu", "fake-apiserver", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "refusing plain HTTP" in result.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_https_with_a_given_certificate_is_verified_by_lightkube(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    async with FakeApiServer(tls_cert_file=cert, tls_key_file=key) as server:
        assert server.url.startswith("https://127.0.0.1:")
        server.store.put("nodes", make_node("secure"))
        client = server.async_client()
        try:
            assert [n.metadata.name async for n in client.list(Node)] == ["secure"]
        finally:
            await client.close()


def test_the_kubeconfig_it_writes_by_default_is_removed_at_exit(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    with subprocess.Popen(
        [sys.executable, "-m", "kubegpu", "fake-apiserver", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(temp)},
    ) as process:
        try:
            assert process.stdout is not None
            announced = [process.stdout.readline().strip() for _ in range(2)]
            written = Path(announced[1].removeprefix("kubeconfig written to "))
            assert written.is_file() and written.is_relative_to(temp), announced
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0
    assert list(temp.iterdir()) == []
