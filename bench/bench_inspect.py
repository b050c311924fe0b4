"""``kubegpu inspect`` on a 1,000-node fake cluster, end to end over HTTP.

Run from a checkout (about a minute)::

    .venv/bin/python bench/bench_inspect.py             # human-readable
    .venv/bin/python bench/bench_inspect.py --json      # one JSON object

The cluster, in the fake API server (real Kubernetes HTTP, in a forked process): 1,000
nodes with 8 A100 80GB cards each, published inventory annotations; ``--pods`` pods (default
4,000) spread round-robin over the nodes: 40 % shares of one card (extender decision
annotations, 2 to 4 per card), 40 % whole-GPU pods with a decision (1 or 2 cards), 20 % plain
``nvidia.com/gpu`` pods without one, plus 500 CPU-only pods. What each figure measures:

* **inspect -o json, in process**: :func:`kubegpu.inspect.command.inspect_once` — kubeconfig
  resolved, Nodes and Pods listed over HTTP (lightkube, JSON decoding), report built, JSON
  document encoded — i.e. the command without Python start-up. p50 and min of ``--runs``.
* **--node, one node**: the same with ``--node`` naming one node (field-selector lists).
* the same split into **list over HTTP**, **build report**, **encode JSON**, **render table**
  (the plain-text table, as a string).
* **kubegpu inspect -o json, new process**: the installed command as a user runs it, Python
  start-up and imports included (wall time of the subprocess).
* **watch re-render after one change**: build + table render with the watch's per-object
  cache warm and one pod's resourceVersion bumped (what ``--watch`` does per refresh).
* **with exporter usage**: the in-process figure again with ``--usage``: 1,000 ``/metrics``
  pages (8 GPUs and the node's pods each, made by prometheus_client) served by one aiohttp
  server on 127.0.0.1 (another forked process), fetched 64 at a time under the 2 s deadline,
  parsed and joined.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kubegpu.inspect.command import InspectOptions, build_cluster_report, inspect_once
from kubegpu.inspect.model import ReadCache, build_report
from kubegpu.inspect.render import render_text, report_to_json
from kubegpu.inspect.report import Filters
from kubegpu.kube.cluster_reader import list_cluster, make_client
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    INVENTORY_ANNOTATION,
    AllocationDecision,
    CardShare,
    ContainerAllocation,
    GpuRecord,
    NodeGpuInventory,
    encode_allocation,
    encode_inventory,
)
from kubegpu.testing.apiserver import FakeApiServer, make_namespace, make_node, make_pod
from kubegpu.testing.kubeconfig import write_kubeconfig

CARDS = 8
CARD_MIB = 81920
MODEL = "NVIDIA A100-SXM4-80GB"
NAMESPACES = ("ml", "web", "batch", "research")


def uuid(node: int, card: int) -> str:
    return f"GPU-{node:05d}-{card}"


def node_json(n: int) -> dict[str, Any]:
    inventory = NodeGpuInventory(
        tuple(GpuRecord(uuid(n, c), c, MODEL, CARD_MIB, True) for c in range(CARDS))
    )
    node = make_node(
        f"gpu-{n:05d}",
        extended={"nvidia.com/gpu": str(CARDS), "kubegpu.io/gpu-shared": str(4 * CARDS)},
        annotations={INVENTORY_ANNOTATION: encode_inventory(inventory)},
    )
    node["status"]["addresses"].insert(
        0, {"type": "InternalIP", "address": f"10.1.{n // 250}.{n % 250}"}
    )
    return node


def decided(
    name: str, ns: str, node: str, cards: tuple[CardShare, ...], shared: bool
) -> dict[str, Any]:
    decision = AllocationDecision(
        node,
        cards,
        (ContainerAllocation("main", False, cards),),
        "2026-11-22T00:00:00Z",
        "binpack",
        shared,
    )
    if shared:
        limits = {
            "kubegpu.io/gpu-memory": str(cards[0].memory_mib),
            "kubegpu.io/gpu-compute": str(cards[0].compute_milli),
            "kubegpu.io/gpu-shared": "1",
        }
    else:
        limits = {"nvidia.com/gpu": str(len(cards))}
    return make_pod(
        name,
        ns,
        limits=limits,
        node_name=node,
        annotations={ALLOCATION_ANNOTATION: encode_allocation(decision)},
    )


def cluster(nodes: int, pods: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Node and pod JSON; each node's cards fill from index 0: shares first (up to 4 per card),
    then whole cards, and plain pods are assumed on the highest free ones."""
    node_docs = [node_json(n) for n in range(nodes)]
    next_card = [0] * nodes
    shares_on = [0] * nodes
    pod_docs: list[dict[str, Any]] = []
    for i in range(pods):
        n = i % nodes
        node = f"gpu-{n:05d}"
        ns = NAMESPACES[i % len(NAMESPACES)]
        kind = i % 10
        if kind < 4 and next_card[n] < CARDS:  # a share: 2..4 per card
            card = next_card[n]
            memory = 8192 + 4096 * (i % 3)
            share = CardShare(uuid(n, card), card, 150 + 50 * (i % 3), memory)
            pod_docs.append(decided(f"share-{i}", ns, node, (share,), True))
            shares_on[n] += 1
            if shares_on[n] % (2 + i % 3) == 0:
                next_card[n] += 1
        elif kind < 8 and next_card[n] + 2 <= CARDS:  # whole cards with a decision
            count = 1 + i % 2
            cards = tuple(
                CardShare(uuid(n, c), c, 1000, CARD_MIB)
                for c in range(next_card[n], next_card[n] + count)
            )
            next_card[n] += count
            pod_docs.append(decided(f"whole-{i}", ns, node, cards, False))
        else:  # plain nvidia.com/gpu, placed by another scheduler
            pod_docs.append(
                make_pod(f"plain-{i}", ns, limits={"nvidia.com/gpu": "1"}, node_name=node)
            )
    for i in range(500):
        pod_docs.append(
            make_pod(f"cpu-{i}", "web", requests={"cpu": "1"}, node_name=f"gpu-{i % nodes:05d}")
        )
    for pod in pod_docs:
        pod["status"] = {"phase": "Running"}
    return node_docs, pod_docs


# --------------------------------------------------------------------------- exporters
def metrics_page(node: str, n: int, pods: list[dict[str, Any]]) -> bytes:
    labels = ["node", "gpu", "uuid", "model"]

    class _Collector(Collector):
        def collect(self) -> Iterator[GaugeMetricFamily]:
            used = GaugeMetricFamily("kubegpu_gpu_memory_used_bytes", "used", labels=labels)
            util = GaugeMetricFamily("kubegpu_gpu_utilization_ratio", "util", labels=labels)
            for c in range(CARDS):
                used.add_metric([node, str(c), uuid(n, c), MODEL], float(c * 2**30))
                util.add_metric([node, str(c), uuid(n, c), MODEL], 0.1 * c)
            pod_used = GaugeMetricFamily(
                "kubegpu_pod_gpu_memory_used_bytes", "pod", labels=["namespace", "pod", *labels]
            )
            for pod in pods:
                meta = pod["metadata"]
                pod_used.add_metric(
                    [meta["namespace"], meta["name"], node, "0", uuid(n, 0), MODEL], 2.0**30
                )
            yield from (used, util, pod_used)

    registry = CollectorRegistry()
    registry.register(_Collector())
    return generate_latest(registry)


def _serve_exporters(pages: dict[str, bytes], conn: Connection) -> None:
    async def handle(request: web.Request) -> web.Response:
        page = pages.get(request.match_info["node"])
        if page is None:
            raise web.HTTPNotFound()
        return web.Response(body=page, content_type="text/plain")

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/{node}/metrics", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048)
        await site.start()
        conn.send(f"http://127.0.0.1:{runner.addresses[0][1]}")
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await runner.cleanup()

    asyncio.run(serve())


def _serve_apiserver(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], conn: Connection
) -> None:
    with FakeApiServer().run_in_thread() as server:
        for ns in {*NAMESPACES, "web"}:
            server.store.put("namespaces", make_namespace(ns))
        for node in nodes:
            server.store.put("nodes", node)
        for pod in pods:
            server.store.put("pods", pod)
        conn.send(server.url)
        conn.recv()


@contextmanager
def child(target: Callable[..., None], *args: Any) -> Iterator[str]:
    """Run a server in a forked process (its own interpreter lock, as a real API server or
    exporter would have its own machine); yields the URL it reports."""
    parent_end, child_end = multiprocessing.Pipe()
    process = multiprocessing.get_context("fork").Process(
        target=target, args=(*args, child_end), daemon=True
    )
    process.start()
    try:
        if not parent_end.poll(120):
            raise RuntimeError(f"{target.__name__} did not start")
        yield str(parent_end.recv())
    finally:
        parent_end.send("stop")
        process.join(30)
        if process.is_alive():
            process.kill()


# --------------------------------------------------------------------------- timing
def timed(runs: int, fn: Callable[[], Any]) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def summary(samples: list[float]) -> dict[str, float]:
    return {"p50_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples)}


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "load_average_1m": os.getloadavg()[0],
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    node_docs, pod_docs = cluster(args.nodes, args.pods)
    results: dict[str, Any] = {"machine": machine(), "nodes": args.nodes, "pods": len(pod_docs)}
    with (
        child(_serve_apiserver, node_docs, pod_docs) as api_url,
        tempfile.TemporaryDirectory() as tmp,
    ):
        kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", api_url)
        off = InspectOptions(output="json", usage=False)

        def once(options: InspectOptions) -> Any:
            report = asyncio.run(inspect_once(make_client(kubeconfig), options))
            return json.dumps(report_to_json(report))

        one_node = InspectOptions(
            output="json", usage=False, filters=Filters(nodes=(f"gpu-{args.nodes // 2:05d}",))
        )
        encoded = once(off)  # warm-up (imports, first connection)
        results["in_process_json_one_node"] = summary(timed(args.runs, lambda: once(one_node)))
        results["json_bytes"] = len(encoded)
        results["in_process_json"] = summary(timed(args.runs, lambda: once(off)))

        async def listing() -> Any:
            connection = make_client(kubeconfig)
            try:
                return await list_cluster(connection.client, connection.server_url)
            finally:
                await connection.client.close()

        holder: dict[str, Any] = {}
        results["list_over_http"] = summary(
            timed(args.runs, lambda: holder.update(listing=asyncio.run(listing())))
        )
        listed = holder["listing"]

        def build() -> None:
            holder["report"] = asyncio.run(build_cluster_report(listed.nodes, listed.pods, off))[0]

        results["build_report"] = summary(timed(args.runs, build))
        report = holder["report"]
        results["report"] = {
            "gpu_nodes": report.totals.nodes,
            "gpus": report.totals.gpus,
            "pods_on_gpus": report.totals.pods,
            "pending": len(report.pending),
            "warnings": len(report.warnings),
        }
        results["encode_json"] = summary(
            timed(args.runs, lambda: json.dumps(report_to_json(report)))
        )

        def tables() -> None:
            render_text(report)

        results["render_table"] = summary(timed(args.runs, tables))

        # --watch: one pod changed since the last render; the cache holds every other reading.
        cache = ReadCache()
        build_report(listed.nodes, listed.pods, cache=cache)
        changed = [dict(p) for p in listed.pods]

        def rerender() -> None:
            meta = dict(changed[0]["metadata"])
            meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
            changed[0] = {**changed[0], "metadata": meta}
            render_text(build_report(listed.nodes, changed, cache=cache))

        results["watch_rerender_one_change"] = summary(timed(args.runs, rerender))

        command = shutil.which("kubegpu", path=str(Path(sys.executable).parent))
        if command:
            env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

            def subprocess_run() -> None:
                subprocess.run(
                    [command, "inspect", "-o", "json", "--no-usage"],
                    env=env,
                    check=True,
                    stdout=subprocess.DEVNULL,
                )

            results["new_process_json"] = summary(timed(args.runs, subprocess_run))

        by_node: dict[str, list[dict[str, Any]]] = {}
        for pod in pod_docs:
            by_node.setdefault(pod["spec"].get("nodeName", ""), []).append(pod)
        pages = {
            f"gpu-{n:05d}": metrics_page(f"gpu-{n:05d}", n, by_node.get(f"gpu-{n:05d}", []))
            for n in range(args.nodes)
        }
        results["metrics_page_bytes"] = len(next(iter(pages.values())))
        with child(_serve_exporters, pages) as base:
            on = InspectOptions(output="json", usage=True, url_template=base + "/{node}/metrics")
            report_with = asyncio.run(inspect_once(make_client(kubeconfig), on))
            results["usage_answered"] = sum(1 for n in report_with.nodes if n.usage.value == "ok")
            results["in_process_json_with_usage"] = summary(timed(args.runs, lambda: once(on)))

    if args.json:
        print(json.dumps(results, indent=2))
        return
    m = results["machine"]
    print(f"machine: {m['cpus']} CPUs, {m['cpu_model']}, Python {m['python']}, {m['system']}")
    print(f"date: {m['date_utc']}, load average {m['load_average_1m']:.1f}")
    print(
        f"cluster: {results['nodes']} nodes x {CARDS} GPUs, {results['pods']} pods; "
        f"{results['report']}"
    )
    for key in (
        "in_process_json",
        "in_process_json_one_node",
        "list_over_http",
        "build_report",
        "encode_json",
        "render_table",
        "watch_rerender_one_change",
        "new_process_json",
        "in_process_json_with_usage",
    ):
        if key in results:
            r = results[key]
            print(
                f"{key:28} p50 {r['p50_s'] * 1000:8.1f} ms  min {r['min_s'] * 1000:8.1f} ms"
                f"  max {r['max_s'] * 1000:8.1f} ms"
            )
    print(
        f"JSON document: {results['json_bytes'] / 1e6:.1f} MB; "
        f"exporters answered: {results['usage_answered']}/{results['nodes']}"
    )


if __name__ == "__main__":
    main()
