"""The share contract: what a shared container is told, from the share and the path's settings.

One table, inputs to the exact contract (variables in order, MPS limits, mounts, share ID). The
device plugin (tests/kubelet/test_coordinator.py) and the DRA driver (tests/dra/test_cdi_mps.py)
each show that what they hand the container is this contract."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kubegpu.config.model import Dra, GpuShare
from kubegpu.core.container import MpsDirs
from kubegpu.sharing.annotations import CardShare
from kubegpu.sharing.contract import (
    Grant,
    MpsLimits,
    PeerAsk,
    ShareContract,
    ShareSettings,
    share_contract,
)
from kubegpu.sharing.peers import peer_compat

U0 = "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
U1 = "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"
VOLCANO, ALIYUN = peer_compat(["volcano", "aliyun"])

# The settings objects themselves, as each path passes them: sharing.gpuShare, dra.
PLUGIN = GpuShare()
PLUGIN_MPS = GpuShare.model_validate({"enforcement": "mps", "mps": {"hostDir": "/var/run/mps/"}})
DRA = Dra()
DRA_MPS = Dra.model_validate({"enforcement": "mps"})
DEFAULT_DIRS = MpsDirs("/run/kubegpu/mps/pipe", "/run/kubegpu/mps/log")
PLUGIN_DIRS = MpsDirs("/var/run/mps/pipe", "/var/run/mps/log")


@dataclass(frozen=True)
class Case:
    grant: Grant
    settings: ShareSettings
    env: list[tuple[str, str]]  # in order: the DRA driver writes them to the CDI spec so
    mps: MpsLimits | None = None
    together: tuple[Grant, ...] = ()
    peer: PeerAsk | None = None


CASES = {
    "plugin-share-accounting-only": Case(
        Grant.of(CardShare(U0, 0, 250, 3000)),
        PLUGIN,
        [
            ("NVIDIA_VISIBLE_DEVICES", U0),
            ("KUBEGPU_GPU_UUID", U0),
            ("KUBEGPU_GPU_MEMORY_LIMIT_MIB", "3000"),
            ("KUBEGPU_GPU_COMPUTE_MILLI", "250"),
            ("KUBEGPU_GPU_ENFORCEMENT", "none"),
        ],
    ),
    "plugin-share-under-mps-rounds-5-milli-up-to-1-percent": Case(
        Grant.of(CardShare(U1, 1, 5, 2048)),
        PLUGIN_MPS,
        [
            ("NVIDIA_VISIBLE_DEVICES", U1),
            ("KUBEGPU_GPU_UUID", U1),
            ("KUBEGPU_GPU_MEMORY_LIMIT_MIB", "2048"),
            ("KUBEGPU_GPU_COMPUTE_MILLI", "5"),
            ("KUBEGPU_GPU_ENFORCEMENT", "mps"),
            ("CUDA_MPS_PIPE_DIRECTORY", "/var/run/mps/pipe"),
            ("CUDA_MPS_LOG_DIRECTORY", "/var/run/mps/log"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"{U1}=2048M"),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "1"),
        ],
        MpsLimits(PLUGIN_DIRS, ((U1, 2048),), 1),
    ),
    "plugin-volcano-container-gets-volcanos-variables-first": Case(
        Grant.of(CardShare(U1, 1, 1, 1024)),
        PLUGIN_MPS,
        [
            ("NVIDIA_VISIBLE_DEVICES", U1),
            ("VOLCANO_GPU_TOTAL", "15360"),
            ("VOLCANO_GPU_MEMORY_TOTAL", "15360"),
            ("VOLCANO_GPU_ALLOCATED", "1024"),
            ("KUBEGPU_GPU_UUID", U1),
            ("KUBEGPU_GPU_MEMORY_LIMIT_MIB", "1024"),
            ("KUBEGPU_GPU_COMPUTE_MILLI", "1"),
            ("KUBEGPU_GPU_ENFORCEMENT", "mps"),
            ("CUDA_MPS_PIPE_DIRECTORY", "/var/run/mps/pipe"),
            ("CUDA_MPS_LOG_DIRECTORY", "/var/run/mps/log"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"{U1}=1024M"),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "1"),
        ],
        MpsLimits(PLUGIN_DIRS, ((U1, 1024),), 1),
        peer=PeerAsk(VOLCANO, card_memory_mib=15360, container_units=1024, pod_units=1024),
    ),
    "plugin-aliyun-container-is-told-card-pod-and-container-in-gib": Case(
        Grant.of(CardShare(U0, 2, 1, 2048)),
        PLUGIN,
        [
            ("NVIDIA_VISIBLE_DEVICES", U0),
            ("ALIYUN_COM_GPU_MEM_IDX", "2"),
            ("ALIYUN_COM_GPU_MEM_POD", "5"),
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "2"),
            ("ALIYUN_COM_GPU_MEM_DEV", "15"),
            ("KUBEGPU_GPU_UUID", U0),
            ("KUBEGPU_GPU_MEMORY_LIMIT_MIB", "2048"),
            ("KUBEGPU_GPU_COMPUTE_MILLI", "1"),
            ("KUBEGPU_GPU_ENFORCEMENT", "none"),
        ],
        peer=PeerAsk(ALIYUN, card_memory_mib=15360, container_units=2, pod_units=5),
    ),
    "dra-whole-card-is-never-an-mps-client": Case(
        Grant(U0, 0),
        DRA_MPS,
        [("NVIDIA_VISIBLE_DEVICES", U0), ("KUBEGPU_GPU_UUID", U0)],
    ),
    "dra-share-without-mps-is-told-its-share-id": Case(
        Grant(U0, 0, 1024, 100, "s-1"),
        DRA,
        [
            ("NVIDIA_VISIBLE_DEVICES", U0),
            ("KUBEGPU_GPU_UUID", U0),
            ("KUBEGPU_GPU_MEMORY_LIMIT_MIB", "1024"),
            ("KUBEGPU_GPU_COMPUTE_MILLI", "100"),
            ("KUBEGPU_DRA_SHARE_ID", "s-1"),
            ("KUBEGPU_GPU_ENFORCEMENT", "none"),
        ],
    ),
    "dra-share-by-memory-only-gets-no-thread-limit": Case(
        Grant(U1, 1, 3072, None, "s-2"),
        DRA_MPS,
        [
            ("NVIDIA_VISIBLE_DEVICES", U1),
            ("KUBEGPU_GPU_UUID", U1),
            ("KUBEGPU_GPU_MEMORY_LIMIT_MIB", "3072"),
            ("KUBEGPU_DRA_SHARE_ID", "s-2"),
            ("KUBEGPU_GPU_ENFORCEMENT", "mps"),
            ("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_DIRS.pipe_dir),
            ("CUDA_MPS_LOG_DIRECTORY", DEFAULT_DIRS.log_dir),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"{U1}=3072M"),
        ],
        MpsLimits(DEFAULT_DIRS, ((U1, 3072),), None),
    ),
    "dra-share-by-compute-only-gets-no-memory-limit": Case(
        Grant(U0, 0, None, 333, "s-3"),
        DRA_MPS,
        [
            ("NVIDIA_VISIBLE_DEVICES", U0),
            ("KUBEGPU_GPU_UUID", U0),
            ("KUBEGPU_GPU_COMPUTE_MILLI", "333"),
            ("KUBEGPU_DRA_SHARE_ID", "s-3"),
            ("KUBEGPU_GPU_ENFORCEMENT", "mps"),
            ("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_DIRS.pipe_dir),
            ("CUDA_MPS_LOG_DIRECTORY", DEFAULT_DIRS.log_dir),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "34"),
        ],
        MpsLimits(DEFAULT_DIRS, (), 34),
    ),
    "dra-two-cards-of-one-request-name-both-in-list-and-memory-limits": Case(
        Grant(U1, 1, 2048, None, "s-2"),
        DRA_MPS,
        [
            ("NVIDIA_VISIBLE_DEVICES", f"{U0},{U1}"),
            ("KUBEGPU_GPU_UUID", f"{U0},{U1}"),
            ("KUBEGPU_GPU_MEMORY_LIMIT_MIB", "2048"),
            ("KUBEGPU_DRA_SHARE_ID", "s-2"),
            ("KUBEGPU_GPU_ENFORCEMENT", "mps"),
            ("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_DIRS.pipe_dir),
            ("CUDA_MPS_LOG_DIRECTORY", DEFAULT_DIRS.log_dir),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"{U0}=1024M,{U1}=2048M"),
        ],
        MpsLimits(DEFAULT_DIRS, ((U0, 1024), (U1, 2048)), None),
        together=(Grant(U0, 0, 1024, 300, "s-1"), Grant(U1, 1, 2048, None, "s-2")),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_contract_a_shared_container_is_told(case: Case) -> None:
    told = share_contract(case.grant, case.settings, together=case.together, peer=case.peer)
    cards = tuple(g.uuid for g in case.together) or (case.grant.uuid,)
    assert told == ShareContract(cards, dict(case.env), case.mps, case.grant.share_id)
    assert list(told.env.items()) == case.env
    assert told.share_env == dict(case.env[1:])  # the device plugin names the cards itself
    mps = case.mps
    assert told.mounts == ((mps.dirs.pipe_dir, mps.dirs.log_dir) if mps is not None else ())
