"""The label catalogue as tables: names, values, the mixed-model rule and sanitising."""

from __future__ import annotations

import dataclasses

import pytest

from kubegpu.core.gpu import GpuDevice, GpuLink, GpuUuid, NodeInventory, PcieLink
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.labels.catalogue import (
    SharingSummary,
    compute_labels,
    gpu_family,
    is_valid_label_key,
    is_valid_label_value,
    owns_label,
    sanitise_label_value,
)


def gpu(
    index: int,
    product: str = "NVIDIA H100 80GB HBM3",
    memory: int = 81559,
    cc: tuple[int, int] | None = (9, 0),
    mig: bool | None = False,
) -> GpuDevice:
    return GpuDevice(
        index=index,
        uuid=GpuUuid(f"GPU-{index:08d}-0000-0000-0000-000000000000"),
        product_name=product,
        memory_total_mib=memory,
        pci_bus_id=f"00000000:{index + 16:02X}:00.0",
        minor_number=index,
        compute_capability=cc,
        mig_enabled=mig,
    )


@pytest.mark.parametrize(
    ("cc", "family"),
    [
        ((6, 0), "pascal"),
        ((7, 0), "volta"),
        ((7, 2), "volta"),
        ((7, 5), "turing"),
        ((8, 0), "ampere"),
        ((8, 6), "ampere"),
        ((8, 9), "ada-lovelace"),
        ((9, 0), "hopper"),
        ((10, 0), "blackwell"),
        ((12, 0), "blackwell"),
        ((13, 0), "rubin"),
        ((4, 0), "undefined"),
        (None, "undefined"),
    ],
    ids=str,
)
def test_family_follows_gfds_table(cc: tuple[int, int] | None, family: str) -> None:
    assert gpu_family(cc) == family


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Tesla T4", "Tesla-T4"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("  NVIDIA GeForce RTX 4090 (rev a1) ", "NVIDIA-GeForce-RTX-4090-rev-a1"),
        ("A/B:C,D", "A-B-C-D"),
        ("-._x_.-", "x"),
        ("!!!", ""),
        ("x" * 70, "x" * 63),
        ("a" * 62 + "-b", "a" * 62),  # cut at 63 would end on "-": trimmed
    ],
)
def test_sanitised_values_are_valid_label_values(raw: str, expected: str) -> None:
    value = sanitise_label_value(raw)
    assert value == expected
    assert is_valid_label_value(value)


def test_uniform_node_gets_gfds_per_gpu_labels() -> None:
    labels = compute_labels(NodeInventory(gpus=(gpu(0), gpu(1))))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.memory"] == "81559"
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert (labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]) == (
        "9",
        "0",
    )
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["kubegpu.io/gpu.mixed"] == "false"
    assert labels["kubegpu.io/gpu.product.NVIDIA-H100-80GB-HBM3"] == "2"


def test_mixed_node_leaves_out_facts_the_gpus_disagree_on() -> None:
    inv = NodeInventory(
        gpus=(gpu(0), gpu(1, product="Tesla T4", memory=15360, cc=(7, 5), mig=None), gpu(2))
    )
    labels = compute_labels(inv)
    for key in ("product", "memory", "family", "compute.major", "compute.minor"):
        assert f"nvidia.com/gpu.{key}" not in labels
    assert labels["nvidia.com/gpu.count"] == "3"
    assert labels["kubegpu.io/gpu.mixed"] == "true"
    assert labels["kubegpu.io/gpu.product.NVIDIA-H100-80GB-HBM3"] == "2"
    assert labels["kubegpu.io/gpu.product.Tesla-T4"] == "1"
    assert labels["kubegpu.io/gpu.memory-min"] == "15360"
    assert labels["nvidia.com/mig.capable"] == "true"  # one H100 can do MIG


def test_same_model_with_different_memory_keeps_product_but_not_memory() -> None:
    labels = compute_labels(NodeInventory(gpus=(gpu(0), gpu(1, memory=81000))))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert "nvidia.com/gpu.memory" not in labels
    assert labels["kubegpu.io/gpu.memory-min"] == "81000"


def test_long_model_names_make_valid_keys() -> None:
    long_name = "NVIDIA Some Very Long Future Accelerator Name With Many Words 192GB HBM4e"
    labels = compute_labels(NodeInventory(gpus=(gpu(0, product=long_name),)))
    for key, value in labels.items():
        assert is_valid_label_key(key), key
        assert is_valid_label_value(value), value


def test_health_sharing_and_nvlink_labels() -> None:
    a, b = gpu(0), gpu(1)
    inv = NodeInventory(gpus=(a, b), links={(a.uuid, b.uuid): GpuLink(PcieLink.SYS, nvlinks=12)})
    labels = compute_labels(
        inv, health={a.uuid: False}, sharing=SharingSummary("time-slicing", replicas=4)
    )
    assert labels["kubegpu.io/gpu.healthy-count"] == "1"
    assert labels["kubegpu.io/gpu.nvlink"] == "true"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    pcie_only = dataclasses.replace(inv, links={(a.uuid, b.uuid): GpuLink(PcieLink.PIX)})
    assert "kubegpu.io/gpu.nvlink" not in compute_labels(pcie_only)


@pytest.mark.parametrize(
    ("driver", "cuda", "expected"),
    [
        (
            "550.107.02",
            "12.5",
            {
                "driver-version.major": "550",
                "driver-version.minor": "107",
                "driver-version.revision": "02",
                "driver.rev": "02",
                "runtime-version.full": "12.5",
                "runtime.minor": "5",
            },
        ),
        (
            "535.54",
            "12.2",
            {"driver-version.major": "535", "driver-version.minor": "54", "driver.minor": "54"},
        ),
        (None, None, {}),
    ],
    ids=["three-part", "two-part", "unknown"],
)
def test_driver_and_cuda_versions_are_split_like_gfd(
    driver: str | None, cuda: str | None, expected: dict[str, str]
) -> None:
    labels = compute_labels(
        NodeInventory(gpus=(gpu(0),), driver_version=driver, cuda_driver_version=cuda)
    )
    for suffix, value in expected.items():
        assert labels[f"nvidia.com/cuda.{suffix}"] == value
    if driver is None:
        assert not [k for k in labels if k.startswith("nvidia.com/cuda.")]
    if driver == "535.54":
        assert "nvidia.com/cuda.driver-version.revision" not in labels


def test_a_node_without_gpus_says_so_and_nothing_else_about_gpus() -> None:
    labels = compute_labels(NodeInventory(gpus=()), now=5.0)
    assert labels == {
        "nvidia.com/gpu.count": "0",
        "kubegpu.io/gpu.healthy-count": "0",
        "nvidia.com/gfd.timestamp": "5",
    }


@pytest.mark.parametrize(
    ("key", "owned"),
    [
        ("kubegpu.io/gpu.nvlink", True),
        ("kubegpu.io/gpu.healthy-count", True),
        ("kubegpu.io/gpu.product.Tesla-T4", True),
        # Under our prefix but set by admins or other components: never the labeller's.
        ("kubegpu.io/anything", False),
        ("kubegpu.io/device-plugin", False),
        ("kubegpu.io/gpu-inventory", False),
        ("nvidia.com/gpu.product", True),
        ("nvidia.com/gpu.machine", False),  # GFD's, not ours
        ("nvidia.com/gfd.timestamp", True),  # GFD's name for the same fact
        ("kubegpu.io/labels.timestamp", True),  # retired: ours so that upgrades remove it
        ("nvidia.com/gpu.deploy.driver", False),  # the GPU operator's
        ("kubernetes.io/hostname", False),
    ],
)
def test_only_our_labels_are_owned(key: str, owned: bool) -> None:
    assert owns_label(key) is owned


@pytest.mark.parametrize("preset", ["8xA100-80GB-NVLink", "4xT4", "2xV100-2xT4"])
def test_every_label_the_catalogue_writes_is_owned(preset: str) -> None:
    # Ownership is exact, so a label the catalogue writes but does not own would be left behind
    # on the node when its fact stops being true.
    labels = compute_labels(
        resolve_fake_spec(preset).inventory,
        sharing=SharingSummary("time-slicing", replicas=2),
        now=1.0,
    )
    assert [key for key in labels if not owns_label(key)] == []
