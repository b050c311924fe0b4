"""The NVML backend against a scripted ``pynvml``: what it reads, tolerates, translates, watches."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml as real
import pytest

from kubegpu.core.backend import InventoryError
from kubegpu.core.gpu import GpuUuid, PcieLink
from kubegpu.core.health import HealthCheckPolicy, HealthEvent, HealthEventKind
from kubegpu.inventory.health import HealthMonitor
from kubegpu.inventory.nvml import NvmlBackend, format_cuda_version, normalise_bus_id
from tests.inventory.contract import check_backend
from tests.inventory.scripted_nvml import DBE, SBE, XID, ScriptedGpu, ScriptedNvml

GPU = real.NVML_NVLINK_DEVICE_TYPE_GPU
SWITCH = real.NVML_NVLINK_DEVICE_TYPE_SWITCH
UUIDS = [f"GPU-{i}1b2c3d4-0000-4000-8000-00000000000{i}" for i in range(4)]
BUSES = ["00000000:07:00.0", "00000000:0F:00.0", "00000000:87:00.0", "00000000:90:00.0"]
WAIT_S = 5.0


def four_gpus(**overrides: Any) -> list[ScriptedGpu]:
    gpus = []
    for i in range(4):
        fields: dict[str, Any] = {
            "uuid": UUIDS[i],
            "bus_id": BUSES[i],
            "minor": i,
            "numa_node": i // 2,
        }
        fields.update(overrides)
        gpus.append(ScriptedGpu(**fields))
    return gpus


@pytest.fixture
def nvml() -> ScriptedNvml:
    gpus = four_gpus()
    # 0-1 and 2-3 joined by 2 lanes each, one link of GPU 0 down.
    gpus[0].nvlinks = [(BUSES[1], GPU, True), (BUSES[1], GPU, True), (BUSES[2], GPU, False)]
    gpus[1].nvlinks = [(BUSES[0], GPU, True), (BUSES[0], GPU, True)]
    gpus[2].nvlinks = [(BUSES[3], GPU, True), (BUSES[3], GPU, True), (BUSES[0], GPU, False)]
    gpus[3].nvlinks = [(BUSES[2], GPU, True), (BUSES[2], GPU, True)]
    return ScriptedNvml(
        gpus,
        topology={(0, 1): real.NVML_TOPOLOGY_SINGLE, (2, 3): real.NVML_TOPOLOGY_MULTIPLE},
        default_topology=real.NVML_TOPOLOGY_SYSTEM,
    )


@pytest.fixture
def backend(nvml: ScriptedNvml) -> Iterator[NvmlBackend]:
    nvml_backend = NvmlBackend(nvml)
    yield nvml_backend
    nvml_backend.close()


def test_nvml_backend_meets_the_backend_contract(backend: NvmlBackend) -> None:
    check_backend(backend)


def test_snapshot_reads_every_field(backend: NvmlBackend) -> None:
    inventory = backend.snapshot()
    gpu = inventory.by_index(2)
    assert gpu.uuid == UUIDS[2]
    assert gpu.product_name == "NVIDIA A100-SXM4-80GB"
    assert gpu.memory_total_mib == 81920
    assert gpu.pci_bus_id == "00000000:87:00.0"
    assert gpu.minor_number == 2
    assert gpu.device_node == "/dev/nvidia2"
    assert gpu.compute_capability == (8, 0)
    assert gpu.numa_node == 1
    assert gpu.mig_enabled is False
    assert inventory.driver_version == "535.161.08"
    assert inventory.cuda_driver_version == "12.2"


def test_nvlink_lanes_are_counted_per_peer_and_inactive_links_skipped(
    backend: NvmlBackend,
) -> None:
    inventory = backend.snapshot()
    lanes = {
        (a.index, b.index): inventory.link(a.uuid, b.uuid).nvlinks  # type: ignore[union-attr]
        for a, b in itertools.combinations(inventory, 2)
    }
    assert lanes == {(0, 1): 2, (0, 2): 0, (0, 3): 0, (1, 2): 0, (1, 3): 0, (2, 3): 2}


@pytest.mark.parametrize(
    ("nvml_level", "pcie"),
    [
        (real.NVML_TOPOLOGY_INTERNAL, PcieLink.BOARD),
        (real.NVML_TOPOLOGY_SINGLE, PcieLink.PIX),
        (real.NVML_TOPOLOGY_MULTIPLE, PcieLink.PXB),
        (real.NVML_TOPOLOGY_HOSTBRIDGE, PcieLink.PHB),
        (real.NVML_TOPOLOGY_NODE, PcieLink.NODE),
        (real.NVML_TOPOLOGY_SYSTEM, PcieLink.SYS),
    ],
)
def test_topology_levels_map_to_pcie_links(nvml_level: int, pcie: PcieLink) -> None:
    nvml = ScriptedNvml(four_gpus()[:2], default_topology=nvml_level)
    backend = NvmlBackend(nvml)
    inventory = backend.snapshot()
    backend.close()
    assert inventory.link(GpuUuid(UUIDS[0]), GpuUuid(UUIDS[1])) == _link(pcie, 0)


def _link(pcie: PcieLink, nvlinks: int) -> object:
    from kubegpu.core.gpu import GpuLink

    return GpuLink(pcie=pcie, nvlinks=nvlinks)


def test_gpus_behind_nvswitches_are_linked_pairwise() -> None:
    gpus = four_gpus()
    switch_bus = "00000000:C4:00.0"
    for gpu in gpus:
        gpu.nvlinks = [(switch_bus, SWITCH, True)] * 12
    gpus[3].nvlinks[11] = (switch_bus, SWITCH, False)
    backend = NvmlBackend(ScriptedNvml(gpus))
    inventory = backend.snapshot()
    backend.close()
    lanes = {
        (a.index, b.index): inventory.link(a.uuid, b.uuid).nvlinks  # type: ignore[union-attr]
        for a, b in itertools.combinations(inventory, 2)
    }
    assert lanes == {(0, 1): 12, (0, 2): 12, (1, 2): 12, (0, 3): 11, (1, 3): 11, (2, 3): 11}


def test_unsupported_queries_become_none(tmp_path: Path) -> None:
    gpus = four_gpus(compute_capability=None, numa_node=None, mig_mode=None)
    gpus[0].unsupported = {"nvmlDeviceGetTopologyCommonAncestor"}
    nvml = ScriptedNvml(gpus[:2])
    nvml.missing = {"nvmlSystemGetCudaDriverVersion_v2"}  # bindings without the call
    backend = NvmlBackend(nvml, sysfs_root=tmp_path)
    inventory = backend.snapshot()
    backend.close()
    gpu = inventory.by_index(0)
    assert (gpu.compute_capability, gpu.numa_node, gpu.mig_enabled) == (None, None, None)
    assert inventory.cuda_driver_version is None
    assert inventory.link(GpuUuid(UUIDS[0]), GpuUuid(UUIDS[1])) is None


def test_numa_node_falls_back_to_sysfs(tmp_path: Path) -> None:
    for bus, node in (("0000:07:00.0", "1\n"), ("0000:0f:00.0", "-1\n")):
        folder = tmp_path / "bus/pci/devices" / bus
        folder.mkdir(parents=True)
        (folder / "numa_node").write_text(node)
    backend = NvmlBackend(ScriptedNvml(four_gpus(numa_node=None)[:2]), sysfs_root=tmp_path)
    inventory = backend.snapshot()
    backend.close()
    assert [gpu.numa_node for gpu in inventory] == [1, None]


def test_brand_and_architecture_are_named_as_nvidias_go_nvlib_names_them() -> None:
    gpus = four_gpus()[:3]
    gpus[1].architecture = real.NVML_DEVICE_ARCH_ADA
    gpus[1].brand = real.NVML_BRAND_GEFORCE_RTX
    # Unsupported by the driver: the architecture comes from the compute capability (8.0).
    gpus[2].architecture = gpus[2].brand = None
    backend = NvmlBackend(ScriptedNvml(gpus))
    inventory = backend.snapshot()
    backend.close()
    assert [(gpu.brand, gpu.architecture) for gpu in inventory] == [
        ("Nvidia", "Ampere"),
        ("GeForceRTX", "Ada Lovelace"),
        (None, "Ampere"),
    ]


def test_pcie_root_is_read_from_the_sysfs_link(tmp_path: Path) -> None:
    devices = tmp_path / "devices/pci0000:00/0000:00:01.0/0000:07:00.0"
    devices.mkdir(parents=True)
    links = tmp_path / "bus/pci/devices"
    links.mkdir(parents=True)
    (links / "0000:07:00.0").symlink_to("../../../devices/pci0000:00/0000:00:01.0/0000:07:00.0")
    backend = NvmlBackend(ScriptedNvml(four_gpus()[:2]), sysfs_root=tmp_path)
    inventory = backend.snapshot()
    backend.close()
    # The second card has no sysfs entry here: no root rather than a guess.
    assert [gpu.pcie_root for gpu in inventory] == ["pci0000:00", None]


def test_mig_mode_is_reported() -> None:
    backend = NvmlBackend(ScriptedNvml(four_gpus(mig_mode=real.NVML_DEVICE_MIG_ENABLE)[:1]))
    assert backend.snapshot().gpus[0].mig_enabled is True
    backend.close()


def test_nvml_is_initialised_lazily_and_shut_down_on_close(nvml: ScriptedNvml) -> None:
    backend = NvmlBackend(nvml)
    assert nvml.calls == []
    backend.snapshot()
    backend.snapshot()
    assert nvml.calls.count("nvmlInit") == 1
    backend.close()
    backend.close()
    assert (nvml.initialised, nvml.shutdowns) == (0, 1)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        pytest.param(
            real.NVML_ERROR_LIBRARY_NOT_FOUND,
            "NVML library not found while initialising NVML — is the NVIDIA driver installed and "
            "the driver libraries mounted into this container?",
            id="library not found",
        ),
        pytest.param(
            real.NVML_ERROR_DRIVER_NOT_LOADED, "lsmod | grep nvidia", id="driver not loaded"
        ),
        pytest.param(real.NVML_ERROR_NO_PERMISSION, "privileged", id="no permission"),
        pytest.param(
            real.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "upgraded without a reboot", id="mismatch"
        ),
        pytest.param(real.NVML_ERROR_UNKNOWN, "dmesg", id="unknown"),
        pytest.param(real.NVML_ERROR_IN_USE, "NVML error while initialising NVML", id="other"),
    ],
)
def test_init_errors_become_inventory_errors_with_hints(code: int, expected: str) -> None:
    backend = NvmlBackend(ScriptedNvml([], init_error=code))
    with pytest.raises(InventoryError) as info:
        backend.snapshot()
    assert expected in str(info.value)
    assert info.value.hint


def test_a_gpu_lost_after_a_snapshot_keeps_its_record(nvml: ScriptedNvml) -> None:
    backend = NvmlBackend(nvml)
    first = backend.snapshot()
    nvml.set_lost(1, True)
    second = backend.snapshot()
    assert second.gpus == first.gpus
    assert second.links == first.links
    backend.close()


def test_a_gpu_lost_before_any_snapshot_fails_with_a_hint(nvml: ScriptedNvml) -> None:
    nvml.set_lost(3, True)
    backend = NvmlBackend(nvml)
    with pytest.raises(InventoryError, match=r"GPU is lost while reading GPU 3 — .*dmesg"):
        backend.snapshot()
    backend.close()


def test_bus_ids_and_cuda_versions_are_normalised() -> None:
    assert normalise_bus_id(b"0000:0f:00.0") == "00000000:0F:00.0"
    assert normalise_bus_id("00000000:87:00.0") == "00000000:87:00.0"
    assert format_cuda_version(12040) == "12.4"
    assert format_cuda_version(11080) == "11.8"


# -- health ------------------------------------------------------------------------------------


def test_watcher_reports_xids_and_double_bit_ecc_but_not_single_bit(
    backend: NvmlBackend, nvml: ScriptedNvml
) -> None:
    uuid = GpuUuid(UUIDS[1])
    watcher = backend.watch_health(uuid)
    nvml.emit(1, XID, 79)
    assert watcher.wait(WAIT_S) == [HealthEvent(HealthEventKind.XID, uuid, xid=79)]
    nvml.emit(1, SBE)
    assert watcher.wait(WAIT_S) == []
    nvml.emit(1, DBE)
    assert watcher.wait(WAIT_S) == [
        HealthEvent(HealthEventKind.XID, uuid, xid=48, detail="double-bit ECC event")
    ]
    nvml.emit(1, XID, 94, gi=1, ci=0)
    assert watcher.wait(WAIT_S)[0].detail == "MIG GPU instance 1, compute instance 0"
    watcher.close()
    assert nvml.live_event_sets == 0


def test_watcher_times_out_quietly(backend: NvmlBackend, nvml: ScriptedNvml) -> None:
    watcher = backend.watch_health(GpuUuid(UUIDS[0]))
    nvml.emit(2, XID, 79)  # another GPU's event
    assert watcher.wait(0.05) == []
    watcher.close()


def test_watcher_reports_a_lost_gpu_once_and_its_recovery(
    backend: NvmlBackend, nvml: ScriptedNvml
) -> None:
    uuid = GpuUuid(UUIDS[0])
    watcher = backend.watch_health(uuid)
    nvml.set_lost(0, True)
    # The lost check runs after every wait, so a short wait is enough to see it.
    events = watcher.wait(0.02)
    assert [event.kind for event in events] == [HealthEventKind.LOST]
    assert "GPU is lost" in events[0].detail
    assert watcher.wait(0.01) == []
    nvml.set_lost(0, False)
    assert [event.kind for event in watcher.wait(0.02)] == [HealthEventKind.RECOVERED]
    watcher.close()


def test_a_gpu_without_event_support_is_still_checked_for_loss(nvml: ScriptedNvml) -> None:
    nvml.gpus[2].register_error = real.NVML_ERROR_NOT_SUPPORTED
    backend = NvmlBackend(nvml)
    watcher = backend.watch_health(GpuUuid(UUIDS[2]))
    assert nvml.live_event_sets == 0
    nvml.set_lost(2, True)
    assert [event.kind for event in watcher.wait(0.01)] == [HealthEventKind.LOST]
    watcher.close()
    backend.close()


def test_failing_event_registration_is_an_inventory_error(nvml: ScriptedNvml) -> None:
    nvml.gpus[2].register_error = real.NVML_ERROR_NO_PERMISSION
    backend = NvmlBackend(nvml)
    with pytest.raises(InventoryError, match="registering health events"):
        backend.watch_health(GpuUuid(UUIDS[2]))
    assert nvml.live_event_sets == 0
    with pytest.raises(InventoryError, match="opening GPU GPU-nope"):
        backend.watch_health(GpuUuid("GPU-nope"))
    backend.close()


def test_closing_a_watcher_while_it_waits_frees_the_event_set_after_the_wait(
    backend: NvmlBackend, nvml: ScriptedNvml
) -> None:
    watcher = backend.watch_health(GpuUuid(UUIDS[0]))
    started = threading.Event()
    results: list[list[HealthEvent]] = []

    def wait() -> None:
        started.set()
        results.append(watcher.wait(0.3))

    thread = threading.Thread(target=wait)
    thread.start()
    assert started.wait(WAIT_S)
    watcher.close()  # the scripted module asserts if the set is freed under the waiter
    thread.join(WAIT_S)
    assert results == [[]]
    assert nvml.live_event_sets == 0
    assert watcher.wait(0.01) == []


def test_health_monitor_marks_an_nvml_gpu_unhealthy_on_xid_79(
    backend: NvmlBackend, nvml: ScriptedNvml
) -> None:
    changes: list[tuple[GpuUuid, bool, str]] = []
    changed = threading.Event()

    def on_change(uuid: GpuUuid, healthy: bool, reason: str) -> None:
        changes.append((uuid, healthy, reason))
        changed.set()

    monitor = HealthMonitor(
        backend, backend.snapshot(), HealthCheckPolicy(), on_change, poll_timeout_s=0.02
    )
    monitor.start()
    try:
        nvml.emit(3, XID, 13)
        nvml.emit(3, XID, 79)
        assert changed.wait(WAIT_S)
    finally:
        monitor.stop()
    assert changes == [(GpuUuid(UUIDS[3]), False, "Xid 79 (GPU has fallen off the bus)")]
    assert nvml.live_event_sets == 0
