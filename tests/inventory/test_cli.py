"""``kubegpu discover`` and ``kubegpu fake-gpu`` run as real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu.core.health import HealthEvent, HealthEventKind
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.inventory.spec import resolve_fake_spec
from tests.inventory.contract import nvml_present

PRESETS = ["4xT4", "2xV100-2xT4", "8xA100-80GB-NVLink"]


def kubegpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("preset", PRESETS)
def test_discover_prints_every_gpu_of_a_preset_as_json(preset: str) -> None:
    result = kubegpu("discover", "--backend", "fake", "--fake-gpus", preset, "-o", "json")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    inventory = resolve_fake_spec(preset).inventory
    assert printed["source"] == f"preset:{preset}"
    assert printed["cuda_driver_version"] == inventory.cuda_driver_version
    assert [
        (g["index"], g["uuid"], g["memory_total_mib"], g["pci_bus_id"], g["numa_node"])
        for g in printed["gpus"]
    ] == [(g.index, g.uuid, g.memory_total_mib, g.pci_bus_id, g.numa_node) for g in inventory]
    assert len(printed["links"]) == len(inventory.links)
    for entry in printed["links"]:
        link = inventory.link(*entry["uuids"])
        assert link is not None
        assert (entry["pcie"], entry["nvlinks"]) == (link.pcie.name, link.nvlinks)


@pytest.mark.parametrize("preset", PRESETS)
def test_discover_prints_a_table_and_topology_matrix(preset: str) -> None:
    result = kubegpu("discover", "--backend", "fake", "--fake-gpus", preset)
    assert result.returncode == 0, result.stderr
    inventory = resolve_fake_spec(preset).inventory
    lines = result.stdout.splitlines()
    for gpu in inventory:
        assert any(gpu.uuid in line and gpu.product_name in line for line in lines)
    matrix = lines[lines.index("Topology:") + 2 : lines.index("Topology:") + 2 + len(inventory)]
    for gpu, line in zip(inventory, matrix, strict=True):
        cells = line.split()
        assert cells[0] == f"GPU{gpu.index}"
        assert cells[1 + gpu.index] == "X"
        for other in inventory:
            link = inventory.link(gpu.uuid, other.uuid)
            if link is not None:
                expected = f"NV{link.nvlinks}" if link.nvlinks else link.pcie.name
                assert cells[1 + other.index] == expected


def test_discover_rejects_a_bad_spec_file_with_exit_code_2(tmp_path: Path) -> None:
    spec = tmp_path / "broken.yaml"
    spec.write_text(
        "gpus:\n  - {index: 0, uuid: GPU-11111111-2222-3333-4444-555555555555, product_name: X,\n"
        '     memory_total_mib: many, pci_bus_id: "0000:01:00.0"}\n'
    )
    result = kubegpu("discover", "--backend", "fake", "--fake-gpus", str(spec))
    assert result.returncode == 2
    assert result.stdout == ""
    assert str(spec) in result.stderr
    assert "gpus[0].memory_total_mib" in result.stderr
    assert "'many'" in result.stderr


def test_discover_needs_fake_gpus_for_the_fake_backend() -> None:
    result = kubegpu("discover", "--backend", "fake")
    assert result.returncode == 2
    assert "--fake-gpus" in result.stderr


@pytest.mark.skipif(nvml_present(), reason="this node has NVML; auto would find it")
def test_discover_auto_without_nvml_fails_and_points_at_the_fake_backend() -> None:
    result = kubegpu("discover")
    assert result.returncode == 1
    assert "no NVIDIA GPU or NVML found" in result.stderr
    assert "--backend fake" in result.stderr
    assert result.stdout == ""


@pytest.fixture
def fake_node(short_tmp: Path) -> Iterator[FakeGpuBackend]:
    backend = FakeGpuBackend.from_spec("4xT4", control_socket=short_tmp / "control.sock")
    yield backend
    backend.close()


def test_fake_gpu_injects_an_xid_into_a_running_backend(fake_node: FakeGpuBackend) -> None:
    gpu = fake_node.snapshot().gpus[1]
    watcher = fake_node.watch_health(gpu.uuid)
    control = str(fake_node.control_socket)
    result = kubegpu("fake-gpu", "xid", "--control", control, "--gpu", "1", "--xid", "79")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"ok": True, "gpu": {"index": 1, "uuid": gpu.uuid}}
    assert watcher.wait(5.0) == [HealthEvent(HealthEventKind.XID, gpu.uuid, xid=79)]
    watcher.close()


def test_fake_gpu_loses_and_restores_by_uuid_and_shows_status(fake_node: FakeGpuBackend) -> None:
    uuid = fake_node.snapshot().gpus[3].uuid
    control = str(fake_node.control_socket)
    assert kubegpu("fake-gpu", "lose", "--control", control, "--gpu", uuid).returncode == 0
    assert fake_node.is_lost(3)
    status = json.loads(kubegpu("fake-gpu", "status", "--control", control).stdout)
    assert [gpu["lost"] for gpu in status["gpus"]] == [False, False, False, True]
    assert kubegpu("fake-gpu", "restore", "--control", control, "--gpu", uuid).returncode == 0
    assert not fake_node.is_lost(3)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        pytest.param(["xid", "--gpu", "0"], 2, "needs --xid", id="xid without code"),
        pytest.param(["lose"], 2, "needs --gpu", id="lose without gpu"),
        pytest.param(["lose", "--gpu", "9"], 1, "no GPU '9'", id="unknown gpu"),
    ],
)
def test_fake_gpu_reports_bad_commands(
    fake_node: FakeGpuBackend, args: list[str], code: int, message: str
) -> None:
    result = kubegpu("fake-gpu", *args, "--control", str(fake_node.control_socket))
    assert result.returncode == code
    assert message in result.stderr


def test_fake_gpu_without_a_backend_fails_with_exit_code_1(short_tmp: Path) -> None:
    result = kubegpu("fake-gpu", "status", "--control", str(short_tmp / "none.sock"))
    assert result.returncode == 1
    assert "cannot reach the fake GPU control socket" in result.stderr
