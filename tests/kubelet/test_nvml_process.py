"""The node agent on the machine's real GPUs (``pytest -m gpu``): a real ``kubegpu
device-plugin --backend nvml`` process registered with the kubelet emulator advertises exactly the
GPUs nvidia-smi lists, healthy, and hands them out by UUID with their device nodes."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubegpu.testing.waiting import wait_until
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


def test_the_exporter_inside_the_agent_reads_the_real_gpus_and_survives_a_reload() -> None:
    # One NVML session in one process for the device plugin, its health monitor and the
    # exporter: stopping the exporter on a reload (its metrics reader shuts its NVML handle
    # down) must leave the agent's own NVML use and the next exporter working.
    def scrape(base: str) -> dict[tuple[str, str], float]:
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        return {
            (s.name, s.labels["uuid"]): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if "uuid" in s.labels
        }

    def scrape_until_every_gpu(base: str) -> dict[tuple[str, str], float]:
        def every_gpu() -> dict[tuple[str, str], float] | None:
            samples = scrape(base)
            every = all(("kubegpu_gpu_temperature_celsius", u) in samples for u in uuids)
            return samples if every else None

        return wait_until(every_gpu, timeout_s=60, what="a temperature for every GPU")

    def url(after: int) -> str:
        def served() -> list[str]:
            found = re.findall(r"exporter serving (http://\S+)/metrics", node.plugin.log())
            return found if len(found) > after else []

        found = wait_until(served, timeout_s=60, what=lambda: node.plugin.log())
        return str(found[after])

    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH")
    rows = subprocess.run(
        [smi, "--query-gpu=uuid,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    memory_mib = {
        uuid.strip(): int(total) for uuid, total in (line.split(",") for line in rows.splitlines())
    }
    uuids = sorted(memory_mib)
    root = short_tempdir()
    config = root / "config.yaml"
    exporter = (
        'exporter: {{enabled: true, listen: "127.0.0.1:0", intervalS: {interval}, '
        'podResourcesSocket: ""}}\n'
    )
    config.write_text("version: v1\n" + exporter.format(interval=0.5))
    node = Node(root, backend="nvml", config=config)
    try:
        node.kubelet.wait_for_registration(RESOURCE, timeout_s=60)
        node.kubelet.wait_for_devices(RESOURCE, timeout_s=60)
        samples = scrape_until_every_gpu(url(0))
        for uuid, total in memory_mib.items():
            assert samples[("kubegpu_gpu_healthy", uuid)] == 1.0
            # nvidia-smi rounds down to whole MiB.
            assert 0 <= samples[("kubegpu_gpu_memory_total_bytes", uuid)] - total * 2**20 < 2**20
            assert samples[("kubegpu_gpu_temperature_celsius", uuid)] > 0
        config.write_text("version: v1\n" + exporter.format(interval=0.7))
        before_reload = node.kubelet.update_count(RESOURCE)
        node.plugin.send(signal.SIGHUP)
        samples = scrape_until_every_gpu(url(1))
        assert all(samples[("kubegpu_gpu_healthy", u)] == 1.0 for u in uuids)
        node.kubelet.wait_for_registration(RESOURCE, timeout_s=60, count=2)
        # The old stream's end marks every device unhealthy (as the kubelet does) before the
        # new stream lists them again: allocate once that list has come.
        node.kubelet.wait_for_devices(
            RESOURCE,
            lambda d: sorted(d) == uuids and all(x.healthy for x in d.values()),
            timeout_s=60,
            after_sequence=before_reload,
        )
        allocation = node.kubelet.allocate(RESOURCE, 1, pod_name="after-reload")
        assert allocation.device_ids[0] in uuids
        node.kubelet.release(allocation.pod_uid)
        assert "Traceback" not in node.plugin.log()
    finally:
        rc = node.close()
        shutil.rmtree(root, ignore_errors=True)
    assert rc == 0
