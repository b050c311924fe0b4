"""``kubegpu labels --sink nfd`` as a real process: the feature file NFD's ``local`` source reads
holds exactly the current labels, loses a label whose fact is gone, and follows GPU health as
the node agent judges it (``health.recoverAfterHealthyChecks`` included)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kubegpu.inventory.fake import send_fake_gpu_command
from kubegpu.labels.sinks import parse_feature_file
from kubegpu.testing.waiting import wait_until
from tests.kubelet.conftest import short_tempdir

LABELS = (sys.executable, "-m", "kubegpu", "labels", "--backend=fake")


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir()  # the fake's control socket needs a short path
    yield path
    shutil.rmtree(path, ignore_errors=True)


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KUBEGPU_")}


def once(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*LABELS, "--once", *args], capture_output=True, text=True, timeout=60, env=env()
    )
    assert done.returncode == 0, done.stderr
    return done


def stdout_labels(preset: str) -> dict[str, str]:
    lines = once(f"--fake-gpus={preset}", "--no-timestamp", "--sink=stdout").stdout
    return dict(line.split("=", 1) for line in lines.splitlines())


def test_the_feature_file_holds_exactly_the_current_labels_and_drops_stale_ones(
    tmp_path: Path,
) -> None:
    features = tmp_path / "features.d"
    path = features / "kubegpu"
    once("--fake-gpus=8xA100-80GB-NVLink", "--no-timestamp", "--sink=nfd", f"--nfd-file={path}")
    first = parse_feature_file(path.read_text())
    assert first == stdout_labels("8xA100-80GB-NVLink")
    assert first["kubegpu.io/gpu.nvlink"] == "true"
    # The same node's cards swapped for PCIe T4s: NVLink is gone, and so is its label.
    once("--fake-gpus=4xT4", "--no-timestamp", "--sink=nfd", f"--nfd-file={path}")
    second = parse_feature_file(path.read_text())
    assert second == stdout_labels("4xT4")
    assert "kubegpu.io/gpu.nvlink" not in second
    assert "kubegpu.io/gpu.product.NVIDIA-A100-SXM4-80GB" not in second
    assert [p.name for p in features.iterdir()] == ["kubegpu"]  # no temp files left behind
    assert path.stat().st_mode & 0o777 == 0o644  # nfd-worker may run as another user


def wait_for_file(path: Path, condition: Callable[[dict[str, str]], bool], what: str) -> None:
    """The labeller is another process: its file is looked at, not announced."""
    labels: dict[str, str] = {}

    def holds() -> bool:
        nonlocal labels
        labels = parse_feature_file(path.read_text()) if path.exists() else {}
        return bool(labels) and condition(labels)

    wait_until(holds, timeout_s=30, what=lambda: f"{what}; file holds {labels}", poll_s=0.01)


def test_health_in_the_feature_file_follows_the_agents_recovery_rule(root: Path) -> None:
    config = root / "config.yaml"
    # 10 quiet checks (the monitor's 0.2 s each): long enough to see the dip in the file.
    config.write_text("version: v1\nhealth:\n  recoverAfterHealthyChecks: 10\n")
    control = root / "fake.sock"
    path = root / "features.d" / "kubegpu"
    process = subprocess.Popen(
        [
            *LABELS,
            "--fake-gpus=4xT4",
            f"--fake-control={control}",
            f"--config={config}",
            "--sink=nfd",
            f"--nfd-file={path}",
            "--poll=0.05",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env(),
    )
    try:
        wait_for_file(path, lambda labels: labels["kubegpu.io/gpu.healthy-count"] == "4", "start")
        # An Xid a GPU reset clears: quiet checks bring it back (79 would wait for a reboot).
        reply = send_fake_gpu_command(control, "xid", gpu=1, xid=95)
        assert reply["ok"], reply
        healthy = "kubegpu.io/gpu.healthy-count"
        wait_for_file(path, lambda labels: labels[healthy] == "3", "Xid 95 never counted")
        wait_for_file(path, lambda labels: labels[healthy] == "4", "GPU 1 never came back")
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert "GPU 1" in output and "healthy again" in output  # the agent's monitor's own log line
