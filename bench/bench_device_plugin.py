"""Node agent benchmarks: Allocate latency, Xid → ListAndWatch latency, peak RSS, and the
preferred-allocation search time on 8 and 16 GPUs.

Run from a checkout (takes about a minute)::

    .venv/bin/python bench/bench_device_plugin.py            # human-readable
    .venv/bin/python bench/bench_device_plugin.py --json     # one JSON object
    .venv/bin/python bench/bench_device_plugin.py --api      # with API access configured
    .venv/bin/python bench/bench_device_plugin.py --api --exporter   # as the DaemonSet runs it

What each figure measures:

* Allocate p50/p99: 10,000 sequential unary ``Allocate`` calls (one container, one GPU id)
  from a synchronous grpc client over the plugin's unix socket, as the kubelet makes them, to a
  separately started ``kubegpu device-plugin --backend fake --fake-gpus 8xA100-80GB-NVLink``.
* Xid → stream: an Xid 79 sent to the fake backend's control socket from this process, until
  the kubelet emulator has received the ListAndWatch message marking that GPU Unhealthy
  (monotonic clock, same host); one sample per GPU, median and max reported.
* Peak RSS: ``VmHWM`` of the agent process from ``/proc/<pid>/status`` after all of the above.
  Without ``--api`` the agent has no API access (whole GPUs only, nothing published); with
  ``--api`` it gets ``--kubeconfig`` for the bundled fake API server (started in this process)
  and ``--node-name``, so it also loads lightkube and publishes the inventory annotation on
  start and on each of the eight health changes. With ``--exporter`` the agent also serves the
  exporter (refreshing every second, PodResources from the kubelet emulator, pods named from
  the API server when ``--api`` is given, as the DaemonSet does), and ``/metrics`` is scraped
  200 times after the Xids (scrape latency reported; the scrapes count in the peak). For
  comparison, the separate ``kubegpu exporter`` process it replaces is then started with the
  same sources, scraped 200 times too, and its ``VmHWM`` reported.
* Preferred allocation: :func:`kubegpu.placement.topology.best_gpu_set` in-process, every size
  from 2 to n-1 with no must-include ids (the worst case for the search), best of 5 runs per
  size, plus the gRPC round trip of ``GetPreferredAllocation`` on the 8-GPU node.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from kubegpu.inventory.fake import send_fake_gpu_command
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.placement.topology import best_gpu_set
from kubegpu.testing.apiserver import FakeApiServer, ServerThread, make_node
from kubegpu.testing.kubelet import KubeletEmulator

RESOURCE = "nvidia.com/gpu"
PRESET = "8xA100-80GB-NVLink"
NODE = "bench-node"
INVENTORY_ANNOTATION = "kubegpu.io/gpu-inventory"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("VmHWM not found")


def bench_preferred(preset: str, runs: int = 5) -> dict[str, float]:
    inv = resolve_fake_spec(preset).inventory
    uuids = [g.uuid for g in inv.gpus]
    per_size: dict[int, float] = {}
    for size in range(2, len(uuids)):
        best = float("inf")
        for _ in range(runs):
            start = time.perf_counter()
            best_gpu_set(inv, uuids, [], size)
            best = min(best, time.perf_counter() - start)
        per_size[size] = best * 1000
    worst = max(per_size, key=lambda k: per_size[k])
    return {"preset": preset, "gpus": len(uuids), "worst_ms": per_size[worst], "worst_size": worst}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(url: str, times: int) -> list[float]:
    """Milliseconds per ``GET`` of ``times`` scrapes, once a scrape has GPU samples."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                if b"kubegpu_gpu_memory_total_bytes{" in reply.read():
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} never served GPU metrics")
        time.sleep(0.1)
    latencies = []
    for _ in range(times):
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as reply:
            reply.read()
        latencies.append((time.perf_counter() - start) * 1000)
    return latencies


def standalone_exporter_rss(
    root: Path, pod_resources: Path, kubeconfig: Path | None, env: dict[str, str]
) -> float:
    """Peak RSS (MiB) of a separate ``kubegpu exporter`` on the same node, scraped 200 times."""
    port = free_port()
    args = [sys.executable, "-m", "kubegpu", "--log-level", "warning", "exporter",
            "--backend", "fake", "--fake-gpus", PRESET, "--listen", f"127.0.0.1:{port}",
            "--node-name", NODE, "--interval", "1", "--pod-resources-socket", str(pod_resources),
            "--pod-directory", "api" if kubeconfig else "logs"]  # fmt: skip
    if kubeconfig is not None:
        env = {**env, "KUBECONFIG": str(kubeconfig)}
    with (root / "exporter.log").open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            scrape(f"http://127.0.0.1:{port}/metrics", 200)
            return vm_hwm_kib(proc.pid) / 1024
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def run(allocate_calls: int, *, api: bool = False, exporter: bool = False) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="kg-bench-", dir="/tmp"))
    kubelet_dir = root / "dp"
    control = root / "fake.sock"
    pod_resources = root / "pr.sock"
    kubelet = KubeletEmulator(kubelet_dir, pod_resources_socket=pod_resources if exporter else None)
    kubelet.start()
    api_server: ServerThread | None = None
    extra: list[str] = []
    kubeconfig = None
    if api:
        api_server = FakeApiServer().run_in_thread()
        api_server.store.put("nodes", make_node(NODE))
        kubeconfig = api_server.write_kubeconfig(root / "kubeconfig")
        extra = ["--kubeconfig", str(kubeconfig), "--node-name", NODE]
    metrics_url = None
    if exporter:
        port = free_port()
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        config = root / "config.yaml"
        config.write_text(
            "version: v1\nexporter:\n  intervalS: 1.0\n"
            f"  podDirectory: {'api' if api else 'logs'}\n"
        )
        extra += ["--config", str(config), "--exporter", f"--exporter-listen=127.0.0.1:{port}",
                  f"--exporter-pod-resources-socket={pod_resources}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEGPU_")}
    log = (root / "plugin.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubegpu", "--log-level", "warning", "device-plugin",
         "--backend", "fake", "--fake-gpus", PRESET, "--kubelet-dir", str(kubelet_dir),
         "--fake-control", str(control), *extra],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    published: bool | None = None
    try:
        reg = kubelet.wait_for_registration(RESOURCE, timeout_s=60)
        kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 8, timeout_s=60)
        uuids = sorted(kubelet.devices(RESOURCE))
        rss_idle = vm_hwm_kib(proc.pid)

        channel = grpc.insecure_channel(f"unix://{kubelet_dir / reg.endpoint}")
        stub = api_pb2_grpc.DevicePluginStub(channel)
        requests = [
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[u])]
            )
            for u in uuids
        ]
        for i in range(200):  # warm-up: connection, code paths
            stub.Allocate(requests[i % 8])
        lat: list[float] = []
        for i in range(allocate_calls):
            start = time.perf_counter()
            stub.Allocate(requests[i % 8])
            lat.append((time.perf_counter() - start) * 1000)

        pref_req = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=uuids, allocation_size=4
                )
            ]
        )
        pref_lat = []
        for _ in range(200):
            start = time.perf_counter()
            stub.GetPreferredAllocation(pref_req)
            pref_lat.append((time.perf_counter() - start) * 1000)
        channel.close()

        xid_lat: list[float] = []
        inv = resolve_fake_spec(PRESET).inventory
        for gpu in inv.gpus:
            seq = kubelet.update_count(RESOURCE)
            start = time.monotonic()
            send_fake_gpu_command(control, "xid", gpu=gpu.index, xid=79)
            update = kubelet.wait_for_devices(
                RESOURCE,
                lambda d, u=gpu.uuid: not d[u].healthy,  # type: ignore[misc]
                timeout_s=10,
                after_sequence=seq,
            )
            xid_lat.append((update.received_at_monotonic_s - start) * 1000)
        scrape_lat = [] if metrics_url is None else scrape(metrics_url, 200)
        rss_peak = vm_hwm_kib(proc.pid)
        standalone = (
            standalone_exporter_rss(root, pod_resources, kubeconfig, env) if exporter else None
        )
        if api_server is not None:
            node = api_server.store.get("nodes", None, NODE) or {}
            published = INVENTORY_ANNOTATION in node.get("metadata", {}).get("annotations", {})
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        log.close()
        kubelet.stop()
        if api_server is not None:
            api_server.stop()
        shutil.rmtree(root, ignore_errors=True)

    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {
            "nproc": os.cpu_count(),
            "cpu": cpu_model(),
            "python": platform.python_version(),
        },
        "allocate_ms": {
            "calls": allocate_calls,
            "p50": percentile(lat, 50),
            "p99": percentile(lat, 99),
            "max": max(lat),
        },
        "get_preferred_allocation_grpc_ms": {
            "gpus": 8,
            "size": 4,
            "p50": percentile(pref_lat, 50),
            "p99": percentile(pref_lat, 99),
        },
        "xid_to_stream_ms": {
            "samples": len(xid_lat),
            "median": statistics.median(xid_lat),
            "max": max(xid_lat),
        },
        "api_access": api,
        "exporter": exporter,
        "scrape_ms": (
            {
                "scrapes": len(scrape_lat),
                "p50": percentile(scrape_lat, 50),
                "p99": percentile(scrape_lat, 99),
            }
            if scrape_lat
            else None
        ),
        "inventory_published": published,
        "rss_mib": {
            "idle_after_registration": rss_idle / 1024,
            "peak_vmhwm": rss_peak / 1024,
            "standalone_exporter_peak_vmhwm": standalone,
        },
        "preferred_allocation_search_ms": [
            bench_preferred("8xA100-80GB-NVLink"),
            bench_preferred("8xV100-32GB-HybridCubeMesh"),
            bench_preferred("16xH100-80GB"),
        ],
        "agent_exit_code": rc,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--allocate-calls", type=int, default=10_000)
    parser.add_argument(
        "--api", action="store_true", help="give the agent API access (the fake API server)"
    )
    parser.add_argument(
        "--exporter", action="store_true", help="run the exporter inside the agent and scrape it"
    )
    args = parser.parse_args()
    result = run(args.allocate_calls, api=args.api, exporter=args.exporter)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    m = result["machine"]
    print(f"{result['date']} — {m['nproc']} CPUs, {m['cpu']}, Python {m['python']}")
    a = result["allocate_ms"]
    print(f"Allocate over unix socket ({a['calls']} calls): p50 {a['p50']:.3f} ms, "
          f"p99 {a['p99']:.3f} ms, max {a['max']:.3f} ms")  # fmt: skip
    g = result["get_preferred_allocation_grpc_ms"]
    print(f"GetPreferredAllocation gRPC (8 GPUs, size 4): p50 {g['p50']:.3f} ms, "
          f"p99 {g['p99']:.3f} ms")  # fmt: skip
    x = result["xid_to_stream_ms"]
    print(f"Xid 79 -> ListAndWatch ({x['samples']} samples): median {x['median']:.1f} ms, "
          f"max {x['max']:.1f} ms")  # fmt: skip
    r = result["rss_mib"]
    access = "with API access" if result["api_access"] else "no API access"
    if result["exporter"]:
        access += ", exporter on"
    print(f"Agent RSS ({access}): {r['idle_after_registration']:.1f} MiB after registration, "
          f"peak (VmHWM) {r['peak_vmhwm']:.1f} MiB")  # fmt: skip
    if result["api_access"]:
        print(f"inventory annotation published: {result['inventory_published']}")
    if result["scrape_ms"]:
        sc = result["scrape_ms"]
        print(f"/metrics scrape ({sc['scrapes']}): p50 {sc['p50']:.2f} ms, p99 {sc['p99']:.2f} ms")
        print(f"a separate kubegpu exporter on the same node: peak (VmHWM) "
              f"{r['standalone_exporter_peak_vmhwm']:.1f} MiB")  # fmt: skip
    for p in result["preferred_allocation_search_ms"]:
        print(f"best_gpu_set on {p['preset']} ({p['gpus']} GPUs): worst {p['worst_ms']:.3f} ms "
              f"(size {p['worst_size']})")  # fmt: skip
    print(f"agent exit code on SIGTERM: {result['agent_exit_code']}")


if __name__ == "__main__":
    main()
