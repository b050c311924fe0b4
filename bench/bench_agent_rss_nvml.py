"""Node agent peak RSS on the machine's real GPUs (NVML), with and without the exporter inside,
and of a separate ``kubegpu exporter``: what the fake-backend figures of
``bench_device_plugin.py`` leave out (the NVML library and its per-GPU state).

Run on a GPU machine from a checkout (about 30 s)::

    .venv/bin/python bench/bench_agent_rss_nvml.py [--json] [--runs N]

Each run starts the kubelet emulator and ``kubegpu device-plugin --backend nvml`` (no API
access), waits for registration, scrapes ``/metrics`` 200 times when the exporter is on (new
connection each; the first once it has GPU samples), waits 3 s and reads ``VmHWM`` from
``/proc/<pid>/status``; then the same for ``kubegpu exporter --backend nvml --no-pod-resources``
(refresh every second).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Run as a script, this folder is on sys.path: the fake-backend bench's helpers serve both.
from bench_device_plugin import free_port, percentile, scrape, vm_hwm_kib

from kubegpu.testing.kubelet import KubeletEmulator

RESOURCE = "nvidia.com/gpu"


def scrape_latency(url: str) -> dict[str, float]:
    latencies = scrape(url, 200)
    return {"p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99)}


def measure(args: list[str], url: str | None, kubelet_dir: Path | None = None) -> dict[str, Any]:
    kubelet = KubeletEmulator(kubelet_dir) if kubelet_dir is not None else None
    if kubelet is not None:
        kubelet.start()
    proc = subprocess.Popen([sys.executable, "-m", "kubegpu", "--log-level", "warning", *args])
    try:
        if kubelet is not None:
            kubelet.wait_for_registration(RESOURCE, timeout_s=60)
        latency = scrape_latency(url) if url is not None else None
        time.sleep(3)
        peak = vm_hwm_kib(proc.pid) / 1024
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        if kubelet is not None:
            kubelet.stop()
    return {"peak_vmhwm_mib": peak, "scrape": latency, "exit_code": rc}


def run() -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="kg-rss-", dir="/tmp"))
    agent = ["device-plugin", "--backend", "nvml", "--node-name", "gpu-node"]
    result: dict[str, Any] = {}
    kubelet_dir = root / "dp"
    result["agent"] = measure([*agent, "--kubelet-dir", str(kubelet_dir)], None, kubelet_dir)
    port = free_port()
    exporter = [
        "--exporter",
        f"--exporter-listen=127.0.0.1:{port}",
        "--exporter-pod-resources-socket=",
    ]
    result["agent_with_exporter"] = measure(
        [*agent, "--kubelet-dir", str(kubelet_dir), *exporter],
        f"http://127.0.0.1:{port}/metrics",
        kubelet_dir,
    )
    port = free_port()
    standalone = ["exporter", "--backend", "nvml", "--listen", f"127.0.0.1:{port}",
                  "--no-pod-resources", "--node-name", "gpu-node", "--interval", "1"]  # fmt: skip
    result["standalone_exporter"] = measure(standalone, f"http://127.0.0.1:{port}/metrics")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    gpus = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    report = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpus": gpus.splitlines(),
        "python": sys.version.split()[0],
        "runs": [run() for _ in range(args.runs)],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{report['date']} — {'; '.join(report['gpus'])}, Python {report['python']}")
    for i, result in enumerate(report["runs"], 1):
        for name, figures in result.items():
            scrape_text = (
                ""
                if figures["scrape"] is None
                else f", scrape p50 {figures['scrape']['p50_ms']:.2f} ms"
                f" p99 {figures['scrape']['p99_ms']:.2f} ms"
            )
            print(
                f"run {i} {name}: peak RSS {figures['peak_vmhwm_mib']:.1f} MiB{scrape_text}, "
                f"exit {figures['exit_code']}"
            )


if __name__ == "__main__":
    main()
