"""The node agent on the machine's real GPUs (``pytest -m gpu``): a real ``kubegpu
device-plugin --backend nvml`` process registered with the kubelet emulator advertises exactly the
GPUs nvidia-smi lists, healthy, and hands them out by UUID with their device nodes."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kubelet.conftest import RESOURCE, Node, short_tempdir

pytestmark = pytest.mark.gpu


def nvidia_smi_gpus() -> list[tuple[int, str]]:
    """(index, uuid) of every GPU, as nvidia-smi reports them."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH")
    output = subprocess.run(
        [smi, "--query-gpu=index,uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    rows = [[cell.strip() for cell in line.split(",")] for line in output.strip().splitlines()]
    return [(int(index), uuid) for index, uuid in rows]


@pytest.fixture(scope="module")
def nvml_node() -> Iterator[Node]:
    root = short_tempdir()
    node = Node(root, backend="nvml", extra=("--pass-device-specs",))
    try:
        node.kubelet.wait_for_registration(RESOURCE, timeout_s=60)
        node.kubelet.wait_for_devices(RESOURCE, timeout_s=60)
        yield node
    finally:
        rc = node.close()
        shutil.rmtree(root, ignore_errors=True)
        assert rc == 0, "the plugin did not exit 0 on SIGTERM"


def test_every_real_gpu_is_advertised_healthy_by_uuid(nvml_node: Node) -> None:
    devices = nvml_node.kubelet.devices(RESOURCE)
    assert sorted(devices) == sorted(uuid for _, uuid in nvidia_smi_gpus())
    assert all(device.healthy for device in devices.values()), devices
    assert nvml_node.kubelet.registration(RESOURCE) is not None


def test_allocate_hands_out_a_real_gpu_with_its_device_nodes(nvml_node: Node) -> None:
    allocation = nvml_node.kubelet.allocate(RESOURCE, 1, pod_name="real-gpu-pod")
    try:
        (device_id,) = allocation.device_ids
        assert allocation.preferred_device_ids == (device_id,)
        assert allocation.envs["NVIDIA_VISIBLE_DEVICES"] == device_id
        device_paths = {spec.host_path for spec in allocation.devices}
        assert "/dev/nvidiactl" in device_paths
        # One card's node (its minor number, which need not equal its index).
        assert len([p for p in device_paths if re.fullmatch(r"/dev/nvidia[0-9]+", p)]) == 1
        for path in device_paths:
            assert Path(path).exists(), f"{path} is handed out but does not exist on this host"
    finally:
        nvml_node.kubelet.release(allocation.pod_uid)


def test_the_agent_logs_name_the_real_gpus_and_stay_quiet(nvml_node: Node) -> None:
    log = nvml_node.plugin.log()
    for _, uuid in nvidia_smi_gpus():
        assert uuid in log
    assert "Traceback" not in log
    # Quiet: no warning or error at all from a healthy GPU, and every device list it sent
    # counted no unhealthy device.
    assert re.search(r"^\S+ (WARNING|ERROR|CRITICAL) ", log, re.MULTILINE) is None, log
    assert "(0 unhealthy" in log
    assert re.search(r"\([1-9][0-9]* unhealthy", log) is None, log
