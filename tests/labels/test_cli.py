"""``kubegpu labels`` as a real subprocess against the fake API server."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube.resources.core_v1 import Node

from kubegpu.testing.apiserver import FakeApiServer, ServerThread, make_node


@pytest.fixture
def server() -> Iterator[ServerThread]:
    with FakeApiServer().run_in_thread() as handle:
        yield handle


def run_labels(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", "labels", "--backend", "fake", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_labels_once_patches_the_node_through_kubeconfig(
    server: ServerThread, tmp_path: Path
) -> None:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    with server.client() as client:
        client.create(Node.from_dict(make_node("gpu-a", labels={"team": "ml"})))
        result = run_labels(
            "--fake-gpus",
            "2xV100-2xT4",
            "--sink",
            "node",
            "--node-name",
            "gpu-a",
            "--once",
            "--sharing-strategy",
            "time-slicing",
            "--replicas",
            "4",
            env={"KUBECONFIG": str(kubeconfig)},
        )
        assert result.returncode == 0, result.stderr
        labels = client.get(Node, "gpu-a").metadata.labels
    assert labels["team"] == "ml"
    assert labels["kubegpu.io/gpu.product.Tesla-T4"] == "2"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.replicas"] == "4"


def test_labels_once_to_stdout_and_a_bad_preset_exits_2() -> None:
    result = run_labels("--fake-gpus", "4xT4", "--once", "--no-timestamp")
    assert result.returncode == 0, result.stderr
    lines = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert lines["nvidia.com/gpu.product"] == "Tesla-T4"
    assert "nvidia.com/gfd.timestamp" not in lines
    stamped = run_labels("--fake-gpus", "4xT4", "--once")
    assert (
        int(
            dict(line.split("=", 1) for line in stamped.stdout.splitlines())[
                "nvidia.com/gfd.timestamp"
            ]
        )
        > 1_700_000_000
    )
    # A fake spec that does not load is a usage error, as for device-plugin and discover.
    assert run_labels("--fake-gpus", "no-such-preset", "--once").returncode == 2


def test_sharing_labels_come_from_the_agent_config_and_flags_override_it(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\n"
        "sharing:\n"
        "  timeSlicing:\n"
        "    resources:\n"
        "      - name: nvidia.com/gpu\n"
        "        replicas: 4\n"
    )
    result = run_labels("--fake-gpus", "4xT4", "--once", "--config", str(config))
    assert result.returncode == 0, result.stderr
    lines = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert lines["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert lines["nvidia.com/gpu.replicas"] == "4"
    result = run_labels("--fake-gpus", "4xT4", "--once", "--config", str(config), "--replicas", "2")
    lines = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert lines["nvidia.com/gpu.replicas"] == "2"


def test_an_invalid_config_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v9\n")
    assert run_labels("--fake-gpus", "4xT4", "--once", "--config", str(config)).returncode == 2
