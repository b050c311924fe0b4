"""GFD's MIG labels under flags.migStrategy single and mixed, value by value as NVIDIA's
gpu-feature-discovery writes them, and held to its golden files for each strategy."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kubegpu.config import load_config
from kubegpu.core.gpu import NodeInventory
from kubegpu.inventory.spec import parse_fake_spec, resolve_fake_spec
from kubegpu.labels.catalogue import (
    COUNT,
    MEMORY,
    PRODUCT,
    REPLICAS,
    SHARING_STRATEGY,
    SharingSummary,
    compute_labels,
    sharing_from_config,
)
from kubegpu.testing.gfd_labels import gfd_label_gaps

NODE = resolve_fake_spec("4xH100-80GB-MIG").inventory
H100 = "NVIDIA-H100-80GB-HBM3"


def uniform(profile: str = "1g.10gb", starts: tuple[int, ...] = tuple(range(7))) -> NodeInventory:
    cards = "".join(
        f"""
  - index: {i}
    uuid: GPU-00000000-0000-0000-0000-00000000000{i}
    product_name: NVIDIA H100 80GB HBM3
    memory_total_mib: 81559
    compute_capability: "9.0"
    pci_bus_id: "00000000:0{i}:00.0"
    mig_enabled: true
    mig_instances: [{", ".join(f"{{profile: {profile}, start: {s}}}" for s in starts)}]"""
        for i in range(2)
    )
    spec = 'driver_version: "550.90.07"\ncuda_driver_version: "12.4"\ngpus:' + cards
    return parse_fake_spec(spec, name="t", source="t.yaml").inventory


def labels_for(inventory: NodeInventory, strategy: str, **overrides: object) -> dict[str, str]:
    config = load_config(None, {"flags.migStrategy": strategy, **overrides})
    return compute_labels(inventory, sharing=sharing_from_config(config), now=1_700_000_000)


def mig_keys(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig")}


def test_none_writes_no_mig_label_but_mig_capable() -> None:
    labels = labels_for(NODE, "none")
    assert mig_keys(labels) == {"nvidia.com/mig.capable": "true"}
    assert labels[COUNT] == "4"


def test_mixed_writes_each_profiles_labels_under_its_resource_name() -> None:
    labels = labels_for(NODE, "mixed")
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    three = {
        k.removeprefix("nvidia.com/mig-3g.40gb."): v for k, v in labels.items() if "3g.40gb" in k
    }
    assert three == {
        "count": "3",
        "replicas": "1",
        "sharing-strategy": "none",
        "product": f"{H100}-MIG-3g.40gb",
        "memory": "40448",
        "multiprocessors": "60",
        "slices.gi": "3",
        "slices.ci": "3",
        "engines.copy": "3",
        "engines.decoder": "3",
        "engines.encoder": "0",
        "engines.jpeg": "3",
        "engines.ofa": "0",
    }
    assert labels["nvidia.com/mig-1g.10gb.count"] == "8"
    assert labels["nvidia.com/mig-2g.20gb.count"] == "1"
    # A card outside MIG mode: the cards keep their own labels, with the node's sharing.
    assert (labels[COUNT], labels[PRODUCT], labels[MEMORY]) == ("4", H100, "81559")
    assert gfd_label_gaps(labels, "mixed") == {}


def test_a_time_sliced_profile_is_labelled_shared() -> None:
    labels = labels_for(
        NODE,
        "mixed",
        **{"sharing.timeSlicing.resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 4}]},
    )
    assert labels["nvidia.com/mig-1g.10gb.replicas"] == "4"
    assert labels["nvidia.com/mig-1g.10gb.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/mig-1g.10gb.product"] == f"{H100}-MIG-1g.10gb-SHARED"
    assert labels["nvidia.com/mig-3g.40gb.replicas"] == "1"


def test_single_writes_the_mig_devices_under_nvidia_com_gpu() -> None:
    labels = labels_for(uniform(), "single")
    assert {k: labels[k] for k in (COUNT, PRODUCT, MEMORY, REPLICAS, SHARING_STRATEGY)} == {
        COUNT: "14",
        PRODUCT: f"{H100}-MIG-1g.10gb",
        MEMORY: "9984",
        REPLICAS: "1",
        SHARING_STRATEGY: "none",
    }
    assert labels["nvidia.com/gpu.multiprocessors"] == "16"
    assert labels["nvidia.com/gpu.slices.gi"] == labels["nvidia.com/gpu.slices.ci"] == "1"
    assert mig_keys(labels) == {
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
    }
    assert gfd_label_gaps(labels, "single") == {}


@pytest.mark.parametrize(
    "inventory",
    [
        pytest.param(NODE, id="mixed-profiles-and-a-card-outside-mig-mode"),
        pytest.param(uniform("3g.40gb", (0, 4)), id="valid"),
    ],
)
def test_single_on_a_node_that_is_not_uniform_writes_gfds_invalid_labels(
    inventory: NodeInventory,
) -> None:
    gpus = list(inventory.gpus)
    if len(gpus) == 2:  # make the valid node invalid: one card's GPU instances gone
        gpus[1] = dataclasses.replace(gpus[1], mig_devices=())
    labels = labels_for(dataclasses.replace(inventory, gpus=tuple(gpus)), "single")
    assert {k: labels[k] for k in (PRODUCT, COUNT, REPLICAS, SHARING_STRATEGY, MEMORY)} == {
        PRODUCT: f"{H100}-MIG-INVALID",
        COUNT: "0",
        REPLICAS: "0",
        SHARING_STRATEGY: "",
        MEMORY: "0",
    }
    assert labels["nvidia.com/mig.strategy"] == "single"


def test_a_node_all_in_mig_mode_labels_its_cards_without_sharing_under_mixed() -> None:
    labels = labels_for(
        uniform(),
        "mixed",
        **{"sharing.timeSlicing.resources": [{"name": "nvidia.com/gpu", "replicas": 4}]},
    )
    assert (labels[PRODUCT], labels[REPLICAS], labels[SHARING_STRATEGY]) == (H100, "0", "none")
    assert labels["nvidia.com/mig-1g.10gb.count"] == "14"


def test_single_without_a_card_in_mig_mode_only_names_the_strategy() -> None:
    a100 = resolve_fake_spec("8xA100-80GB-NVLink").inventory
    plain = compute_labels(a100, sharing=SharingSummary(), now=1_700_000_000)
    labels = labels_for(a100, "single")
    assert labels == {**plain, "nvidia.com/mig.strategy": "single"}


def test_the_labels_command_reads_the_strategy_from_the_config_or_its_flag(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kubegpu.cli.main import cli

    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: mixed\n")
    runner = CliRunner()
    args = ["labels", "--backend=fake", "--fake-gpus=4xH100-80GB-MIG", "--once", "--no-timestamp"]
    out = runner.invoke(cli, [*args, f"--config={config}"])
    assert out.exit_code == 0, out.output
    assert "nvidia.com/mig-3g.40gb.count=3" in out.output
    out = runner.invoke(cli, [*args, f"--config={config}", "--mig-strategy=none"])
    assert "nvidia.com/mig.strategy" not in out.output
