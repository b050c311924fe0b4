"""Fake node specs: the shipped presets describe the nodes they claim, bad files are named."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from kubegpu.core.gpu import NodeInventory, PcieLink
from kubegpu.inventory.spec import FakeSpecError, list_presets, parse_fake_spec, resolve_fake_spec
from tests.inventory.contract import check_inventory

PRESETS = [
    "16xH100-80GB",
    "2xV100-2xT4",
    "4xH100-80GB-MIG",
    "4xT4",
    "8xA100-80GB-NVLink",
    "8xV100-32GB-HybridCubeMesh",
]


def nvlinks(inventory: NodeInventory, a: int, b: int) -> int:
    link = inventory.link(inventory.by_index(a).uuid, inventory.by_index(b).uuid)
    assert link is not None
    return link.nvlinks


def pcie(inventory: NodeInventory, a: int, b: int) -> PcieLink:
    link = inventory.link(inventory.by_index(a).uuid, inventory.by_index(b).uuid)
    assert link is not None
    return link.pcie


def test_the_shipped_presets_are_listed() -> None:
    assert list_presets() == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_is_a_valid_inventory(name: str) -> None:
    spec = resolve_fake_spec(name)
    check_inventory(spec.inventory)
    assert spec.source == f"preset:{name}"
    assert spec.inventory.driver_version
    assert spec.inventory.cuda_driver_version


def test_the_uuids_of_all_presets_are_distinct() -> None:
    uuids = [gpu.uuid for name in PRESETS for gpu in resolve_fake_spec(name).inventory]
    assert len(set(uuids)) == len(uuids)


def test_the_a100_preset_is_a_dgx_a100_with_nvswitch() -> None:
    inventory = resolve_fake_spec("8xA100-80GB-NVLink").inventory
    assert len(inventory) == 8
    assert {gpu.product_name for gpu in inventory} == {"NVIDIA A100-SXM4-80GB"}
    assert [gpu.minor_number for gpu in inventory] == list(range(8))
    assert [gpu.numa_node for gpu in inventory] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(nvlinks(inventory, a, b) == 12 for a, b in itertools.combinations(range(8), 2))
    assert pcie(inventory, 0, 1) is PcieLink.PXB
    assert pcie(inventory, 0, 2) is PcieLink.NODE
    assert pcie(inventory, 0, 4) is PcieLink.SYS


def test_the_t4_preset_has_two_pix_pairs_and_no_nvlink() -> None:
    inventory = resolve_fake_spec("4xT4").inventory
    assert all(nvlinks(inventory, a, b) == 0 for a, b in itertools.combinations(range(4), 2))
    assert pcie(inventory, 0, 1) is PcieLink.PIX
    assert pcie(inventory, 2, 3) is PcieLink.PIX
    assert {pcie(inventory, a, b) for a in (0, 1) for b in (2, 3)} == {PcieLink.NODE}


def test_the_mixed_preset_nvlinks_only_the_v100_pair() -> None:
    inventory = resolve_fake_spec("2xV100-2xT4").inventory
    models = [gpu.product_name for gpu in inventory]
    assert models[:2] == ["Tesla V100-SXM2-16GB"] * 2
    assert models[2:] == ["Tesla T4"] * 2
    linked = {(a, b) for a, b in itertools.combinations(range(4), 2) if nvlinks(inventory, a, b)}
    assert linked == {(0, 1)}


def test_the_cube_mesh_preset_is_not_uniform() -> None:
    inventory = resolve_fake_spec("8xV100-32GB-HybridCubeMesh").inventory
    counts = {(a, b): nvlinks(inventory, a, b) for a, b in itertools.combinations(range(8), 2)}
    assert set(counts.values()) == {0, 1, 2}
    assert sum(1 for lanes in counts.values() if lanes == 0) == 12
    # A V100 has 6 NVLinks, each joining it to exactly one peer.
    for gpu in range(8):
        assert sum(lanes for pair, lanes in counts.items() if gpu in pair) == 6


def test_the_16_gpu_preset_links_every_pair() -> None:
    inventory = resolve_fake_spec("16xH100-80GB").inventory
    assert len(inventory) == 16
    assert {link.nvlinks for link in inventory.links.values()} == {18}


def test_a_spec_file_is_loaded_by_path(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(
        """
cuda_driver_version: 12.4
gpus:
  - {index: 1, uuid: GPU-11111111-2222-3333-4444-555555555555, product_name: X,
     memory_total_mib: 1024, pci_bus_id: "0000:02:00.0", compute_capability: [8, 6]}
  - {index: 0, uuid: GPU-11111111-2222-3333-4444-000000000000, product_name: X,
     memory_total_mib: 1024, pci_bus_id: "0000:01:00.0", numa_node: 0}
topology:
  default: {pcie: PHB}
"""
    )
    spec = resolve_fake_spec(path)
    inventory = spec.inventory
    assert spec.name == "two"
    assert [gpu.index for gpu in inventory] == [0, 1]
    assert inventory.by_index(1).minor_number == 1
    assert inventory.by_index(1).compute_capability == (8, 6)
    assert inventory.cuda_driver_version == "12.4"
    assert pcie(inventory, 0, 1) is PcieLink.PHB


GOOD_GPU = (
    "{index: 0, uuid: GPU-11111111-2222-3333-4444-555555555555, product_name: X, "
    'memory_total_mib: 1024, pci_bus_id: "0000:01:00.0"}'
)
OTHER_GPU = (
    "{index: 1, uuid: GPU-11111111-2222-3333-4444-666666666666, product_name: X, "
    'memory_total_mib: 1024, pci_bus_id: "0000:02:00.0"}'
)

TWO_GPUS = f"gpus: [{GOOD_GPU}, {OTHER_GPU}]\n"


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        pytest.param("gpus: [", "not valid YAML", "", id="broken yaml"),
        pytest.param("[1, 2]", "expected a mapping", "[1, 2]", id="top is a list"),
        pytest.param("driver_version: 1\n", "gpus", "None", id="no gpus"),
        pytest.param(
            f"gpus: [{GOOD_GPU}]\ncolour: red\n", "colour", "'red'", id="unknown top field"
        ),
        pytest.param(
            f"gpus: [{GOOD_GPU[:-1]}, memroy_mib: 3}}]",
            "gpus[0].memroy_mib",
            "3",
            id="unknown gpu field",
        ),
        pytest.param(
            f"gpus: [{GOOD_GPU.replace('1024', '-5')}]",
            "gpus[0].memory_total_mib",
            "-5",
            id="negative memory",
        ),
        pytest.param(
            f"gpus: [{GOOD_GPU.replace('1024', 'lots')}]",
            "gpus[0].memory_total_mib",
            "'lots'",
            id="memory text",
        ),
        pytest.param(
            f"gpus: [{GOOD_GPU.replace('GPU-1111', 'gpu-1111')}]",
            "gpus[0].uuid",
            "gpu-1111",
            id="uuid form",
        ),
        pytest.param(
            f"gpus: [{GOOD_GPU.replace('0000:01:00.0', '1:0')}]",
            "gpus[0].pci_bus_id",
            "'1:0'",
            id="bus id",
        ),
        pytest.param(
            f"gpus: [{GOOD_GPU[:-1]}, compute_capability: eight}}]",
            "gpus[0].compute_capability",
            "'eight'",
            id="compute capability",
        ),
        pytest.param(
            f"gpus: [{GOOD_GPU[:-1]}, pcie_root: '0000:00'}}]",
            "gpus[0].pcie_root",
            "'0000:00'",
            id="pcie root form",
        ),
        pytest.param(
            f"gpus: [{GOOD_GPU[:-1]}, brand: ''}}]",
            "gpus[0].brand",
            "''",
            id="empty brand",
        ),
        pytest.param(
            f"gpus: [{GOOD_GPU}, {GOOD_GPU.replace('555555555555', '777777777777')}]",
            "gpus[1].index",
            "0",
            id="duplicate index",
        ),
        pytest.param(
            TWO_GPUS + "topology: {pairs: [{gpus: [0, 2]}]}\n",
            "topology.pairs[0].gpus",
            "[0, 2]",
            id="pair with unknown gpu",
        ),
        pytest.param(
            TWO_GPUS + "topology: {pairs: [{gpus: [0, 1], pcie: QPI}]}\n",
            "topology.pairs[0].pcie",
            "'QPI'",
            id="bad pcie level",
        ),
        pytest.param(
            TWO_GPUS + "topology: {pairs: [{gpus: [0, 1]}, {gpus: [1, 0]}]}\n",
            "topology.pairs[1].gpus",
            "[1, 0]",
            id="pair twice",
        ),
        pytest.param(
            f"gpus: [{GOOD_GPU}]\ntopology: {{default: {{nvlink: 2}}}}\n",
            "topology.default.nvlink",
            "2",
            id="unknown link field",
        ),
    ],
)
def test_a_bad_spec_names_the_file_the_field_and_the_value(
    tmp_path: Path, text: str, field: str, value: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(FakeSpecError) as info:
        resolve_fake_spec(path)
    message = str(info.value)
    assert str(path) in message
    assert field in message
    assert value in message


def test_brand_architecture_and_pcie_root_are_read_and_the_architecture_defaults(
    tmp_path: Path,
) -> None:
    path = tmp_path / "named.yaml"
    path.write_text(
        """
gpus:
  - {index: 0, uuid: GPU-11111111-2222-3333-4444-000000000000, product_name: X,
     memory_total_mib: 1024, pci_bus_id: "0000:01:00.0", compute_capability: "9.0",
     brand: Nvidia, pcie_root: "pci0000:64"}
  - {index: 1, uuid: GPU-11111111-2222-3333-4444-111111111111, product_name: X,
     memory_total_mib: 1024, pci_bus_id: "0000:02:00.0", compute_capability: "8.9"}
  - {index: 2, uuid: GPU-11111111-2222-3333-4444-222222222222, product_name: X,
     memory_total_mib: 1024, pci_bus_id: "0000:03:00.0", architecture: Rubin}
"""
    )
    inventory = resolve_fake_spec(path).inventory
    named = [(g.brand, g.architecture, g.pcie_root) for g in inventory]
    assert named == [
        ("Nvidia", "Hopper", "pci0000:64"),
        (None, "Ada Lovelace", None),
        (None, "Rubin", None),
    ]


def test_an_unknown_name_lists_the_presets() -> None:
    with pytest.raises(FakeSpecError, match="8xA100-80GB-NVLink"):
        resolve_fake_spec("9xB200")


def test_a_gpu_index_must_not_be_a_boolean() -> None:
    with pytest.raises(FakeSpecError, match=r"gpus\[0\]\.index"):
        parse_fake_spec(
            f"gpus: [{GOOD_GPU.replace('index: 0', 'index: true')}]", name="t", source="t"
        )
