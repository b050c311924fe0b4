"""MIG devices in the inventory: the fake spec's instances, run-time changes over the fake
control socket (kept across restarts), and what the NVML backend reads and does."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml as real
import pytest

from kubegpu.core.backend import InventoryError
from kubegpu.core.gpu import GpuUuid, mig_cap_minors
from kubegpu.core.health import HealthEvent, HealthEventKind
from kubegpu.core.mig import profile
from kubegpu.inventory.fake import FakeGpuBackend, send_fake_gpu_command
from kubegpu.inventory.nvml import NvmlBackend
from kubegpu.inventory.select import mig_state_beside
from kubegpu.inventory.spec import FakeSpecError, parse_fake_spec
from tests.inventory.scripted_nvml import XID, ScriptedGpu, ScriptedMig, ScriptedNvml

H100 = "NVIDIA H100 80GB HBM3"


def h100_spec(instances: str = "", *, mig: bool = True, gpus: int = 2) -> str:
    cards = []
    for i in range(gpus):
        cards.append(
            f"""
  - index: {i}
    uuid: GPU-00000000-0000-0000-0000-00000000000{i}
    product_name: {H100}
    memory_total_mib: 81559
    pci_bus_id: "00000000:0{i}:00.0"
    minor_number: {i + 4}
    mig_enabled: {"true" if mig else "false"}
"""
            + (instances if i == 0 else "")
        )
    return "gpus:" + "".join(cards)


LAYOUT = """    mig_instances:
      - {profile: 3g.40gb, start: 4}
      - {profile: 2g.20gb, start: 0}
      - {profile: 1g.10gb, start: 2}
"""


def test_a_spec_lists_a_cards_gpu_instances_as_nvml_reports_them() -> None:
    inventory = parse_fake_spec(h100_spec(LAYOUT), name="t", source="t.yaml").inventory
    card = inventory.by_index(0)
    assert [m.profile for m in card.mig_devices] == ["2g.20gb", "1g.10gb", "3g.40gb"]
    assert [m.index for m in card.mig_devices] == [0, 1, 2]  # in memory-slice order
    three = card.mig_devices[2]
    # The spec's order gives the GPU-instance ids: 3g.40gb was listed first.
    assert (three.gpu_instance_id, three.compute_instance_id, three.start) == (1, 0, 4)
    assert three.memory_total_mib == profile(H100, "3g.40gb").memory_mib == 40448
    assert three.multiprocessors == 60 and three.profile_id == 9
    assert three.uuid.startswith("MIG-") and three.parent_uuid == card.uuid
    gi_minor, ci_minor = mig_cap_minors(4, 1, 0)
    assert three.device_nodes == (
        "/dev/nvidia4",
        f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
        f"/dev/nvidia-caps/nvidia-cap{ci_minor}",
    )
    assert three.address == "0:2"
    assert inventory.mig_devices == card.mig_devices  # card 1 has none
    # Stable: the same spec gives the same UUIDs.
    again = parse_fake_spec(h100_spec(LAYOUT), name="t", source="t.yaml").inventory
    assert [m.uuid for m in again.mig_devices] == [m.uuid for m in inventory.mig_devices]
    assert len({m.uuid for m in inventory.mig_devices}) == 3


def test_the_driver_numbers_capability_minors_nine_per_gpu_instance() -> None:
    # /proc/driver/nvidia-caps/mig-minors: config 1, monitor 2, gpu0/gi0/access 3,
    # gpu0/gi0/ci0..7 4..11, gpu0/gi1/access 12, …, 135 entries per card.
    assert mig_cap_minors(0, 0, 0) == (3, 4)
    assert mig_cap_minors(0, 1, 0) == (12, 13)
    assert mig_cap_minors(1, 0, 2) == (138, 141)


@pytest.mark.parametrize(
    ("instances", "mig", "field", "why"),
    [
        (
            "    mig_instances:\n      - {profile: 1g.10gb, start: 0}\n",
            False,
            "gpus[0].mig_instances",
            "need mig_enabled: true",
        ),
        (
            "    mig_instances:\n      - {profile: 1g.5gb, start: 0}\n",
            True,
            "gpus[0].mig_instances[0].profile",
            "has no MIG profile '1g.5gb'",
        ),
        (
            "    mig_instances:\n      - {profile: 3g.40gb, start: 2}\n",
            True,
            "gpus[0].mig_instances[0]",
            "cannot start at memory slice 2",
        ),
        (
            "    mig_instances:\n      - {profile: 4g.40gb, start: 0}\n"
            "      - {profile: 3g.40gb, start: 0}\n",
            True,
            "gpus[0].mig_instances[1]",
            "overlaps memory slice 0",
        ),
        (
            "    mig_instances:\n      - {profile: 1g.10gb, begin: 0}\n",
            True,
            "gpus[0].mig_instances[0].begin",
            "unknown field",
        ),
        ("    mig_instances: 3g.40gb\n", True, "gpus[0].mig_instances", "expected a list"),
    ],
)
def test_a_spec_with_instances_the_card_cannot_hold_is_refused_naming_the_field(
    instances: str, mig: bool, field: str, why: str
) -> None:
    with pytest.raises(FakeSpecError) as caught:
        parse_fake_spec(h100_spec(instances, mig=mig), name="t", source="bad.yaml")
    message = str(caught.value)
    assert message.startswith(f"bad.yaml: {field}:"), message
    assert why in message


def test_a_card_without_a_profile_table_cannot_take_instances() -> None:
    spec = h100_spec("    mig_instances:\n      - {profile: 1g.10gb, start: 0}\n").replace(
        H100, "NVIDIA L4"
    )
    with pytest.raises(FakeSpecError, match=r"'NVIDIA L4' has no MIG profiles here"):
        parse_fake_spec(spec, name="t", source="t.yaml")


def write_spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    return path


def test_the_control_socket_changes_mig_like_nvidia_smi_and_a_restart_keeps_it(
    tmp_path: Path,
) -> None:
    spec = write_spec(tmp_path, h100_spec(mig=False))
    control = tmp_path / "fake.sock"
    state = mig_state_beside(control)
    backend = FakeGpuBackend.from_spec(spec, control_socket=control, mig_state=state)
    try:

        def send(op: str, **fields: object) -> dict[str, object]:
            return send_fake_gpu_command(control, op, **fields)

        refused = send("mig-create", gpu=1, profile="3g.40gb")
        assert refused["ok"] is False and "MIG mode is off" in str(refused["error"])
        assert send("mig-mode", gpu=1, enabled=True)["ok"] is True
        first = send("mig-create", gpu=1, profile="3g.40gb")
        assert first["ok"] is True
        assert first["mig"]["start"] == 0  # type: ignore[index]
        second = send("mig-create", gpu=1, profile="3g.40gb")
        assert second["mig"]["start"] == 4  # type: ignore[index]
        # Both 3g take four memory slices each: nothing is left, as on the card.
        full = send("mig-create", gpu=1, profile="1g.10gb")
        assert full["ok"] is False and "insufficient resources" in str(full["error"])
        overlap = send("mig-create", gpu=0, profile="1g.10gb", start=0)
        assert "MIG mode is off" in str(overlap["error"])
        busy = send("mig-mode", gpu=1, enabled=False)
        assert busy["ok"] is False and "destroy them first" in str(busy["error"])
        snapshot = backend.snapshot().by_index(1)
        assert snapshot.mig_enabled is True
        assert [(m.profile, m.start) for m in snapshot.mig_devices] == [
            ("3g.40gb", 0),
            ("3g.40gb", 4),
        ]
        status = send("status")
        assert [m["start"] for m in status["gpus"][1]["mig"]] == [0, 4]  # type: ignore[index]
        kept = snapshot.mig_devices[1]
    finally:
        backend.close()
    assert json.loads(state.read_text())["cards"]

    # A restart reads the state back: the card still holds both instances, same UUIDs.
    backend = FakeGpuBackend.from_spec(spec, control_socket=control, mig_state=state)
    try:
        card = backend.snapshot().by_index(1)
        assert [m.uuid for m in card.mig_devices][1] == kept.uuid
        gone = send_fake_gpu_command(
            control, "mig-destroy", gpu=1, gpu_instance_id=kept.gpu_instance_id
        )
        assert gone["ok"] is True and gone["mig"]["uuid"] == kept.uuid  # type: ignore[index]
        # Created again in the same place, it is a new device with a new UUID.
        again = backend.create_mig_device(GpuUuid(card.uuid), "3g.40gb", 4)
        assert again.start == 4 and again.uuid != kept.uuid
        missing = send_fake_gpu_command(control, "mig-destroy", gpu=1, gpu_instance_id=9)
        assert missing["ok"] is False and "no GPU instance 9" in str(missing["error"])
    finally:
        backend.close()


def test_a_state_file_from_another_spec_is_refused_naming_it(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"version": 1, "cards": {"GPU-nope": {}}}))
    with pytest.raises(InventoryError, match=r"state\.json: cards\.GPU-nope: no such GPU"):
        FakeGpuBackend.from_spec(write_spec(tmp_path, h100_spec()), mig_state=state)


def test_an_xid_naming_a_gpu_instance_reaches_only_that_instance(tmp_path: Path) -> None:
    backend = FakeGpuBackend.from_spec(write_spec(tmp_path, h100_spec(LAYOUT)))
    try:
        card = backend.snapshot().by_index(0)
        watcher = backend.watch_health(card.uuid)
        backend.inject_xid(0, 48, gpu_instance_id=1)
        backend.inject_xid(0, 79)
        scoped, whole = watcher.wait(1.0)
        three, two = card.mig_devices[2], card.mig_devices[0]
        assert scoped.concerns(three.gpu_instance_id, 0)
        assert not scoped.concerns(two.gpu_instance_id, 0)
        assert whole.gpu_instance_id is None and whole.concerns(two.gpu_instance_id, 0)
        with pytest.raises(ValueError, match="no MIG GPU instance 7"):
            backend.inject_xid(0, 48, gpu_instance_id=7)
    finally:
        backend.close()


def test_an_event_naming_a_compute_instance_reaches_only_it() -> None:
    event = HealthEvent(
        HealthEventKind.XID, GpuUuid("GPU-x"), xid=48, gpu_instance_id=2, compute_instance_id=1
    )
    assert event.concerns(2, 1) and not event.concerns(2, 0) and not event.concerns(1, 1)


def scripted_h100(mig: list[ScriptedMig], name: str = H100) -> ScriptedGpu:
    return ScriptedGpu(
        uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000",
        name=name,
        memory_total_bytes=81559 * 1024 * 1024,
        minor=2,
        compute_capability=(9, 0),
        architecture=real.NVML_DEVICE_ARCH_HOPPER,
        mig_mode=real.NVML_DEVICE_MIG_ENABLE,
        mig=mig,
    )


def test_nvml_reads_each_mig_device_with_its_profile_placement_and_cap_nodes(
    tmp_path: Path,
) -> None:
    minors = tmp_path / "mig-minors"
    minors.write_text("config 1\nmonitor 2\ngpu2/gi3/access 300\ngpu2/gi3/ci0/access 301\n")
    gpu = scripted_h100(
        [
            ScriptedMig("MIG-11111111-2222-3333-4444-555555555555", 3, profile(H100, "3g.40gb"), 4),
            ScriptedMig(
                "MIG-aaaaaaaa-2222-3333-4444-555555555555", 9, profile(H100, "1g.10gb+me"), 0
            ),
        ]
    )
    backend = NvmlBackend(ScriptedNvml([gpu]), mig_minors=minors)
    card = backend.snapshot().gpus[0]
    assert card.mig_enabled is True
    first, second = card.mig_devices
    assert (first.uuid, first.profile, first.start, first.memory_slices) == (
        "MIG-11111111-2222-3333-4444-555555555555",
        "3g.40gb",
        4,
        4,
    )
    assert (first.gpu_instance_id, first.compute_slices, first.memory_total_mib) == (3, 3, 40448)
    assert first.device_nodes == (
        "/dev/nvidia2",
        "/dev/nvidia-caps/nvidia-cap300",
        "/dev/nvidia-caps/nvidia-cap301",
    )
    assert second.profile == "1g.10gb+me" and second.index == 1
    assert second.device_nodes == ("/dev/nvidia2",)  # not in the driver's table
    # A card kubegpu has no table for: the name is computed as NVIDIA's go-nvlib does.
    unknown = scripted_h100(
        [ScriptedMig("MIG-bbbbbbbb-2222-3333-4444-555555555555", 1, profile(H100, "2g.20gb"), 0)],
        name="NVIDIA H100 PCIe future",
    )
    named = NvmlBackend(ScriptedNvml([unknown]), mig_minors=minors).snapshot()
    assert named.gpus[0].mig_devices[0].profile == "2g.20gb"


def test_nvml_creates_and_destroys_gpu_instances(tmp_path: Path) -> None:
    nvml = ScriptedNvml([scripted_h100([])])
    backend = NvmlBackend(nvml, mig_minors=tmp_path / "absent")
    parent = GpuUuid(nvml.gpus[0].uuid)
    made = backend.create_mig_device(parent, "3g.40gb", 4)
    assert (made.profile, made.start, made.compute_instance_id) == ("3g.40gb", 4, 0)
    with pytest.raises(InventoryError, match=r"cannot create 7g\.80gb at memory slice 0"):
        backend.create_mig_device(parent, "7g.80gb", 0)  # overlaps 4..7
    backend.destroy_mig_device(parent, made.gpu_instance_id)
    assert backend.snapshot().gpus[0].mig_devices == ()
    backend.destroy_mig_device(parent, made.gpu_instance_id)  # already gone: nothing to do


def test_nvml_events_keep_the_mig_instance_they_name() -> None:
    nvml = ScriptedNvml([scripted_h100([])])
    backend = NvmlBackend(nvml)
    uuid = GpuUuid(nvml.gpus[0].uuid)
    watcher = backend.watch_health(uuid)
    try:
        nvml.emit(0, XID, 48, gi=2, ci=0)
        (event,) = watcher.wait(2.0)
        assert (event.xid, event.gpu_instance_id, event.compute_instance_id) == (48, 2, 0)
        nvml.emit(0, XID, 79)
        (whole,) = watcher.wait(2.0)
        assert whole.gpu_instance_id is None
    finally:
        watcher.close()
        backend.close()
