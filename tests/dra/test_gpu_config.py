"""Decoding our driver's opaque configs from a ResourceClaim: NVIDIA's GpuConfig, read strictly.

The configs are those of NVIDIA's own examples (kubernetes-sigs/dra-driver-nvidia-gpu at
95932046683719c43b6a0dd9613c2e5aad5d6703: demo/specs/quickstart/v1/gpu-test5.yaml,
gpu-test-mps.yaml, gpu-test6.yaml; tests/bats/specs/gpu-mps.yaml, gpu-timeslicing.yaml), as
the allocator copies them into ``status.allocation.devices.config``.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.dra import (
    AllocatedDevice,
    ClaimAllocation,
    ClaimRef,
    DeviceConfig,
    MpsSharing,
    TimeSlicing,
)
from kubegpu.core.dra_ports import ClaimLookupError
from kubegpu.kube.gpu_config import GpuConfigError, gpu_sharing, kind_of
from kubegpu.kube.resource_claims import allocation_from_claim

DRIVER = "gpu.nvidia.com"
CLAIM = ClaimRef("gpu-test5", "multiple-gpus", "uid-1")
API = "resource.nvidia.com/v1beta1"


def gpu_config(sharing: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": API, "kind": "GpuConfig", **extra}
    if sharing is not None:
        body["sharing"] = sharing
    return body


# gpu-test5.yaml's two configs, as its claim template writes them.
TIME_SLICING_LONG = gpu_config(
    {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
)
MPS_50 = gpu_config(
    {
        "strategy": "MPS",
        "mpsConfig": {
            "defaultActiveThreadPercentage": 50,
            "defaultPinnedDeviceMemoryLimit": "10Gi",
        },
    }
)


def config_entry(
    parameters: Any, *requests: str, source: str = "FromClaim", driver: str = DRIVER
) -> dict[str, Any]:
    return {
        "source": source,
        "requests": list(requests),
        "opaque": {"driver": driver, "parameters": parameters},
    }


def claim_with(*configs: dict[str, Any]) -> dict[str, Any]:
    results = [
        {"request": "ts-gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
        {"request": "mps-gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-1"},
    ]
    return {
        "metadata": {"namespace": "gpu-test5", "name": "multiple-gpus", "uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": results, "config": list(configs)}}},
    }


def test_nvidia_quickstart_gpu_test5_decodes_per_request() -> None:
    obj = claim_with(config_entry(TIME_SLICING_LONG, "ts-gpu"), config_entry(MPS_50, "mps-gpu"))
    allocation = allocation_from_claim(obj, CLAIM, DRIVER)
    assert allocation.configs == (
        DeviceConfig(0, "FromClaim", ("ts-gpu",), f"{API} GpuConfig", TimeSlicing("Long")),
        DeviceConfig(
            1,
            "FromClaim",
            ("mps-gpu",),
            f"{API} GpuConfig",
            MpsSharing(active_thread_percentage=50, pinned_memory_bytes=10 * 2**30),
        ),
    )
    assert allocation.config_for("ts-gpu") == allocation.configs[0]
    assert allocation.config_for("mps-gpu") == allocation.configs[1]


def test_another_drivers_configs_are_not_ours_and_are_left_out() -> None:
    obj = claim_with(
        config_entry({"anything": "at all"}, "nic", driver="net.example.com"),
        config_entry(MPS_50, "mps-gpu"),
    )
    (config,) = allocation_from_claim(obj, CLAIM, DRIVER).configs
    assert config.index == 1 and config.problem is None


def test_the_claims_configs_take_precedence_over_the_class_ones() -> None:
    # The allocator lists them in any order; the claim's word wins, as in NVIDIA's driver.
    default = gpu_config({"strategy": "TimeSlicing"})
    obj = claim_with(
        config_entry(MPS_50, "mps-gpu"),
        config_entry(default, "mps-gpu", source="FromClass"),
        config_entry(gpu_config(), source="FromClass"),
    )
    allocation = allocation_from_claim(obj, CLAIM, DRIVER)
    assert [(c.index, c.source) for c in allocation.configs] == [
        (1, "FromClass"),
        (2, "FromClass"),
        (0, "FromClaim"),
    ]
    found = allocation.config_for("mps-gpu")
    assert found is not None and found.index == 0
    # ts-gpu: only the class config naming no request applies, and it is the last that does.
    found = allocation.config_for("ts-gpu")
    assert found is not None and found.index == 2


def test_a_config_naming_a_parent_request_applies_to_its_subrequests() -> None:
    config = DeviceConfig(0, "FromClaim", ("gpu",), "k")
    assert config.applies_to("gpu") and config.applies_to("gpu/a100")
    assert not config.applies_to("gpu2")
    only_sub = DeviceConfig(0, "FromClaim", ("gpu/a100",), "k")
    assert only_sub.applies_to("gpu/a100") and not only_sub.applies_to("gpu/h100")
    everyone = DeviceConfig(0, "FromClass", (), "k")
    assert everyone.applies_to("anything")


def test_only_configs_applying_to_our_results_are_in_use() -> None:
    allocation = ClaimAllocation(
        CLAIM,
        (AllocatedDevice("gpu", "node-a", "gpu-0"),),
        (DeviceConfig(0, "FromClaim", ("nic",), "k"), DeviceConfig(1, "FromClaim", (), "k")),
    )
    assert [c.index for c in allocation.configs_in_use()] == [1]


@pytest.mark.parametrize(
    ("parameters", "sharing"),
    [
        (gpu_config(), None),
        (gpu_config({"strategy": "TimeSlicing"}), TimeSlicing("Default")),
        (gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {}}), TimeSlicing()),
        (
            gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}),
            TimeSlicing("Short"),
        ),
        (TIME_SLICING_LONG, TimeSlicing("Long")),
        (gpu_config({"strategy": "MPS"}), MpsSharing()),
        (MPS_50, MpsSharing(50, 10 * 2**30)),
        (
            gpu_config(
                {
                    "strategy": "MPS",
                    "mpsConfig": {
                        "defaultPinnedDeviceMemoryLimit": "4Gi",
                        "defaultPerDevicePinnedMemoryLimit": {"0": "1Gi", "GPU-abc": "512Mi"},
                        "multiUser": False,
                    },
                }
            ),
            MpsSharing(None, 4 * 2**30, (("0", 2**30), ("GPU-abc", 2**29))),
        ),
        (
            gpu_config({"strategy": "MPS", "mpsConfig": {"multiUser": True}}),
            MpsSharing(multi_user=True),
        ),
    ],
    ids=[
        "no-sharing",
        "time-slicing-no-config",
        "time-slicing-no-interval",
        "time-slicing-short",
        "gpu-test5-long",
        "mps-no-config",
        "gpu-test-mps",
        "per-device-limits",
        "multi-user",
    ],
)
def test_gpu_config_sharing_is_read_into_our_values(parameters: Any, sharing: Any) -> None:
    assert gpu_sharing(parameters) == sharing


def mps(**config: Any) -> dict[str, Any]:
    return gpu_config({"strategy": "MPS", "mpsConfig": config})


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ("GpuConfig", "parameters is a str, not an object"),
        (
            {"apiVersion": API, "kind": "MigDeviceConfig"},
            "kind 'MigDeviceConfig' of apiVersion 'resource.nvidia.com/v1beta1' is not a "
            "config kubegpu reads",
        ),
        ({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}, "apiVersion"),
        ({"kind": "GpuConfig"}, "of apiVersion None"),
        (gpu_config(timeSlicing={}), "timeSlicing is not a field of GpuConfig"),
        (gpu_config({"strategy": "TimeSlicing", "interval": "Long"}), "sharing.interval is not"),
        (gpu_config({"strategy": "Exclusive"}), "sharing.strategy 'Exclusive' is not"),
        (gpu_config({}), "sharing.strategy None is not"),
        (gpu_config({"strategy": "MPS", "timeSlicingConfig": {}}), "cannot go with strategy MPS"),
        (
            gpu_config({"strategy": "TimeSlicing", "mpsConfig": {}}),
            "cannot go with strategy TimeSlicing",
        ),
        (
            gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "long"}}),
            "interval 'long' is not one of Default, Short, Medium, Long",
        ),
        (
            gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"slice": 1}}),
            "sharing.timeSlicingConfig.slice is not a field",
        ),
        (mps(defaultActiveThreadPercentage=101), "101 is not a whole number from 1 to 100"),
        (mps(defaultActiveThreadPercentage=0), "0 is not a whole number from 1 to 100"),
        (mps(defaultActiveThreadPercentage="50"), "'50' is not a whole number"),
        (mps(defaultActiveThreadPercentage=True), "True is not a whole number"),
        (mps(defaultPinnedDeviceMemoryLimit="lots"), "defaultPinnedDeviceMemoryLimit: 'lots'"),
        (mps(defaultPinnedDeviceMemoryLimit="1Ki"), "'1Ki' is less than 1Mi"),
        (mps(defaultPerDevicePinnedMemoryLimit=["1Gi"]), "is a list, not an object"),
        (mps(defaultPerDevicePinnedMemoryLimit={"0": "x"}), r"Limit\[0\]: 'x'"),
        (mps(multiUser="yes"), "multiUser is a str, not a boolean"),
        (mps(activeThreads=50), "sharing.mpsConfig.activeThreads is not a field"),
    ],
    ids=[
        "not-an-object",
        "mig-device-config",
        "other-version",
        "no-version",
        "unknown-top-field",
        "unknown-sharing-field",
        "unknown-strategy",
        "no-strategy",
        "mps-with-time-slicing-config",
        "time-slicing-with-mps-config",
        "unknown-interval",
        "unknown-time-slicing-field",
        "percentage-over-100",
        "percentage-0",
        "percentage-string",
        "percentage-bool",
        "bad-quantity",
        "below-1Mi",
        "per-device-not-a-map",
        "per-device-bad-quantity",
        "multi-user-not-bool",
        "unknown-mps-field",
    ],
)
def test_what_cannot_be_read_is_an_error_naming_it(parameters: Any, message: str) -> None:
    with pytest.raises(GpuConfigError, match=message):
        gpu_sharing(parameters)


def test_a_config_that_cannot_be_read_is_kept_with_its_problem() -> None:
    # Dropping it would ignore a setting: the driver refuses the claim instead (if it applies).
    obj = claim_with(config_entry(mps(defaultActiveThreadPercentage=150), "mps-gpu"))
    (config,) = allocation_from_claim(obj, CLAIM, DRIVER).configs
    assert config.sharing is None
    assert config.problem is not None and "150 is not a whole number" in config.problem
    assert str(config) == f"status.allocation.devices.config[0] (FromClaim {API} GpuConfig)"


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"source": "FromClaim", "requests": ["gpu"]}, "it has no opaque parameters"),
        (config_entry(MPS_50, source="FromPod"), "source 'FromPod' is not known"),
    ],
    ids=["not-opaque", "unknown-source"],
)
def test_configs_we_cannot_place_are_kept_with_their_problem(
    entry: dict[str, Any], problem: str
) -> None:
    (config,) = allocation_from_claim(claim_with(entry), CLAIM, DRIVER).configs
    assert config.problem is not None and problem in config.problem


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("all", r"status.allocation.devices.config is a str, not a list"),
        (["x"], r"config\[0\] is a str, not an object"),
        ([{"source": "FromClaim", "requests": "gpu"}], r"config\[0\].requests is not a list"),
        ([{"source": 1, "opaque": {}}], r"config\[0\].source is a int"),
        ([{"source": "FromClaim", "opaque": "x"}], r"config\[0\].opaque is a str"),
    ],
    ids=["config", "entry", "requests", "source", "opaque"],
)
def test_a_malformed_config_list_is_a_lookup_error(config: Any, message: str) -> None:
    obj = claim_with()
    obj["status"]["allocation"]["devices"]["config"] = config
    with pytest.raises(ClaimLookupError, match=message):
        allocation_from_claim(obj, CLAIM, DRIVER)


def test_kind_of_names_what_was_written() -> None:
    assert kind_of(MPS_50) == f"{API} GpuConfig"
    assert kind_of({"kind": 5}) == "? ?"
    assert kind_of(None) == "parameters"
