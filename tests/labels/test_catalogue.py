"""The label catalogue as tables: names, values, the mixed-model rule and sanitising."""

from __future__ import annotations

import dataclasses

import pytest

from kubegpu.core.gpu import GpuDevice, GpuLink, GpuUuid, NodeInventory, PcieLink
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.labels.catalogue import (
    PCI_CLASS_3D,
    PCI_CLASS_VGA,
    HostFacts,
    SharingSummary,
    compute_labels,
    gfd_sanitise,
    gpu_family,
    gpu_mode,
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
            {
                "driver-version.major": "535",
                "driver-version.minor": "54",
                "driver.minor": "54",
                # GFD writes the revision of a two-part version too, empty.
                "driver-version.revision": "",
                "driver.rev": "",
            },
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
        ("nvidia.com/gpu.machine", True),
        ("nvidia.com/gpu.clique", False),  # GFD's (IMEX), not ours
        ("nvidia.com/mig.strategy", True),  # written under migStrategy single and mixed
        ("nvidia.com/mig-1g.10gb.count", True),  # mixed's per-profile labels
        ("nvidia.com/mig-1g.10gb.me.engines.ofa", True),
        ("nvidia.com/gpu.slices.gi", True),  # single's
        ("nvidia.com/mig.config", False),  # the GPU operator's MIG manager's
        ("nvidia.com/mig.config.state", False),
        ("nvidia.com/mig-1g.10gb.anything", False),
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


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB"),
        ("  NVIDIA   GeForce RTX 4090 ", "NVIDIA-GeForce-RTX-4090"),
        # GFD drops what it does not keep, where ours would put "-".
        ("Standard PC (Q35 + ICH9, 2009)", "Standard-PC-Q35-ICH9-2009"),
        ("A/B", "AB"),
        ("AS -4124GO-NART+", "AS--4124GO-NART"),
        ("", ""),
        ("x" * 70, "x" * 63),  # GFD does not cut; a Node would refuse it
    ],
)
def test_names_are_spelt_as_gfd_spells_them(raw: str, expected: str) -> None:
    assert gfd_sanitise(raw) == expected


@pytest.mark.parametrize(
    ("classes", "mode"),
    [
        ([PCI_CLASS_3D, PCI_CLASS_3D], "compute"),
        ([PCI_CLASS_VGA], "graphics"),
        ([PCI_CLASS_3D, PCI_CLASS_VGA], "unknown"),
        ([PCI_CLASS_3D, None], "unknown"),
        ([0x068000], "unknown"),
        ([], "unknown"),
    ],
    ids=["3d", "vga", "mixed", "one-unread", "nvswitch", "none"],
)
def test_gpu_mode_follows_gfds_rule_over_pci_classes(classes: list[int | None], mode: str) -> None:
    assert gpu_mode(classes) == mode


def test_machine_and_mode_come_from_the_host_facts_and_default_to_gfds_unknown() -> None:
    inv = NodeInventory(gpus=(gpu(0), gpu(1)))
    assert {
        k: compute_labels(inv)[k] for k in ("nvidia.com/gpu.machine", "nvidia.com/gpu.mode")
    } == {
        "nvidia.com/gpu.machine": "unknown",
        "nvidia.com/gpu.mode": "unknown",
    }
    host = HostFacts(
        machine_type="PowerEdge XE9680",
        pci_classes={g.pci_bus_id: PCI_CLASS_3D for g in inv.gpus},
    )
    labels = compute_labels(inv, host=host)
    assert labels["nvidia.com/gpu.machine"] == "PowerEdge-XE9680"
    assert labels["nvidia.com/gpu.mode"] == "compute"


@pytest.mark.parametrize(
    ("sharing", "product"),
    [
        (SharingSummary(), "NVIDIA-H100-80GB-HBM3"),
        (SharingSummary("time-slicing", replicas=4), "NVIDIA-H100-80GB-HBM3-SHARED"),
        (SharingSummary("time-slicing", replicas=4, renamed=True), "NVIDIA-H100-80GB-HBM3"),
        (SharingSummary("mps", replicas=2), "NVIDIA-H100-80GB-HBM3-SHARED"),
        (SharingSummary("time-slicing", replicas=1), "NVIDIA-H100-80GB-HBM3"),
    ],
    ids=["unshared", "time-sliced", "renamed", "mps", "one-replica"],
)
def test_a_shared_whole_gpu_is_marked_in_the_product_as_gfd_marks_it(
    sharing: SharingSummary, product: str
) -> None:
    labels = compute_labels(NodeInventory(gpus=(gpu(0),)), sharing=sharing)
    assert labels["nvidia.com/gpu.product"] == product


def test_the_shared_mark_survives_a_name_at_the_length_limit() -> None:
    labels = compute_labels(
        NodeInventory(gpus=(gpu(0, product="x" * 70),)),
        sharing=SharingSummary("time-slicing", replicas=2),
    )
    assert labels["nvidia.com/gpu.product"] == "x" * 56 + "-SHARED"


@pytest.mark.parametrize(
    ("strategy", "mig", "capable"),
    [
        ("mps", False, "true"),
        ("mps", None, "true"),
        ("mps", True, "false"),  # MPS does not run on MIG devices
        ("time-slicing", False, "false"),
        ("none", False, "false"),
    ],
)
def test_mps_is_capable_where_the_strategy_is_mps_and_no_gpu_is_in_mig_mode(
    strategy: str, mig: bool | None, capable: str
) -> None:
    labels = compute_labels(
        NodeInventory(gpus=(gpu(0), gpu(1, mig=mig))), sharing=SharingSummary(strategy)
    )
    assert labels["nvidia.com/mps.capable"] == capable


def test_a_capability_gfds_table_does_not_name_is_family_undefined_as_in_gfd() -> None:
    assert compute_labels(NodeInventory(gpus=(gpu(0, cc=(4, 0)),)))["nvidia.com/gpu.family"] == (
        "undefined"
    )
    assert "nvidia.com/gpu.family" not in compute_labels(NodeInventory(gpus=(gpu(0, cc=None),)))
