"""``kubegpu exporter --backend nvml`` on the machine's real GPUs (``pytest -m gpu``): while a CUDA
process holds 2 GiB, the scrape shows the card's memory in use and, with no pods on this host,
that memory as used by processes no pod owns (NVML's per-process accounting read for real)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import signal
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubegpu.testing.waiting import wait_until

pytestmark = pytest.mark.gpu

GIB = 1024**3
HOLD_2_GIB = (
    "import sys, time, torch; "
    "x = torch.empty(2 * 1024**3, dtype=torch.uint8, device='cuda:0'); "
    "torch.cuda.synchronize(); print('holding', flush=True); time.sleep(600)"
)


def gauges(url: str, name: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        sample.labels["uuid"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == name
        for sample in family.samples
    }


def test_real_gpu_memory_and_unattributed_process_memory_are_scraped() -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("no CUDA client available (torch is not installed)")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH")
    first_gpu = subprocess.run(
        [smi, "--id=0", "--query-gpu=uuid,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    uuid, total_mib = (cell.strip() for cell in first_gpu.split(","))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_2_GIB], stdout=subprocess.PIPE, text=True)
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kubegpu",
            "exporter",
            "--backend",
            "nvml",
            "--listen",
            "127.0.0.1:0",
            "--no-pod-resources",
            "--node-name",
            "gpu-host",
            "--interval",
            "0.5",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        assert exporter.stderr is not None
        url = None
        for line in exporter.stderr:
            match = re.search(r"serving (http://\S+/metrics)", line)
            if match:
                url = match.group(1)
                break
        assert url, "the exporter never said where it serves"
        used: dict[str, float] = {}
        unattributed: dict[str, float] = {}

        def held() -> bool:
            nonlocal used, unattributed
            used = gauges(url, "kubegpu_gpu_memory_used_bytes")
            unattributed = gauges(url, "kubegpu_gpu_unattributed_memory_used_bytes")
            return used.get(uuid, 0) >= 2 * GIB and unattributed.get(uuid, 0) >= 2 * GIB

        wait_until(held, timeout_s=60, what=lambda: f"{used=} {unattributed=}", poll_s=0.5)
        total = gauges(url, "kubegpu_gpu_memory_total_bytes")
        assert total[uuid] == int(total_mib) * 1024**2
        assert unattributed[uuid] <= used[uuid] <= total[uuid]
        exporter.send_signal(signal.SIGTERM)
        assert exporter.wait(timeout=30) == 0
    finally:
        for process in (exporter, holder):
            if process.poll() is None:
                process.kill()
            process.wait()
        for stream in (exporter.stderr, holder.stdout):
            if stream is not None:
                stream.close()
