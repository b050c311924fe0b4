"""A prepared claim's CDI device under ``enforcement: mps`` and without it: the share contract
(:func:`kubegpu.sharing.contract.share_contract`, tests/sharing/test_contract.py) in CDI form."""

from __future__ import annotations

import pytest

from kubegpu.config.model import Dra
from kubegpu.core.container import MpsDirs
from kubegpu.dra import cdi
from kubegpu.sharing.contract import ShareSettings

from .conftest import gpu

# The config's `dra` section, as the role hands it to the driver.
ENFORCED = Dra.model_validate({"enforcement": "mps"})
UNENFORCED = Dra()
MPS = MpsDirs("/run/kubegpu/mps/pipe", "/run/kubegpu/mps/log")  # under the default mps.hostDir
GPU = gpu(0)


def env_of(device: cdi.ClaimDevice, shares: ShareSettings) -> dict[str, str]:
    spec = cdi.claim_spec("uid-1", [device], "gpu.kubegpu.io/claim", shares=shares)
    return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])


@pytest.mark.parametrize(
    ("compute_milli", "percent"),
    [(250, "25"), (5, "1"), (1000, "100"), (333, "34")],
    ids=["quarter", "tiny-rounds-up-to-1", "whole-card", "third-rounds-up"],
)
def test_a_share_under_mps_gets_its_limits(compute_milli: int, percent: str) -> None:
    share = cdi.ClaimDevice(
        "gpu-0", GPU, "s-1", memory_bytes=3 * 2**30, compute_milli=compute_milli
    )
    env = env_of(share, ENFORCED)
    assert env["KUBEGPU_GPU_ENFORCEMENT"] == "mps"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == MPS.pipe_dir
    assert env["CUDA_MPS_LOG_DIRECTORY"] == MPS.log_dir
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{GPU.uuid}=3072M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == percent


def test_a_share_by_memory_only_gets_no_thread_limit() -> None:
    env = env_of(cdi.ClaimDevice("gpu-0", GPU, "s-1", memory_bytes=2**30), ENFORCED)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{GPU.uuid}=1024M"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


def test_a_share_without_mps_is_accounting_only() -> None:
    share = cdi.ClaimDevice("gpu-0", GPU, "s-1", memory_bytes=2**30, compute_milli=100)
    env = env_of(share, UNENFORCED)
    assert env["KUBEGPU_GPU_ENFORCEMENT"] == "none"
    assert not [k for k in env if k.startswith("CUDA_MPS_")]
    spec = cdi.claim_spec("uid-1", [share], "gpu.kubegpu.io/claim")
    assert "mounts" not in spec["devices"][0]["containerEdits"]


def test_a_whole_gpu_is_never_an_mps_client() -> None:
    whole = cdi.ClaimDevice("gpu-0", GPU)
    env = env_of(whole, ENFORCED)
    assert "KUBEGPU_GPU_ENFORCEMENT" not in env
    assert not [k for k in env if k.startswith("CUDA_MPS_")]
    spec = cdi.claim_spec("uid-1", [whole], "gpu.kubegpu.io/claim", shares=ENFORCED)
    assert "mounts" not in spec["devices"][0]["containerEdits"]


def test_the_mps_folders_are_mounted_at_the_same_path() -> None:
    share = cdi.ClaimDevice("gpu-0", GPU, "s-1", memory_bytes=2**30)
    spec = cdi.claim_spec("uid-1", [share], "gpu.kubegpu.io/claim", shares=ENFORCED)
    mounts = spec["devices"][0]["containerEdits"]["mounts"]
    assert [(m["hostPath"], m["containerPath"]) for m in mounts] == [
        (MPS.pipe_dir, MPS.pipe_dir),
        (MPS.log_dir, MPS.log_dir),
    ]


def test_mps_memory_limits_name_every_card_of_the_request() -> None:
    # Two shares of one request on two cards: the runtime keeps one value per variable, so
    # each device's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT lists both cards' limits.
    first = cdi.ClaimDevice("gpu-0", GPU, "s-1", memory_bytes=2**30, requests=frozenset({"g"}))
    second = cdi.ClaimDevice("gpu-1", gpu(1), "s-2", memory_bytes=2**31, requests=frozenset({"g"}))
    spec = cdi.claim_spec("uid-1", [second, first], "gpu.kubegpu.io/claim", shares=ENFORCED)
    both = f"{GPU.uuid}=1024M,{gpu(1).uuid}=2048M"
    for device in spec["devices"]:
        env = dict(e.split("=", 1) for e in device["containerEdits"]["env"])
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == both
        assert env["NVIDIA_VISIBLE_DEVICES"] == f"{GPU.uuid},{gpu(1).uuid}"


def test_each_device_is_told_the_share_contract() -> None:
    # What the spec writes is the contract, in order, and its mounts: nothing of the driver's own.
    first = cdi.ClaimDevice("gpu-0", GPU, "s-1", 2**30, 250, requests=frozenset({"g"}))
    second = cdi.ClaimDevice("gpu-1", gpu(1), None, requests=frozenset({"g"}))
    spec = cdi.claim_spec("uid-1", [second, first], "gpu.kubegpu.io/claim", shares=ENFORCED)
    for device, written in zip([second, first], spec["devices"], strict=True):
        told = cdi.device_contract(device, ENFORCED, [first, second])
        edits = written["containerEdits"]
        assert edits["env"] == [f"{k}={v}" for k, v in told.env.items()]
        assert [m["hostPath"] for m in edits.get("mounts", [])] == list(told.mounts)
    assert cdi.device_contract(first, ENFORCED, [first, second]).share_id == "s-1"
    assert "mounts" not in spec["devices"][0]["containerEdits"]  # the whole card: no client
