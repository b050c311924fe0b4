"""The MIG strategies in a real ``kubegpu device-plugin`` process against the kubelet emulator:
what it registers, what a container is told, an Xid on one GPU instance and on a whole card
sent through the fake control socket, and ``single`` refusing a node that is not uniform."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping

import pytest

from kubegpu.inventory.fake import send_fake_gpu_command
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.testing.kubelet import SeenDevice
from tests.kubelet.conftest import Node, short_tempdir

PRESET = "4xH100-80GB-MIG"
NODE = resolve_fake_spec(PRESET).inventory
CARD0, CARD1, CARD2, CARD3 = NODE.gpus
COUNTS = {
    "nvidia.com/gpu": 1,
    "nvidia.com/mig-1g.10gb": 8,
    "nvidia.com/mig-2g.20gb": 1,
    "nvidia.com/mig-3g.40gb": 3,
}


def unhealthy(devices: Mapping[str, SeenDevice]) -> set[str]:
    return {i for i, d in devices.items() if not d.healthy}


@pytest.fixture(scope="module")
def mixed() -> Iterator[Node]:
    root = short_tempdir()
    node = Node(root, preset=PRESET, extra=("--mig-strategy", "mixed"))
    try:
        for resource in COUNTS:
            node.kubelet.wait_for_registration(resource, timeout_s=30)
            node.kubelet.wait_for_devices(resource, timeout_s=30)
        yield node
    finally:
        node.close()
        shutil.rmtree(root, ignore_errors=True)


def test_mixed_registers_a_resource_per_profile_with_the_mig_devices(mixed: Node) -> None:
    for resource, count in COUNTS.items():
        assert len(mixed.kubelet.devices(resource)) == count, resource
    three = set(mixed.kubelet.devices("nvidia.com/mig-3g.40gb"))
    assert three == {m.uuid for g in NODE.gpus for m in g.mig_devices if m.profile == "3g.40gb"}
    assert set(mixed.kubelet.devices("nvidia.com/gpu")) == {CARD3.uuid}


def test_a_container_sees_exactly_its_mig_device(mixed: Node) -> None:
    alloc = mixed.kubelet.allocate("nvidia.com/mig-2g.20gb", 1, pod_uid="pod-two")
    try:
        assert alloc.device_ids == (CARD0.mig_devices[1].uuid,)
        assert alloc.envs["NVIDIA_VISIBLE_DEVICES"] == CARD0.mig_devices[1].uuid
    finally:
        mixed.kubelet.release("pod-two")


def test_an_xid_on_a_gpu_instance_marks_that_mig_device_and_one_on_the_card_all_of_its(
    mixed: Node,
) -> None:
    one_g, three_g = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"
    target = CARD1.mig_devices[2]
    reply = send_fake_gpu_command(
        mixed.plugin.control, "xid", gpu=1, xid=48, gpu_instance_id=target.gpu_instance_id
    )
    assert reply["ok"], reply
    mixed.kubelet.wait_for_devices(one_g, lambda d: unhealthy(d) == {target.uuid}, timeout_s=15)
    assert unhealthy(mixed.kubelet.devices(three_g)) == set()

    assert send_fake_gpu_command(mixed.plugin.control, "xid", gpu=2, xid=79)["ok"]
    card2 = {m.uuid for m in CARD2.mig_devices}
    mixed.kubelet.wait_for_devices(three_g, lambda d: unhealthy(d) == card2, timeout_s=15)
    assert unhealthy(mixed.kubelet.devices(one_g)) == {target.uuid}
    assert unhealthy(mixed.kubelet.devices("nvidia.com/gpu")) == set()
    mixed.plugin.wait_for_log(f"MIG device 1:2 ({target.uuid}) unhealthy: Xid 48")


def test_single_refuses_a_node_that_is_not_uniform_and_exits_1() -> None:
    root = short_tempdir()
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "kubegpu",
                "device-plugin",
                "--backend=fake",
                f"--fake-gpus={PRESET}",
                f"--kubelet-dir={root}",
                "--mig-strategy=single",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert result.returncode == 1, result.stderr
    assert (
        "error starting plugins: invalid MIG configuration: more than one MIG device type "
        "present on node" in result.stderr
    )
