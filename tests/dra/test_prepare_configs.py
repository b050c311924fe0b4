"""A claim's opaque GpuConfig at NodePrepareResources, over the real gRPC socket with the claim
read over real HTTP (tests/dra/resource_api.py): honoured where it maps onto what kubegpu does
(the CDI environment says so), refused with what to do instead where it does not, never
dropped. The claims are NVIDIA's own examples where there is one (tests/dra/test_gpu_config.py
names them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from kubegpu.config.model import Dra
from kubegpu.core.container import MpsDirs
from kubegpu.core.dra import KUBEGPU_NAMING, NVIDIA_NAMING, ClaimRef, DraNaming
from kubegpu.dra.cdi import spec_path
from kubegpu.dra.driver import ClaimPreparer
from kubegpu.dra.server import DraPluginServer
from kubegpu.kube.resource_claims import LightkubeResourceClaimSource

from .conftest import NODE, Node
from .resource_api import PREFIX, ResourceApi, serve
from .test_gpu_config import MPS_50, TIME_SLICING_LONG, config_entry, gpu_config, mps
from .test_server import cdi_spec, envs_by_device, prepare

CLAIM = ClaimRef("gpu-test-mps", "shared-gpu", "cccccccc-0000-4000-8000-000000000001")
ENFORCED = Dra.model_validate({"enforcement": "mps"})
MPS = MpsDirs.under(ENFORCED.mps.host_dir)
NVIDIA = NVIDIA_NAMING.driver


def result(request: str, device: str, **extra: Any) -> tuple[str, str, dict[str, Any]]:
    return request, device, extra


def claim_object(
    results: list[tuple[str, str, dict[str, Any]]], *configs: dict[str, Any], driver: str = NVIDIA
) -> dict[str, Any]:
    """The claim, allocated: ``results`` (:func:`result`) and ``configs``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": CLAIM.name, "namespace": CLAIM.namespace, "uid": CLAIM.uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": request, "driver": driver, "pool": NODE, "device": device}
                        | extra
                        for request, device, extra in results
                    ],
                    "config": list(configs),
                }
            }
        },
    }


@asynccontextmanager
async def driver(
    node: Node, claim: dict[str, Any], shares: Dra = ENFORCED, naming: DraNaming = NVIDIA_NAMING
) -> AsyncIterator[ResourceApi]:
    """``node``'s driver under ``shares`` and ``naming``, serving ``claim`` from the API."""
    api = ResourceApi()
    api.claims[(CLAIM.namespace, CLAIM.name)] = claim
    settings = replace(node.settings, shares=shares, naming=naming)
    async with serve(api) as client:
        preparer = ClaimPreparer(settings, node.inventory, LightkubeResourceClaimSource(client))
        async with DraPluginServer(preparer, node.sockets):
            yield api


async def prepared_env(node: Node, device: str = "gpu-0") -> dict[str, str]:
    response = await prepare(node, CLAIM)
    assert response.claims[CLAIM.uid].error == ""
    return envs_by_device(cdi_spec(node, CLAIM), CLAIM)[device]


async def refusal(node: Node) -> str:
    response = await prepare(node, CLAIM)
    error: str = response.claims[CLAIM.uid].error
    assert error.startswith(f"claim {CLAIM}: ")
    assert not spec_path(node.settings.cdi_dir, CLAIM.uid).exists()
    return error


def uuid(node: Node, index: int) -> str:
    return node.inventory.gpus[index].uuid


async def test_nvidia_mps_example_holds_a_whole_gpu_to_its_limits_under_enforcement_mps(
    node: Node,
) -> None:
    # gpu-test-mps.yaml: a whole GPU whose containers NVIDIA holds to 50 % and 10Gi.
    claim = claim_object([result("mps-gpu", "gpu-0")], config_entry(MPS_50, "mps-gpu"))
    async with driver(node, claim):
        env = await prepared_env(node)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{uuid(node, 0)}=10240M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == MPS.pipe_dir
    assert env["KUBEGPU_GPU_ENFORCEMENT"] == "mps"
    assert (env["KUBEGPU_GPU_MEMORY_LIMIT_MIB"], env["KUBEGPU_GPU_COMPUTE_MILLI"]) == (
        "10240",
        "500",
    )
    (device,) = [d for d in cdi_spec(node, CLAIM)["devices"]]
    mounts = device["containerEdits"]["mounts"]
    assert [m["hostPath"] for m in mounts] == [MPS.pipe_dir, MPS.log_dir]


async def test_mps_is_refused_under_enforcement_none_with_what_to_do(node: Node) -> None:
    claim = claim_object([result("mps-gpu", "gpu-0")], config_entry(MPS_50, "mps-gpu"))
    async with driver(node, claim, shares=Dra()):
        error = await refusal(node)
    assert error == (
        f"claim {CLAIM}: status.allocation.devices.config[0] (FromClaim "
        "resource.nvidia.com/v1beta1 GpuConfig): MPS requested by GpuConfig, but this driver "
        "runs dra.enforcement: none (no MPS daemon); set dra.enforcement: mps on the driver, "
        "or ask for a share by capacity (capacity.requests.memory / compute; accounted, not "
        "enforced, under none)"
    )
    assert node.preparer().checkpoint.claims() == {}


async def test_nvidia_gpu_test5_is_refused_for_its_long_time_slice(node: Node) -> None:
    claim = claim_object(
        [result("ts-gpu", "gpu-0"), result("mps-gpu", "gpu-1")],
        config_entry(TIME_SLICING_LONG, "ts-gpu"),
        config_entry(MPS_50, "mps-gpu"),
    )
    async with driver(node, claim):
        error = await refusal(node)
    assert "config[0] (FromClaim resource.nvidia.com/v1beta1 GpuConfig)" in error
    assert "sharing.timeSlicingConfig.interval Long is not supported" in error
    assert "use interval Default" in error


async def test_time_slicing_default_is_the_gpu_as_it_is(node: Node) -> None:
    default = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}})
    claim = claim_object([result("gpu", "gpu-0")], config_entry(default, "gpu"))
    async with driver(node, claim):
        env = await prepared_env(node)
    assert env == {"NVIDIA_VISIBLE_DEVICES": uuid(node, 0), "KUBEGPU_GPU_UUID": uuid(node, 0)}


async def test_the_claims_config_overrides_its_class_one(node: Node) -> None:
    # The class says Long (which alone is refused); the claim's own Default is what applies.
    default = gpu_config({"strategy": "TimeSlicing"})
    claim = claim_object(
        [result("gpu", "gpu-0")],
        config_entry(default, "gpu"),
        config_entry(TIME_SLICING_LONG, "gpu", source="FromClass"),
    )
    async with driver(node, claim):
        env = await prepared_env(node)
    assert "KUBEGPU_GPU_ENFORCEMENT" not in env


async def test_an_unknown_kind_is_refused_naming_it(node: Node) -> None:
    mig = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"}
    claim = claim_object([result("gpu", "gpu-0")], config_entry(mig))
    async with driver(node, claim):
        error = await refusal(node)
    assert "config[0] (FromClaim resource.nvidia.com/v1beta1 MigDeviceConfig)" in error
    assert "kind 'MigDeviceConfig' of apiVersion 'resource.nvidia.com/v1beta1' is not a" in error
    assert "fix or remove it" in error


async def test_an_unknown_field_is_refused_naming_it(node: Node) -> None:
    claim = claim_object([result("gpu", "gpu-0")], config_entry(mps(activeThreads=50), "gpu"))
    async with driver(node, claim):
        error = await refusal(node)
    assert "sharing.mpsConfig.activeThreads is not a field of GpuConfig" in error


async def test_another_drivers_config_is_not_ours_and_changes_nothing(node: Node) -> None:
    theirs = config_entry({"kind": "NicConfig", "mtu": 9000}, driver="net.example.com")
    claim = claim_object([result("gpu", "gpu-0")], theirs)
    async with driver(node, claim):
        env = await prepared_env(node)
    assert "KUBEGPU_GPU_ENFORCEMENT" not in env


async def test_under_our_own_naming_a_config_for_our_driver_is_read_too(node: Node) -> None:
    ours = "gpu.kubegpu.io"
    claim = claim_object(
        [result("gpu", "gpu-0")], config_entry(MPS_50, "gpu", driver=ours), driver=ours
    )
    async with driver(node, claim, shares=Dra(), naming=KUBEGPU_NAMING):
        error = await refusal(node)
    assert "MPS requested by GpuConfig, but this driver runs dra.enforcement: none" in error


async def test_mps_without_limits_makes_a_whole_gpu_a_client_that_may_use_all_of_it(
    node: Node,
) -> None:
    claim = claim_object([result("gpu", "gpu-0")], config_entry(gpu_config({"strategy": "MPS"})))
    async with driver(node, claim):
        env = await prepared_env(node)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == MPS.pipe_dir
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env


SHARE = {"shareID": "s-1", "consumedCapacity": {"memory": "4Gi", "compute": "500"}}


async def test_mps_narrows_a_share(node: Node) -> None:
    claim = claim_object(
        [result("gpu", "gpu-1", **SHARE)], config_entry(mps(defaultActiveThreadPercentage=25))
    )
    async with driver(node, claim):
        env = await prepared_env(node, "gpu-1")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["KUBEGPU_GPU_COMPUTE_MILLI"] == "250"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{uuid(node, 1)}=4096M"  # the share's


async def test_mps_may_not_widen_a_share(node: Node) -> None:
    # More than the allocator counted would take from the card's other claims.
    claim = claim_object(
        [result("gpu", "gpu-1", **SHARE)], config_entry(mps(defaultPinnedDeviceMemoryLimit="10Gi"))
    )
    async with driver(node, claim):
        error = await refusal(node)
    assert "asks for 10240Mi of memory on gpu-1, more than the claim's share (4096Mi)" in error
    assert "ask for the share you need by capacity (capacity.requests.memory / compute)" in error


async def test_per_device_limits_by_index_and_by_uuid(node: Node) -> None:
    limits = {"0": "1Gi", uuid(node, 1): "2Gi"}
    config = mps(defaultPinnedDeviceMemoryLimit="8Gi", defaultPerDevicePinnedMemoryLimit=limits)
    claim = claim_object(
        [result("gpu", "gpu-0"), result("gpu", "gpu-1")], config_entry(config, "gpu")
    )
    async with driver(node, claim):
        env = await prepared_env(node, "gpu-1")
    both = f"{uuid(node, 0)}=1024M,{uuid(node, 1)}=2048M"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == both


async def test_a_per_device_key_naming_no_device_of_the_config_is_refused(node: Node) -> None:
    config = mps(defaultPerDevicePinnedMemoryLimit={"1": "1Gi"})
    claim = claim_object([result("gpu", "gpu-0")], config_entry(config, "gpu"))
    async with driver(node, claim):
        error = await refusal(node)
    assert "names '1', neither the UUID of a GPU it applies to nor an index below 1" in error


async def test_multi_user_mps_is_refused(node: Node) -> None:
    claim = claim_object([result("gpu", "gpu-0")], config_entry(mps(multiUser=True)))
    async with driver(node, claim):
        error = await refusal(node)
    assert "sharing.mpsConfig.multiUser is not supported" in error


async def test_the_limits_survive_a_restart_answered_from_the_checkpoint(node: Node) -> None:
    claim = claim_object([result("mps-gpu", "gpu-0")], config_entry(MPS_50, "mps-gpu"))
    async with driver(node, claim):
        first = await prepare(node, CLAIM)
    spec = cdi_spec(node, CLAIM)
    # A restarted driver, now without MPS and with the claim's config gone (neither can
    # happen to a prepared claim; it shows the answer comes from what was prepared).
    async with driver(node, claim_object([result("mps-gpu", "gpu-0")]), shares=Dra()) as api:
        again = await prepare(node, CLAIM)
    assert again == first
    assert not [p for p in api.paths if p.startswith(PREFIX)]  # no second read
    assert cdi_spec(node, CLAIM) == spec
    env = envs_by_device(spec, CLAIM)["gpu-0"]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
