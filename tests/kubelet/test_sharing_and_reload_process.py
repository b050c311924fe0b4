"""Time-slicing replicas, CDI, device specs and SIGHUP reloads, in a separate plugin process."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu.inventory.fake import send_fake_gpu_command
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.testing.kubelet import AllocationError
from tests.kubelet.conftest import RESOURCE, Node

T4 = resolve_fake_spec("4xT4").inventory
T4_UUIDS = [g.uuid for g in T4.gpus]

SHARED_CONFIG = """\
version: v1
flags:
  plugin:
    sharedDevicesAllocationPolicy: distributed
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: {fail}
    resources:
      - name: nvidia.com/gpu
        replicas: {replicas}
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def shared_node(tempdir: Path) -> Iterator[Node]:
    config = write(tempdir / "config.yaml", SHARED_CONFIG.format(replicas=3, fail="false"))
    node = Node(tempdir, preset="4xT4", config=config)
    try:
        node.kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 12, timeout_s=30)
        yield node
    finally:
        node.close()


def gpu_of(device_id: str) -> str:
    return device_id.split("::")[0]


def test_replicas_are_advertised_and_a_critical_xid_marks_every_replica_unhealthy(
    shared_node: Node,
) -> None:
    kubelet = shared_node.kubelet
    devices = kubelet.devices(RESOURCE)
    assert sorted(devices) == sorted(f"{u}::{k}" for u in T4_UUIDS for k in range(3))

    send_fake_gpu_command(shared_node.plugin.control, "xid", gpu=1, xid=79)
    update = kubelet.wait_for_devices(
        RESOURCE, lambda d: not d[f"{T4_UUIDS[1]}::0"].healthy, timeout_s=10
    )
    for device_id, state in update.devices.items():
        assert state.healthy == (gpu_of(device_id) != T4_UUIDS[1]), device_id

    # A distributed preference spreads a 2-replica request over two healthy GPUs, and the
    # container sees each physical GPU once.
    alloc = kubelet.allocate(RESOURCE, 2)
    assert len({gpu_of(i) for i in alloc.device_ids}) == 2
    assert T4_UUIDS[1] not in {gpu_of(i) for i in alloc.device_ids}
    visible = alloc.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert sorted(visible) == sorted({gpu_of(i) for i in alloc.device_ids})


def test_packed_policy_fills_the_busiest_gpu_first(tempdir: Path) -> None:
    # The file says distributed; the flag must win (flag > file) and GetPreferredAllocation
    # must then pack replicas, which the kubelet follows.
    config = write(tempdir / "config.yaml", SHARED_CONFIG.format(replicas=3, fail="false"))
    node = Node(
        tempdir,
        preset="4xT4",
        config=config,
        extra=("--shared-devices-allocation-policy", "packed"),
    )
    try:
        kubelet = node.kubelet
        kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 12, timeout_s=30)

        # A fresh request stays on one GPU (distributed would spread it over three).
        fresh = kubelet.allocate(RESOURCE, 3, pod_uid="pod-fresh")
        assert fresh.preferred_device_ids == fresh.device_ids
        assert len({gpu_of(i) for i in fresh.device_ids}) == 1
        assert fresh.envs["NVIDIA_VISIBLE_DEVICES"] == gpu_of(fresh.device_ids[0])
        kubelet.release("pod-fresh")

        # One replica of GPU 2 in use makes it the busiest: the next requests fill it up
        # before any idle GPU is touched.
        busy = T4_UUIDS[2]
        kubelet.allocate(RESOURCE, 1, must_include=[f"{busy}::1"], pod_uid="pod-a")
        second = kubelet.allocate(RESOURCE, 1, pod_uid="pod-b")
        assert [gpu_of(i) for i in second.device_ids] == [busy]
        third = kubelet.allocate(RESOURCE, 2, pod_uid="pod-c")
        assert f"{busy}::2" in third.device_ids  # its last free replica
        assert len({gpu_of(i) for i in third.device_ids}) == 2
    finally:
        assert node.close() == 0


def test_sighup_with_changed_replicas_advertises_the_new_list(shared_node: Node) -> None:
    kubelet = shared_node.kubelet
    config = shared_node.root / "config.yaml"
    before = len(kubelet.registrations)
    write(config, SHARED_CONFIG.format(replicas=5, fail="true"))
    shared_node.plugin.send(signal.SIGHUP)
    kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 20, timeout_s=20)
    assert len(kubelet.registrations) > before
    assert sorted(kubelet.devices(RESOURCE)) == sorted(
        f"{u}::{k}" for u in T4_UUIDS for k in range(5)
    )
    # failRequestsGreaterThanOne now applies, as NVIDIA's plugin does it.
    with pytest.raises(AllocationError) as err:
        kubelet.allocate_raw(RESOURCE, [f"{T4_UUIDS[0]}::0", f"{T4_UUIDS[2]}::1"])
    assert err.value.grpc_code == "INVALID_ARGUMENT"
    assert "maximum request size for shared resources is 1" in str(err.value)


def test_sighup_with_an_invalid_config_keeps_serving_the_old_one(shared_node: Node) -> None:
    kubelet = shared_node.kubelet
    config = shared_node.root / "config.yaml"
    write(config, SHARED_CONFIG.format(replicas=0, fail="false"))
    shared_node.plugin.send(signal.SIGHUP)
    shared_node.plugin.wait_for_log("config reload rejected", timeout_s=10)
    assert "sharing.timeSlicing.resources.0.replicas" in shared_node.plugin.log()
    assert shared_node.plugin.proc.poll() is None
    assert len(kubelet.devices(RESOURCE)) == 12
    assert kubelet.is_connected(RESOURCE)
    kubelet.allocate_raw(RESOURCE, [f"{T4_UUIDS[0]}::2"])


def test_cdi_strategy_returns_cdi_names_and_device_specs_and_writes_the_spec(
    tempdir: Path,
) -> None:
    cdi_dir = tempdir / "cdi"
    config = write(
        tempdir / "config.yaml",
        f"""\
version: v1
flags:
  plugin:
    passDeviceSpecs: true
    deviceIDStrategy: index
    deviceListStrategy: [cdi-cri, cdi-annotations]
    cdiDir: {cdi_dir}
    preStartContainer: true
""",
    )
    node = Node(tempdir, preset="4xT4", config=config)
    try:
        node.kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 4, timeout_s=30)
        response = node.kubelet.allocate_raw(RESOURCE, [T4_UUIDS[2], T4_UUIDS[0]])
        # Our own CDI kind: nvidia-ctk's spec in the same directory is of kind nvidia.com/gpu.
        assert response.cdi_devices == ("k8s.kubegpu.io/gpu=0", "k8s.kubegpu.io/gpu=2")
        assert list(response.annotations.values()) == ["k8s.kubegpu.io/gpu=0,k8s.kubegpu.io/gpu=2"]
        assert next(iter(response.annotations)).startswith("cdi.k8s.io/")
        assert "NVIDIA_VISIBLE_DEVICES" not in response.envs  # only CDI strategies chosen
        paths = {d.container_path for d in response.devices}
        assert paths == {
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            T4.by_uuid(T4_UUIDS[0]).device_node,
            T4.by_uuid(T4_UUIDS[2]).device_node,
        }
        assert all(d.permissions == "rw" for d in response.devices)

        spec_files = list(cdi_dir.glob("*.json"))
        assert len(spec_files) == 1
        spec = json.loads(spec_files[0].read_text())
        assert spec["kind"] == "k8s.kubegpu.io/gpu"
        assert "cdiVersion" in spec
        names = {d["name"] for d in spec["devices"]}
        assert {"0", "1", "2", "3", "all"} == names
        assert not list(cdi_dir.glob(".*.tmp"))

        # preStartContainer is on: the kubelet calls it before the container starts.
        alloc = node.kubelet.allocate(RESOURCE, 1, pod_uid="pod-prestart")
        assert alloc.pre_start_called
        assert node.kubelet.start_container("pod-prestart", "main") == 1
        node.plugin.wait_for_log("pre-start for devices", timeout_s=10)
    finally:
        assert node.close() == 0
    # Kept on exit: containers restarted while the agent is down still resolve their names.
    assert json.loads(spec_files[0].read_text()) == spec


CDI_CONFIG = """\
version: v1
flags:
  plugin:
    deviceListStrategy: [cdi-cri]
    cdiDir: {cdi_dir}
    cdiKind: {kind}
"""


def test_cdi_spec_is_rewritten_at_start_follows_a_reload_and_outlives_the_agent(
    tempdir: Path,
) -> None:
    cdi_dir = tempdir / "cdi"
    cdi_dir.mkdir()
    # What nvidia-ctk leaves there (another owner's file: never touched), and a spec of ours
    # from an earlier run that no longer matches the node.
    foreign = cdi_dir / "nvidia.yaml"
    foreign.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    ours = cdi_dir / "kubegpu-k8s.kubegpu.io-gpu.json"
    ours.write_text('{"kind": "k8s.kubegpu.io/gpu", "devices": []}\n')
    config = write(
        tempdir / "config.yaml", CDI_CONFIG.format(cdi_dir=cdi_dir, kind="k8s.kubegpu.io/gpu")
    )
    node = Node(tempdir, preset="4xT4", config=config)
    try:
        kubelet = node.kubelet
        kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 4, timeout_s=30)
        spec = json.loads(ours.read_text())
        assert {d["name"] for d in spec["devices"]} == {*T4_UUIDS, "all"}

        # A reload to another kind writes that spec and removes ours of the old kind, whose
        # names are no longer handed out.
        registrations = len(kubelet.registrations)
        write(config, CDI_CONFIG.format(cdi_dir=cdi_dir, kind="example.com/gpu"))
        node.plugin.send(signal.SIGHUP)
        kubelet.wait_for_registration(RESOURCE, timeout_s=20, count=registrations + 1)
        renamed = cdi_dir / "kubegpu-example.com-gpu.json"
        assert json.loads(renamed.read_text())["kind"] == "example.com/gpu"
        assert not ours.exists()
        response = kubelet.allocate_raw(RESOURCE, [T4_UUIDS[1]])
        assert response.cdi_devices == (f"example.com/gpu={T4_UUIDS[1]}",)
    finally:
        assert node.close() == 0
    assert json.loads(renamed.read_text())["kind"] == "example.com/gpu"
    assert foreign.read_text().startswith("cdiVersion: 0.5.0")
    assert sorted(p.name for p in cdi_dir.iterdir()) == [renamed.name, foreign.name]


def test_renamed_shared_subset_is_served_beside_whole_gpus(tempdir: Path) -> None:
    config = write(
        tempdir / "config.yaml",
        """\
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
      - name: gpu
        replicas: 2
        devices: [2, 3]
""",
    )
    node = Node(tempdir, preset="4xT4", config=config)
    try:
        kubelet = node.kubelet
        kubelet.wait_for_devices("nvidia.com/gpu.shared", lambda d: len(d) == 4, timeout_s=30)
        kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 2, timeout_s=30)
        assert sorted(kubelet.devices(RESOURCE)) == sorted(T4_UUIDS[:2])
        assert {gpu_of(i) for i in kubelet.devices("nvidia.com/gpu.shared")} == set(T4_UUIDS[2:])
        # Both resources come back after a kubelet restart, each on its own socket.
        kubelet.restart()
        kubelet.wait_for_registration("nvidia.com/gpu.shared", timeout_s=30, count=2)
        kubelet.wait_for_registration(RESOURCE, timeout_s=30, count=2)
        kubelet.wait_for_devices("nvidia.com/gpu.shared", lambda d: len(d) == 4, timeout_s=30)
        kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 2, timeout_s=30)
    finally:
        assert node.close() == 0


def test_recovery_after_quiet_checks_and_restored_gpus_reach_the_stream(tempdir: Path) -> None:
    config = write(
        tempdir / "config.yaml", "version: v1\nhealth:\n  recoverAfterHealthyChecks: 3\n"
    )
    node = Node(tempdir, preset="4xT4", config=config)
    try:
        kubelet, control = node.kubelet, node.plugin.control
        kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 4, timeout_s=30)
        xid_gpu, lost_gpu = T4_UUIDS[0], T4_UUIDS[3]

        seq = kubelet.update_count(RESOURCE)
        # An Xid a GPU reset clears (79 would wait for a node reboot whatever the checks say).
        send_fake_gpu_command(control, "xid", gpu=0, xid=95)
        kubelet.wait_for_devices(
            RESOURCE, lambda d: not d[xid_gpu].healthy, timeout_s=10, after_sequence=seq
        )
        # Opt-in recovery: healthy again once three checks in a row saw no critical event.
        kubelet.wait_for_devices(RESOURCE, lambda d: d[xid_gpu].healthy, timeout_s=20)

        seq = kubelet.update_count(RESOURCE)
        send_fake_gpu_command(control, "lose", gpu=3)
        kubelet.wait_for_devices(
            RESOURCE, lambda d: not d[lost_gpu].healthy, timeout_s=10, after_sequence=seq
        )
        send_fake_gpu_command(control, "restore", gpu=3)
        kubelet.wait_for_devices(RESOURCE, lambda d: d[lost_gpu].healthy, timeout_s=10)
        assert kubelet.allocatable(RESOURCE) == 4
    finally:
        assert node.close() == 0
