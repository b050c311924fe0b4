"""Shared mode with MPS enforcement on the machine's real GPU (``pytest -m gpu``).

A real ``kubegpu device-plugin --backend nvml`` process supervises the real
``nvidia-cuda-mps-control``; a pod's share (250 milli-GPU, 512 MiB) decided on card 0 comes back
from Allocate as MPS client limits, and a CUDA process started with exactly the container's
environment is held to them: it sees about a quarter of the SMs and cannot take 1 GiB."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kubelet.sharenode import SharedNode, ShareSpec

pytestmark = pytest.mark.gpu

# What a container sees: the SMs it may use, then whether 1 GiB can be taken.
PROBE = (
    "import torch\n"
    "print(torch.cuda.get_device_properties(0).multi_processor_count)\n"
    "try:\n"
    "    x = torch.empty(1024**3, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()\n"
    "    print('allocated')\n"
    "except torch.OutOfMemoryError:\n"
    "    print('refused')\n"
)


def run_as_container(envs: dict[str, str]) -> list[str]:
    env = {**os.environ, **envs}
    # The NVIDIA container runtime turns NVIDIA_VISIBLE_DEVICES into the container's only GPU;
    # on the host, CUDA_VISIBLE_DEVICES stands in for it.
    env["CUDA_VISIBLE_DEVICES"] = envs["NVIDIA_VISIBLE_DEVICES"]
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_a_shared_pod_is_held_to_its_share_by_the_real_mps_daemon(tempdir: Path) -> None:
    command = shutil.which("nvidia-cuda-mps-control")
    if command is None:
        pytest.skip("nvidia-cuda-mps-control is not installed")
    if importlib.util.find_spec("torch") is None:
        pytest.skip("no CUDA client available (torch is not installed)")
    node = SharedNode(tempdir, backend="nvml", enforcement="mps", mps_command=command)
    try:
        node.wait_ready()
        card = node.card(0)
        uid = node.add_shared_pod("quarter", 0, [ShareSpec("main", 250, 512)])
        got = node.allocate_share(uid, "quarter", "main")
        envs = dict(got.envs)
        assert envs["NVIDIA_VISIBLE_DEVICES"] == card.uuid
        assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{card.uuid}=512M"
        assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        pipe = Path(envs["CUDA_MPS_PIPE_DIRECTORY"])
        node.wait_until(lambda: (pipe / "control").exists(), "the MPS control pipe", 60)

        sms, outcome = run_as_container(envs)
        assert outcome == "refused", "the container took 1 GiB past its 512 MiB share"
        full_sms = int(
            subprocess.run(
                [sys.executable, "-c", PROBE.splitlines()[0] + "\n" + PROBE.splitlines()[1]],
                capture_output=True,
                text=True,
                check=True,
                timeout=180,
            ).stdout
        )
        assert 0 < int(sms) <= full_sms // 3, (sms, full_sms)
    finally:
        assert node.close() == 0
