"""Scheduler-extender benchmark: filter + prioritize latency and decisions/s over HTTP.

Run from a checkout::

    .venv/bin/python bench/bench_extender.py                       # openb + synthetic 5,000
    .venv/bin/python bench/bench_extender.py --json
    .venv/bin/python bench/bench_extender.py --nodes-csv PATH --synthetic-nodes 0

Set-up, per cluster: the fake API server (in a thread of this process) holds the nodes, each
with a published ``kubegpu.io/gpu-inventory``; ``kubegpu extender`` runs as a **separate
process** (so its CPU is not shared with the load generator) pointed at it through a
kubeconfig, node-cache-capable, policy ``kubegpu`` unless ``--policy``. A warm-up binds
``--warmup-pods`` pods the way kube-scheduler would (filter, prioritize, best score, bind) so
cards are partly used and node states differ. Then, for ``--requests`` pods of mixed shapes
(60 % shares of 1-20 GiB and 10-50 % compute, 30 % one whole card, 10 % 2-4 whole cards):

* **latency**: one client, one decision at a time: ``POST /filter`` with every node name
  (``percentageOfNodesToScore: 100``), then ``POST /prioritize`` with the nodes that passed;
  p50/p99 of each verb and of the pair, measured at the client (includes HTTP and JSON).
* **extender CPU per pair**: the extender process's user+system CPU time over the latency
  phase divided by the pairs served (from ``/proc/<pid>/stat``): what a decision costs the
  extender, independent of what else the machine runs.
* **throughput**: ``--concurrency`` clients doing the same pairs: completed pairs per second,
  and the extender's and the load generator's CPU per pair over that phase (on two cores
  they compete: decisions/s is at most 2 / their sum).
* **pair latency while binding**: the warm-up's own filter + prioritize pairs, each followed by
  a bind, so every decision sees the node the previous one filled (the latency phase above
  holds the cluster still, which flatters whatever is cached per node).
* **extender CPU per bind**: the extender's CPU over the warm-up (and the second after it, for
  the watch events its binds cause) divided by the binds, less one pair's CPU as measured in
  the latency phase: what a bind costs beyond the decision before it (the patch, the Binding,
  the pod's watch events).
* **extender CPU per bind, binds alone**: ``--bind-pods`` more pods are created and decided
  (each leaving its tentative hold, as kube-scheduler's cycle does), then bound one after
  another with nothing else asked of the extender: its CPU over the binds and the second after
  them (the Binding, the pod's watch events), less what it spends idle over as long, per bind.
  A direct measure, where the warm-up's figure is a difference of two larger ones.
* **time to Ready**: from starting the extender process to its first ``/readyz`` 200 (polled
  every 10 ms): imports, the node and pod lists, the view.

``--extender-src PATH`` runs another checkout's extender (its ``src``) against this bench, for
before-and-after figures of one machine and hour; this process keeps its own code.

The client writes compact JSON and reads replies into typed structs with msgspec, as
kube-scheduler's Go encoder and decoder do.

The openb cluster comes from ``openb_node_list_gpu_node.csv`` (columns sn, cpu_milli,
memory_mib, gpu, model; card memory is not in the trace, so it is set per model, see
``MODEL_MEMORY_MIB``). The synthetic cluster has 8-card nodes of four models.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from kubegpu.sharing.annotations import (
    INVENTORY_ANNOTATION,
    GpuRecord,
    NodeGpuInventory,
    encode_inventory,
)
from kubegpu.simulate.memory_only import MODEL_MEMORY_MIB  # the card memory per openb model
from kubegpu.testing.apiserver import FakeApiServer, ServerThread, make_node, make_pod

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CSV = REPO / "../shared/traces/openb/openb_node_list_gpu_node.csv"
SYNTHETIC_MODELS = [("A100-80GB", 81920), ("H100-80GB", 81920), ("L40S", 46068), ("T4", 15360)]
MEMORY, COMPUTE, SLOT, WHOLE = (
    "kubegpu.io/gpu-memory",
    "kubegpu.io/gpu-compute",
    "kubegpu.io/gpu-shared",
    "nvidia.com/gpu",
)


def node_object(
    name: str, cpu_milli: int, memory_mib: int, cards: int, model: str, card_mib: int
) -> dict[str, Any]:
    inventory = NodeGpuInventory(
        tuple(GpuRecord(f"GPU-{name}-{i}", i, model, card_mib) for i in range(cards))
    )
    return make_node(
        name,
        cpu=f"{cpu_milli}m",
        memory=f"{memory_mib}Mi",
        extended={WHOLE: str(cards), SLOT: str(16 * cards)},
        annotations={INVENTORY_ANNOTATION: encode_inventory(inventory)},
    )


def openb_nodes(path: Path) -> list[dict[str, Any]]:
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [
        node_object(
            row["sn"],
            int(row["cpu_milli"]),
            int(row["memory_mib"]),
            int(row["gpu"]),
            row["model"],
            MODEL_MEMORY_MIB.get(row["model"], 32768),
        )
        for row in rows
    ]


def synthetic_nodes(count: int, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        model, card_mib = SYNTHETIC_MODELS[i % len(SYNTHETIC_MODELS)]
        out.append(
            node_object(
                f"syn-{i:05d}", rng.choice([64000, 96000, 128000]), 524288, 8, model, card_mib
            )
        )
    return out


def random_pod(name: str, rng: random.Random) -> dict[str, Any]:
    roll = rng.random()
    requests = {"cpu": f"{rng.choice([500, 1000, 2000, 4000])}m", "memory": "2Gi"}
    if roll < 0.6:
        limits = {
            MEMORY: str(rng.randint(1, 20) * 1024),
            COMPUTE: str(rng.choice([100, 200, 300, 500])),
            SLOT: "1",
        }
    elif roll < 0.9:
        limits = {WHOLE: "1"}
    else:
        limits = {WHOLE: str(rng.choice([2, 4]))}
    pod = make_pod(name, requests=requests, limits=limits)
    pod["metadata"]["uid"] = f"uid-{name}"
    return pod


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_ready(
    http: aiohttp.ClientSession, url: str, timeout_s: float = 120.0, poll_s: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            async with http.get(f"{url}/readyz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(poll_s)
    raise RuntimeError("extender never became ready")


# kube-scheduler (Go's encoding/json) writes compact JSON, keys in the struct's order, and
# reads replies into typed structs; the load generator does the same with msgspec, which also
# keeps its own CPU use small (it shares the machine with the extender).
_JSON = {"Content-Type": "application/json"}


class FilterResult(msgspec.Struct):
    NodeNames: list[str] | None
    FailedNodes: dict[str, str] | None
    FailedAndUnresolvableNodes: dict[str, str] | None
    Error: str
    Nodes: Any = None


class HostPriority(msgspec.Struct):
    Host: str
    Score: int


_FILTER_RESULT = msgspec.json.Decoder(FilterResult)
_PRIORITIES = msgspec.json.Decoder(list[HostPriority])


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> bytes:
    async with http.post(url, data=msgspec.json.encode(body), headers=_JSON) as response:
        return await response.read()


async def decide(
    http: aiohttp.ClientSession, url: str, pod: dict[str, Any], names: list[str]
) -> tuple[float, float, list[HostPriority]]:
    start = time.perf_counter()
    filtered = _FILTER_RESULT.decode(
        await post(http, f"{url}/filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
    )
    middle = time.perf_counter()
    passed = filtered.NodeNames or []
    scores: list[HostPriority] = []
    if len(passed) > 1:  # kube-scheduler skips prioritize with one feasible node
        scores = _PRIORITIES.decode(
            await post(http, f"{url}/prioritize", {"Pod": pod, "Nodes": None, "NodeNames": passed})
        )
    elif passed:
        scores = [HostPriority(passed[0], 10)]
    end = time.perf_counter()
    return middle - start, end - middle, scores


async def bind(http: aiohttp.ClientSession, url: str, pod: dict[str, Any], node: str) -> bool:
    """kube-scheduler's bind call; True when the extender bound the pod."""
    body = {
        "PodName": pod["metadata"]["name"],
        "PodNamespace": "default",
        "PodUID": pod["metadata"]["uid"],
        "Node": node,
    }
    async with http.post(f"{url}/bind", json=body) as response:
        return bool((await response.json())["Error"] == "")


async def binds_alone(
    http: aiohttp.ClientSession,
    url: str,
    api: ServerThread,
    names: list[str],
    args: argparse.Namespace,
    rng: random.Random,
    pid: int,
) -> tuple[float, int]:
    """The extender's CPU per bind with nothing else asked of it (ms), and the binds made."""
    pods = [random_pod(f"bind-{i}", rng) for i in range(args.bind_pods)]
    for pod in pods:
        api.store.put("pods", pod)
    await asyncio.sleep(1.0)  # the pods' ADDED events, before anything is measured
    targets = []
    for pod in pods:
        _, _, scores = await decide(http, url, pod, names)
        if scores:
            targets.append((pod, max(scores, key=lambda s: s.Score).Host))
    settle_s = 1.0  # the binds' watch events, handled by the extender
    idle_before = process_cpu_s(pid)
    await asyncio.sleep(settle_s)
    idle_ms = (sum(process_cpu_s(pid)) - sum(idle_before)) * 1000
    cpu_before = process_cpu_s(pid)
    bound = 0
    for pod, node in targets:
        bound += await bind(http, url, pod, node)
    await asyncio.sleep(settle_s)
    spent_ms = (sum(process_cpu_s(pid)) - sum(cpu_before)) * 1000 - idle_ms
    return spent_ms / max(bound, 1), bound


def process_cpu_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


async def drive(
    url: str,
    api: ServerThread,
    names: list[str],
    args: argparse.Namespace,
    seed: int,
    pid: int,
    started: float,
) -> dict[str, Any]:
    rng = random.Random(seed)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
        await wait_ready(http, url, poll_s=0.01)
        ready_s = time.monotonic() - started
        bound = 0
        binding_pair_s = []
        warmup_cpu_before = process_cpu_s(pid)
        for i in range(args.warmup_pods):
            pod = random_pod(f"warm-{i}", rng)
            api.store.put("pods", pod)
            f, p, scores = await decide(http, url, pod, names)
            binding_pair_s.append(f + p)
            if not scores:
                continue
            bound += await bind(http, url, pod, max(scores, key=lambda s: s.Score).Host)
        await asyncio.sleep(1.0)  # the binds' watch events, handled by the extender
        warmup_cpu_ms = (sum(process_cpu_s(pid)) - sum(warmup_cpu_before)) * 1000
        pods = [random_pod(f"bench-{i}", rng) for i in range(args.requests)]
        filter_s, prioritize_s, pair_s = [], [], []
        cpu_before = process_cpu_s(pid)
        for pod in pods:
            f, p, _ = await decide(http, url, pod, names)
            filter_s.append(f)
            prioritize_s.append(p)
            pair_s.append(f + p)
        cpu_after = process_cpu_s(pid)
        user_ms, sys_ms = (
            (b - a) / len(pods) * 1000 for a, b in zip(cpu_before, cpu_after, strict=True)
        )
        queue = list(pods)

        async def worker() -> int:
            done = 0
            while queue:
                await decide(http, url, queue.pop(), names)
                done += 1
            return done

        start = time.perf_counter()
        cpu_before = process_cpu_s(pid)
        own_before = time.process_time()  # this process: the load generator (and idle API)
        done = sum(await asyncio.gather(*(worker() for _ in range(args.concurrency))))
        elapsed = time.perf_counter() - start
        concurrent_ms = (sum(process_cpu_s(pid)) - sum(cpu_before)) / done * 1000
        client_ms = (time.process_time() - own_before) / done * 1000
        bind_alone_ms, bound_alone = await binds_alone(http, url, api, names, args, rng, pid)
    pair_cpu_ms = user_ms + sys_ms
    return {
        "nodes": len(names),
        "time_to_ready_s": round(ready_s, 2),
        "warmup_bound": bound,
        "extender_cpu_ms_per_bind": round(
            (warmup_cpu_ms - args.warmup_pods * pair_cpu_ms) / max(bound, 1), 2
        ),
        "pair_ms_while_binding": _pcts(binding_pair_s),
        "filter_ms": _pcts(filter_s),
        "prioritize_ms": _pcts(prioritize_s),
        "pair_ms": _pcts(pair_s),
        "extender_cpu_ms_per_bind_alone": round(bind_alone_ms, 2),
        "bound_alone": bound_alone,
        "extender_cpu_ms_per_pair": round(user_ms + sys_ms, 2),
        "extender_sys_ms_per_pair": round(sys_ms, 2),  # of which in the kernel (sockets)
        "decisions_per_s": round(done / elapsed, 1),
        "extender_cpu_ms_per_pair_concurrent": round(concurrent_ms, 2),
        "load_generator_cpu_ms_per_pair_concurrent": round(client_ms, 2),
        "concurrency": args.concurrency,
    }


def _pcts(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered) * 1000, 2),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 2),
        "max": round(ordered[-1] * 1000, 2),
    }


def run_cluster(
    label: str, nodes: list[dict[str, Any]], args: argparse.Namespace, seed: int
) -> dict[str, Any]:
    with (
        FakeApiServer(history_size=100_000).run_in_thread() as api,
        tempfile.TemporaryDirectory() as tmp,
    ):
        for node in nodes:
            api.store.put("nodes", node)
        kubeconfig = api.write_kubeconfig(Path(tmp) / "kubeconfig")
        port = free_port()
        # --profile: the extender under cProfile (it exits cleanly on SIGTERM, so the profile
        # is written); one file per cluster.
        profile = (
            ["-m", "cProfile", "-o", f"{args.profile}.{label}", "-m", "kubegpu"]
            if args.profile
            else ["-m", "kubegpu"]
        )
        started = time.monotonic()
        process = subprocess.Popen(
            [
                sys.executable,
                *profile,
                "--log-level",
                "warning",
                "extender",
                "--kubeconfig",
                str(kubeconfig),
                "--port",
                str(port),
                "--policy",
                args.policy,
                # One extender, no kube-scheduler lease to follow: binds are never gated.
                "--leader-lease",
                "none",
            ],
            env=extender_env(args.extender_src),
        )
        try:
            result = asyncio.run(
                drive(
                    f"http://127.0.0.1:{port}",
                    api,
                    [n["metadata"]["name"] for n in nodes],
                    args,
                    seed,
                    process.pid,
                    started,
                )
            )
        finally:
            process.terminate()
            process.wait(timeout=30)
    return {"cluster": label, "policy": args.policy, **result}


def extender_env(src: Path | None) -> dict[str, str]:
    """The extender's environment: this one, or with another checkout's ``src`` first."""
    env = {**os.environ, "NO_PROXY": "*"}
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(src.resolve()), env.get("PYTHONPATH", "")) if p
        )
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes-csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--synthetic-nodes", type=int, default=5000)
    parser.add_argument("--policy", default="kubegpu")
    parser.add_argument("--warmup-pods", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--bind-pods", type=int, default=300)
    parser.add_argument(
        "--extender-src",
        type=Path,
        metavar="PATH",
        help="run the extender from another checkout's src directory (before/after figures)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-openb", action="store_true", help="skip the openb cluster")
    parser.add_argument(
        "--profile", metavar="PREFIX", help="run the extender under cProfile, to PREFIX.<cluster>"
    )
    args = parser.parse_args()
    results = []
    if not args.no_openb and args.nodes_csv.exists():
        results.append(run_cluster("openb", openb_nodes(args.nodes_csv.resolve()), args, 1))
    if args.synthetic_nodes:
        nodes = synthetic_nodes(args.synthetic_nodes, random.Random(2))
        results.append(run_cluster(f"synthetic-{args.synthetic_nodes}", nodes, args, 2))
    report = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "results": results,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{report['date']} on {report['machine']}")
    for r in results:
        print(
            f"{r['cluster']:>16} {r['nodes']:>5} nodes  policy {r['policy']}  "
            f"filter p50/p99 {r['filter_ms']['p50']}/{r['filter_ms']['p99']} ms  "
            f"prioritize {r['prioritize_ms']['p50']}/{r['prioritize_ms']['p99']} ms  "
            f"pair {r['pair_ms']['p50']}/{r['pair_ms']['p99']} ms  "
            f"extender CPU {r['extender_cpu_ms_per_pair']} ms/pair "
            f"({r['extender_sys_ms_per_pair']} system)  "
            f"{r['decisions_per_s']} decisions/s (x{r['concurrency']}, "
            f"{r['extender_cpu_ms_per_pair_concurrent']} ms CPU each)  "
            f"warm-up bound {r['warmup_bound']}, its pairs "
            f"{r['pair_ms_while_binding']['p50']}/{r['pair_ms_while_binding']['p99']} ms  "
            f"extender CPU {r['extender_cpu_ms_per_bind']} ms/bind "
            f"({r['extender_cpu_ms_per_bind_alone']} ms alone, {r['bound_alone']} binds)  "
            f"ready after {r['time_to_ready_s']} s"
        )


if __name__ == "__main__":
    main()
