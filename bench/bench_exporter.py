"""Exporter benchmark: scrape time and exporter CPU per scrape with 8 GPUs and 50 pods.

Run from a checkout (takes well under a minute)::

    .venv/bin/python bench/bench_exporter.py            # human-readable
    .venv/bin/python bench/bench_exporter.py --json     # one JSON object

The node: the ``8xA100-80GB-NVLink`` fake preset; 50 pods, two whole-GPU pods (GPUs 0-1) and
48 pods sharing GPUs 2-7 (8 per GPU, each with a memory and compute share), every pod with two
GPU processes, so 100 processes to map through a hand-made ``/proc`` tree (half cgroup v1
cgroupfs paths, half cgroup v2 systemd paths) and a kubelet pod log directory. PodResources is
the kubelet emulator's gRPC server on a unix socket, queried by the exporter's real client.

What each figure measures:

* **collect + encode**: ``prometheus_client.generate_latest`` on the exporter's registry, i.e.
  the work of one scrape without the network (N scrapes in a row, wall time per scrape p50/p99,
  and the CPU time of the scraping thread per scrape, ``time.thread_time`` delta / N).
* **collect only**: CPU of our collector building the samples from the snapshot, without
  prometheus_client's text encoding (the rest of "collect + encode" is the library's).
* **HTTP scrape**: ``GET /metrics`` over real HTTP on 127.0.0.1 with urllib (a new connection
  each time), p50/p99, and process CPU per scrape (``time.process_time``: the server thread
  *and* the urllib client, both in this process, so an upper bound for the exporter).
* **while NVML hangs**: the same HTTP scrape after the fake NVML was switched to hang and a
  refresh timed out: the scrape does not wait for NVML.
* **refresh**: one background refresh (fake NVML read, PodResources List over gRPC, 100
  ``/proc/<pid>/cgroup`` reads, the pod log directory, attribution), wall and CPU time.
* **series**: number of samples one scrape returns.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from kubegpu.core.metrics import PodGpuShare, PodKey
from kubegpu.exporter.collector import GpuCollector
from kubegpu.exporter.pods import KubeletPodResources, PodLogDirectory, StaticShares
from kubegpu.exporter.server import ExporterSettings, start_exporter
from kubegpu.inventory.fake_metrics import FakeMetricsSource
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.testing.kubelet import Allocation, ContainerResponse, SeenDevice
from kubegpu.testing.podresources import serve_pod_resources

GIB = 1024**3
RESOURCE = "nvidia.com/gpu"


class Kubelet:
    def __init__(self, allocations: list[Allocation], devices: dict[str, SeenDevice]) -> None:
        self._allocations = allocations
        self._devices = devices

    def allocations(self) -> list[Allocation]:
        return self._allocations

    def resources(self) -> list[str]:
        return [RESOURCE]

    def devices(self, resource: str) -> dict[str, SeenDevice]:
        return self._devices


def build_node(root: Path) -> dict[str, Any]:
    inventory = resolve_fake_spec("8xA100-80GB-NVLink").inventory
    uuids = [g.uuid for g in inventory.gpus]
    metrics = FakeMetricsSource(inventory)
    empty = ContainerResponse(envs={}, mounts=(), devices=(), annotations={}, cdi_devices=())
    allocations: list[Allocation] = []
    shares: dict[PodKey, list[PodGpuShare]] = {}
    processes: dict[int, dict[int, int]] = {i: {} for i in range(8)}
    pid = 1000
    for n in range(50):
        gpu = n if n < 2 else 2 + (n - 2) // 8
        pod = PodKey("bench", f"pod-{n:02d}")
        uid = f"{n:08x}-0000-4000-8000-{n:012x}"
        device_id = uuids[gpu] if n < 2 else f"{uuids[gpu]}::{(n - 2) % 8}"
        allocations.append(
            Allocation(
                pod_uid=uid,
                pod_name=pod.name,
                namespace=pod.namespace,
                container="main",
                resource_name=RESOURCE,
                device_ids=(device_id,),
                response=empty,
                preferred_device_ids=None,
                pre_start_called=True,
                numa_nodes={device_id: (0,)},
            )
        )
        if n >= 2:
            shares[pod] = [PodGpuShare(uuids[gpu], memory_bytes=10 * GIB, compute_ratio=0.125)]
        (root / "pods" / f"{pod.namespace}_{pod.name}_{uid}").mkdir(parents=True)
        for k in range(2):
            pid += 1
            cgroup = (
                f"12:memory:/kubepods/burstable/pod{uid}/c{k}\n"
                if k == 0
                else "0::/kubepods.slice/kubepods-burstable.slice/"
                f"kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-containerd-c{k}.scope\n"
            )
            (root / "proc" / str(pid)).mkdir(parents=True)
            (root / "proc" / str(pid) / "cgroup").write_text(cgroup)
            processes[gpu][pid] = (3 + n % 5) * GIB
    for i, uuid in enumerate(uuids):
        metrics.set_processes(uuid, processes[i])
        metrics.set(uuid, utilization_ratio=0.5, ecc_corrected_total=i)
    devices = {
        f"{u}::{r}": SeenDevice(f"{u}::{r}", "Healthy", (0,)) for u in uuids for r in range(8)
    }
    return {
        "inventory": inventory,
        "metrics": metrics,
        "kubelet": Kubelet(allocations, devices),
        "shares": StaticShares(shares),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def http_scrapes(url: str, n: int) -> list[float]:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()
        times.append(time.perf_counter() - started)
    return times


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def run(scrapes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kgb-", dir="/tmp") as tmp:
        root = Path(tmp)
        node = build_node(root)
        sock = root / "kubelet.sock"
        server = serve_pod_resources(node["kubelet"], sock)
        pod_resources = KubeletPodResources(sock, timeout_s=10)
        running = start_exporter(
            ExporterSettings(
                node_name="bench-node",
                listen_port=0,
                interval_s=3600,
                read_timeout_s=0.5,
                proc=root / "proc",
            ),
            inventory=lambda: node["inventory"],
            metrics=node["metrics"],
            pod_resources=pod_resources,
            pod_directory=PodLogDirectory(root / "pods"),
            shares=node["shares"],
        )
        try:
            while running.refresher.latest() is None:
                time.sleep(0.01)
            refresh_wall, refresh_cpu = [], []
            for _ in range(50):
                # Stay under the kubelet's PodResources rate limit (100/s, burst 10), which the
                # emulator enforces like the kubelet; the pause is not measured.
                time.sleep(0.05)
                w, c = time.perf_counter(), time.process_time()
                assert running.refresher.refresh_once()
                assert running.refresher.pod_resources_ok
                refresh_wall.append(time.perf_counter() - w)
                refresh_cpu.append(time.process_time() - c)

            registry = running.registry
            body = generate_latest(registry)
            series = sum(
                1 for line in body.decode().splitlines() if line and not line.startswith("#")
            )
            generate_latest(registry)  # warm
            wall = []
            cpu_start = time.thread_time()
            for _ in range(scrapes):
                started = time.perf_counter()
                generate_latest(registry)
                wall.append(time.perf_counter() - started)
            cpu_per_scrape = (time.thread_time() - cpu_start) / scrapes

            collector = GpuCollector(running.refresher, health=running.health.tally)
            cpu_start = time.thread_time()
            for _ in range(scrapes):
                list(collector.collect())
            collect_cpu = (time.thread_time() - cpu_start) / scrapes

            url = running.url + "/metrics"
            http_scrapes(url, 20)  # warm
            cpu_start = time.process_time()
            http = http_scrapes(url, scrapes)
            http_cpu = (time.process_time() - cpu_start) / scrapes

            node["metrics"].hang()
            assert not running.refresher.refresh_once()
            hung = http_scrapes(url, max(50, scrapes // 10))
            node["metrics"].release()
        finally:
            running.stop()
            pod_resources.close()
            server.stop(None)
    ms = 1000.0
    return {
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpus": 8,
        "pods": 50,
        "processes": 100,
        "series_per_scrape": series,
        "scrape_bytes": len(body),
        "scrapes": scrapes,
        "collect_encode_ms_p50": statistics.median(wall) * ms,
        "collect_encode_ms_p99": percentile(wall, 0.99) * ms,
        "collect_encode_ms_mean": statistics.fmean(wall) * ms,
        "cpu_ms_per_scrape": cpu_per_scrape * ms,
        "collect_only_cpu_ms_per_scrape": collect_cpu * ms,
        "http_scrape_ms_p50": statistics.median(http) * ms,
        "http_cpu_ms_per_scrape": http_cpu * ms,
        "http_scrape_ms_p99": percentile(http, 0.99) * ms,
        "http_scrape_while_nvml_hangs_ms_p50": statistics.median(hung) * ms,
        "http_scrape_while_nvml_hangs_ms_max": max(hung) * ms,
        "refresh_ms_p50": statistics.median(refresh_wall) * ms,
        "refresh_cpu_ms_p50": statistics.median(refresh_cpu) * ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--scrapes", type=int, default=1000)
    args = parser.parse_args()
    result = run(args.scrapes)
    result["load_average_1m_after"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"machine: {result['machine']}\ndate: {result['date']}")
    print(f"load average (1 min) after the run: {result['load_average_1m_after']:.2f}")
    print(
        f"node: {result['gpus']} GPUs, {result['pods']} pods, {result['processes']} GPU "
        f"processes -> {result['series_per_scrape']} samples, {result['scrape_bytes']} bytes"
    )
    for key, value in result.items():
        if key.endswith(("_p50", "_p99", "_max", "_mean", "_per_scrape")) and "ms" in key:
            print(f"  {key:40s} {value:8.3f}")


if __name__ == "__main__":
    main()
