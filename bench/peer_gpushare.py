"""kubegpu's scheduler extender beside Alibaba's gpushare extender, on one real API server.

Run from a checkout (as root or not; needs Go for the peer's build and the e2e suite's Kubernetes
binaries, which ``e2e/components/build.sh`` builds into ``~/.cache/kubegpu-e2e`` on first use)::

    git clone https://github.com/AliyunContainerService/gpushare-scheduler-extender ../gpushare
    .venv/bin/python bench/peer_gpushare.py --peer-source ../gpushare
    .venv/bin/python bench/peer_gpushare.py --peer-source ../gpushare --nodes 10 --pods 300 \\
        --kubegpu-policy kubegpu,binpack --peer-choice first-fit,spread --json out.json

Never run in CI. Options (defaults in brackets):

* ``--peer-source DIR``: a checkout of gpushare-scheduler-extender. Its ``cmd`` is built with
  ``go build`` (``GOFLAGS=-mod=mod``, dependencies from the Go module proxy, at nice 19) from a
  copy of the checkout into ``--cache-dir``/``gpushare-<hash>/`` [``~/.cache/kubegpu-bench``],
  the hash over its Go sources, go.mod, go.sum and the Go version; reused when there.
* ``--nodes`` [50] nodes of ``--cards`` [8] cards, each ``--model`` [NVIDIA H100 80GB HBM3] with
  ``--card-mib`` [81559] MiB (what the driver reports for that card). kubegpu reads the MiB;
  gpushare's nodes show ``aliyun.com/gpu-mem`` = cards x the MiB rounded down to GiB (79), as its
  device plugin counts, and ``aliyun.com/gpu-count`` = cards. With whole-GiB pods both can put
  at most 79 GiB on a card.
* ``--pods`` [2000] pods, one container each asking ``aliyun.com/gpu-mem: N`` (GiB), N drawn
  with ``random.Random(--seed)`` [42] from ``--sizes`` [``1-8:4,9-24:3,25-40:2,41-79:1``]: bands
  ``LOW-HIGH:WEIGHT`` (or ``N:WEIGHT``; weight 1 when left out), a band picked by weight, then N
  uniform in it. The default is weighted to small shares the way gpushare's samples are (2-3
  GiB), with some large ones: 40 % 1-8 GiB, 30 % 9-24, 20 % 25-40, 10 % 41-79 (half a card to a
  whole one); mean about 19 GiB, so 2,000 pods ask about 122 % of 50 x 8 x 79 GiB and every
  extender meets a pod it cannot place. ``--sizes 1-40`` is uniform 1-40 GiB. Same sequence for
  every row.
* ``--kubegpu-policy`` [kubegpu]: a comma list of placement policies (binpack, spread, fgd,
  kubegpu), one kubegpu row each, ``kubegpu extender --peer-compat aliyun --policy P``.
* ``--peer-choice`` [first-fit]: a comma list of ``first-fit``, ``spread`` (or ``none``), one
  gpushare row each. gpushare has no prioritize verb, so the node among those its filter passes
  is kube-scheduler's own choice: ``first-fit`` takes the first in name order (the peer's best
  case for packing); ``spread`` the one with the most free ``aliyun.com/gpu-mem`` (kube-
  scheduler's LeastAllocated, were that resource in its scoring list; by default it scores CPU
  and memory only). Ties: first in name order. gpushare then picks the card itself at bind: the
  one with the least free memory that fits.
* ``--peer-log-level`` [warn]: gpushare's LOG_LEVEL (its shipped manifest says debug, which logs
  every pod in full); kubegpu's extender runs at ``--log-level warning``.
* ``--json PATH``: the whole report (per row also every pod's node, None when refused).
* ``--k8s-bin DIR``: etcd and kube-apiserver [KUBEGPU_E2E_BIN, else the e2e suite's cache].
* ``--keep-work``: keep the work folder (certificates, etcd data, every process's log), which is
  otherwise removed after a run that succeeded.

What runs: etcd and kube-apiserver on loopback ports (``bench/peer_cluster.py``), nothing else of
Kubernetes. Each row runs alone on a fresh cluster state: its nodes are created (the same names,
``node-000``...), then its pods, all Pending, in a namespace of its own (``bench-kubegpu-<policy>``,
``bench-gpushare-<choice>``); then its extender starts, with the cluster admin's kubeconfig, and
the bench plays kube-scheduler, one pod at a time in order, ``percentageOfNodesToScore: 100``:

1. ``filter`` with every node name (``nodeCacheCapable``, as both extenders' shipped scheduler
   configs say);
2. kubegpu only: ``prioritize`` with the nodes that passed when more than one did (kube-
   scheduler skips it for one), and the highest score; ties go to the first in name order
   (kube-scheduler picks one of the tied nodes at random);
3. ``bind`` through the extender's bind verb (both bind: their scheduler configs name a
   bindVerb). A pod no node passes is refused and the bench goes on: later, smaller pods may
   still fit.

Then the pods are read back from the API server: each bound pod's card from the extender's own
record (kubegpu's ``kubegpu.io/gpu-allocation``, gpushare's ``ALIYUN_COM_GPU_MEM_IDX``) and its
memory from its spec; no card may hold more than its memory. The extender is stopped and the
row's pods and nodes deleted.

Figures per row: the first refused pod (1-based number in the sequence), pods placed, nodes with
a pod, the share of all cards' memory (MiB) held by bound pods at the first refusal and at the
end, cards over-committed, latency of each verb at the client (HTTP and JSON included, one
request at a time; p50/p99 ms), and the extender process's CPU seconds over the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

# Run as a script, this folder is on sys.path: the extender bench's wire structs serve both.
from bench_extender import FilterResult, HostPriority, post, process_cpu_s
from peer_cluster import (
    PEER_CARD_INDEX,
    PEER_POD_MEMORY,
    ControlPlane,
    Extender,
    create_namespace,
    create_nodes,
    create_pods,
    delete_nodes,
    delete_pods,
    k8s_bin_dir,
    list_pods,
    peer_binary,
    source_commit,
    start_kubegpu,
    start_peer,
)

from kubegpu.sharing.claim import read_decision
from kubegpu.sharing.peers import ALIYUN_MEMORY

DEFAULT_SIZES = "1-8:4,9-24:3,25-40:2,41-79:1"
PEER_CHOICES = ("first-fit", "spread")
_FILTER = msgspec.json.Decoder(FilterResult)
_PRIORITIES = msgspec.json.Decoder(list[HostPriority])


# --------------------------------------------------------------------------- pure parts
@dataclass(frozen=True)
class SizeBand:
    low: int
    high: int
    weight: float


def parse_sizes(spec: str) -> list[SizeBand]:
    """``LOW-HIGH:WEIGHT`` or ``N:WEIGHT`` bands, comma-separated (weight 1 when left out);
    ValueError naming the part that is not one."""
    bands: list[SizeBand] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        span, _, weight = part.partition(":")
        low, _, high = span.partition("-")
        try:
            band = SizeBand(int(low), int(high or low), float(weight or 1))
        except ValueError:
            raise ValueError(f"--sizes: {part!r} is not LOW-HIGH[:WEIGHT] in GiB") from None
        if not 1 <= band.low <= band.high or band.weight <= 0:
            raise ValueError(f"--sizes: {part!r} needs 1 <= LOW <= HIGH and a weight above 0")
        bands.append(band)
    if not bands:
        raise ValueError("--sizes: no band")
    return bands


def draw_sizes(bands: Sequence[SizeBand], count: int, seed: int) -> list[int]:
    """``count`` pod sizes in GiB: a band by weight, then uniform in it."""
    rng = random.Random(seed)
    weights = [b.weight for b in bands]
    sizes = []
    for _ in range(count):
        band = rng.choices(bands, weights)[0]
        sizes.append(rng.randint(band.low, band.high))
    return sizes


@dataclass(frozen=True)
class Placement:
    """A bound pod's card by the extender's record, and its memory by its spec."""

    pod: str
    node: str
    card: int
    mib: int


def overcommitted(placements: Iterable[Placement], cards: int, card_mib: int) -> list[str]:
    """Cards holding more memory than they have, and placements on a card the node lacks."""
    held: dict[tuple[str, int], int] = defaultdict(int)
    problems = []
    for p in placements:
        if not 0 <= p.card < cards:
            problems.append(f"{p.pod}: card {p.card} on {p.node}, which has {cards}")
        held[(p.node, p.card)] += p.mib
    problems += [
        f"{node} card {card}: {mib} MiB held of {card_mib}"
        for (node, card), mib in sorted(held.items())
        if mib > card_mib
    ]
    return problems


def latency_ms(values_s: Sequence[float]) -> dict[str, float] | None:
    """p50 and p99 of ``values_s`` (seconds) in ms; None when there is none."""
    if not values_s:
        return None
    ordered = sorted(values_s)
    return {
        "p50": round(statistics.median(ordered) * 1000, 2),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 2),
    }


def _pair(figures: Mapping[str, float] | None) -> str:
    return f"{figures['p50']:.2f} / {figures['p99']:.2f}" if figures else "–"


TABLE_COLUMNS = (
    "extender",
    "first refusal (pod #)",
    "pods placed",
    "nodes used",
    "memory used at first refusal",
    "memory used at end",
    "cards over-committed",
    "filter p50 / p99 ms",
    "prioritize p50 / p99 ms",
    "bind p50 / p99 ms",
    "extender CPU s",
)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a Markdown table (the columns of ``TABLE_COLUMNS``)."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for r in rows:
        refusal = r["first_refusal"]
        at_refusal = r["memory_pct_at_first_refusal"]
        cells = [
            r["label"],
            "none" if refusal is None else f"{refusal:,}",
            f"{r['placed']:,} / {r['pods']:,}",
            f"{r['nodes_used']} / {r['nodes']}",
            "–" if at_refusal is None else f"{at_refusal:.2f} %",
            f"{r['memory_pct_at_end']:.2f} %",
            str(len(r["overcommitted"])),
            _pair(r["filter_ms"]),
            _pair(r["prioritize_ms"]),
            _pair(r["bind_ms"]),
            f"{r['extender_cpu_s']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> str:
    """CPU model and count, from /proc/cpuinfo."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


# --------------------------------------------------------------------------- one row
@dataclass(frozen=True)
class Row:
    label: str  # as the table names it
    namespace: str
    kubegpu: bool
    choice: str  # kubegpu: its policy; gpushare: first-fit or spread


@dataclass(frozen=True)
class Cluster:
    nodes: tuple[str, ...]  # in name order
    cards: int
    model: str
    card_mib: int

    @property
    def peer_node_gib(self) -> int:
        return self.cards * (self.card_mib // 1024)

    @property
    def total_mib(self) -> int:
        return len(self.nodes) * self.cards * self.card_mib


def _choose(
    row: Row, passed: list[str], scores: list[HostPriority], free_gib: Mapping[str, int]
) -> str:
    if row.kubegpu:
        if not scores:
            return passed[0]
        order = {n: i for i, n in enumerate(passed)}
        best: str = min(scores, key=lambda s: (-s.Score, order.get(s.Host, len(order)))).Host
        return best
    if row.choice == "spread":
        return min(passed, key=lambda n: (-free_gib[n], n))
    return passed[0]


async def _wait_ready(http: aiohttp.ClientSession, extender: Extender) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if not extender.process.running:
            raise RuntimeError(f"{extender.process.name} exited; see {extender.process.log}")
        try:
            async with http.get(extender.base + extender.ready_path) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.25)
    raise RuntimeError(f"{extender.process.name} never became ready; see {extender.process.log}")


async def schedule(
    extender: Extender,
    row: Row,
    cluster: Cluster,
    pods: Sequence[Mapping[str, Any]],
    sizes: Sequence[int],
) -> dict[str, Any]:
    """Play kube-scheduler for ``pods`` (as the API server returned them at creation) in order
    against ``extender``."""
    names = list(cluster.nodes)
    used_gib: dict[str, int] = dict.fromkeys(names, 0)
    filter_s: list[float] = []
    prioritize_s: list[float] = []
    bind_s: list[float] = []
    chosen: list[str | None] = []
    bind_errors: list[str] = []
    first_refusal: int | None = None
    at_refusal_gib = 0
    async with aiohttp.ClientSession() as http:
        await _wait_ready(http, extender)
        cpu_before = sum(process_cpu_s(extender.pid))
        started = time.perf_counter()
        for number, (pod_json, gib) in enumerate(zip(pods, sizes, strict=True), start=1):
            name, uid = pod_json["metadata"]["name"], pod_json["metadata"]["uid"]
            t0 = time.perf_counter()
            body = {"Pod": pod_json, "Nodes": None, "NodeNames": names}
            filtered = _FILTER.decode(await post(http, extender.verb("filter"), body))
            t1 = time.perf_counter()
            filter_s.append(t1 - t0)
            if filtered.Error:
                raise RuntimeError(f"{row.label}: filter of {name}: {filtered.Error}")
            passed = sorted(filtered.NodeNames or [])
            if not passed:
                chosen.append(None)
                if first_refusal is None:
                    first_refusal = number
                    at_refusal_gib = sum(used_gib.values())
                continue
            scores: list[HostPriority] = []
            if row.kubegpu and len(passed) > 1:
                t1 = time.perf_counter()
                body = {"Pod": pod_json, "Nodes": None, "NodeNames": passed}
                scores = _PRIORITIES.decode(await post(http, extender.verb("prioritize"), body))
                prioritize_s.append(time.perf_counter() - t1)
            free = {n: cluster.peer_node_gib - used_gib[n] for n in passed}
            node = _choose(row, passed, scores, free)
            t2 = time.perf_counter()
            args = {"PodName": name, "PodNamespace": row.namespace, "PodUID": uid, "Node": node}
            reply = json.loads(await post(http, extender.verb("bind"), args) or b"{}")
            bind_s.append(time.perf_counter() - t2)
            if reply.get("Error"):
                bind_errors.append(f"{name} on {node}: {reply['Error']}")
                chosen.append(None)
                continue
            used_gib[node] += gib
            chosen.append(node)
        wall_s = time.perf_counter() - started
        cpu_s = sum(process_cpu_s(extender.pid)) - cpu_before
    return {
        "chosen": chosen,
        "first_refusal": first_refusal,
        "at_refusal_mib": at_refusal_gib * 1024,
        "bind_errors": bind_errors,
        "filter_ms": latency_ms(filter_s),
        "prioritize_ms": latency_ms(prioritize_s),
        "bind_ms": latency_ms(bind_s),
        "extender_cpu_s": round(cpu_s, 2),
        "wall_s": round(wall_s, 1),
        "pods_per_s": round(len(pods) / wall_s, 1),
    }


def placements(row: Row, pods: Sequence[Mapping[str, Any]]) -> tuple[list[Placement], list[str]]:
    """Every bound pod's card by the extender's record; problems: a bound pod with none, or a
    record naming another node."""
    found: list[Placement] = []
    problems: list[str] = []
    for pod in pods:
        name = pod["metadata"]["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            continue
        gib = int(pod["spec"]["containers"][0]["resources"]["limits"][ALIYUN_MEMORY])
        card: int | None = None
        if row.kubegpu:
            decision, problem = read_decision(pod)
            if decision is not None and decision.node == node and len(decision.cards) == 1:
                card = decision.cards[0].index
            else:
                problems.append(f"{name}: bound to {node}, decision {decision or problem}")
        else:
            annotations = pod["metadata"].get("annotations") or {}
            raw = annotations.get(PEER_CARD_INDEX)
            if raw is not None and raw.lstrip("-").isdigit():
                card = int(raw)
            else:
                problems.append(f"{name}: bound to {node}, {PEER_CARD_INDEX} {raw!r}")
            if annotations.get(PEER_POD_MEMORY) != str(gib):
                said = annotations.get(PEER_POD_MEMORY)
                problems.append(f"{name}: asks {gib} GiB, {PEER_POD_MEMORY} {said!r}")
        if card is not None:
            found.append(Placement(name, node, card, gib * 1024))
    return found, problems


async def run_row(
    plane: ControlPlane,
    row: Row,
    cluster: Cluster,
    sizes: Sequence[int],
    peer: Path | None,
    peer_log_level: str,
) -> dict[str, Any]:
    client = plane.client()
    extender: Extender | None = None
    try:
        await create_namespace(client, row.namespace)
        await create_nodes(
            client,
            cluster.nodes,
            kubegpu=row.kubegpu,
            cards=cluster.cards,
            model=cluster.model,
            card_mib=cluster.card_mib,
        )
        created = await create_pods(client, row.namespace, sizes, kubegpu=row.kubegpu)
        if row.kubegpu:
            extender = start_kubegpu(plane, row.choice)
        else:
            assert peer is not None
            extender = start_peer(plane, peer, peer_log_level)
        print(f"{row.label}: {len(created)} pods on {len(cluster.nodes)} nodes ...", flush=True)
        outcome = await schedule(extender, row, cluster, created, sizes)
        peak_rss_mib = _peak_rss_mib(extender.pid)
        extender.stop()
        extender = None
        pods = await list_pods(client, row.namespace)
        found, problems = placements(row, pods)
        bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
        for pod, node in zip(created, outcome["chosen"], strict=True):
            name = pod["metadata"]["name"]
            if bound.get(name) != node:
                problems.append(f"{name}: bench saw {node}, API server says {bound.get(name)}")
        await delete_pods(client, row.namespace)
        await delete_nodes(client, cluster.nodes)
    finally:
        if extender is not None:
            extender.stop()
        await client.close()
    placed = sum(1 for n in outcome["chosen"] if n)
    used_mib = sum(p.mib for p in found)
    at_refusal = outcome.pop("at_refusal_mib")
    return {
        "label": row.label,
        "extender": "kubegpu" if row.kubegpu else "gpushare",
        "choice": row.choice,
        "pods": len(sizes),
        "nodes": len(cluster.nodes),
        "placed": placed,
        "nodes_used": len({p.node for p in found}),
        "memory_pct_at_first_refusal": None
        if outcome["first_refusal"] is None
        else round(100 * at_refusal / cluster.total_mib, 2),
        "memory_pct_at_end": round(100 * used_mib / cluster.total_mib, 2),
        "overcommitted": overcommitted(found, cluster.cards, cluster.card_mib),
        "record_problems": problems,
        "cards_by_pods_held": dict(Counter(Counter((p.node, p.card) for p in found).values())),
        "extender_peak_rss_mib": peak_rss_mib,
        **outcome,
    }


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


# --------------------------------------------------------------------------- command line
def rows_of(policies: str, choices: str) -> list[Row]:
    rows = [
        Row(f"kubegpu ({p})", f"bench-kubegpu-{p}", True, p)
        for p in dict.fromkeys(x.strip() for x in policies.split(",") if x.strip())
    ]
    for choice in dict.fromkeys(x.strip() for x in choices.split(",") if x.strip()):
        if choice == "none":
            continue
        if choice not in PEER_CHOICES:
            raise SystemExit(f"--peer-choice: {choice!r} is not one of {', '.join(PEER_CHOICES)}")
        rows.append(Row(f"gpushare ({choice})", f"bench-gpushare-{choice}", False, choice))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer-source", type=Path, help="a gpushare-scheduler-extender checkout")
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--model", default="NVIDIA H100 80GB HBM3")
    parser.add_argument("--card-mib", type=int, default=81559)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="LOW-HIGH:WEIGHT,... in GiB")
    parser.add_argument("--kubegpu-policy", default="kubegpu", help="comma list")
    parser.add_argument("--peer-choice", default="first-fit", help="first-fit,spread or none")
    parser.add_argument("--peer-log-level", default="warn", help="debug, info, warn or error")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache/kubegpu-bench")
    parser.add_argument("--k8s-bin", type=Path, help="folder with etcd and kube-apiserver")
    parser.add_argument("--json", type=Path, metavar="PATH")
    parser.add_argument("--keep-work", action="store_true")
    args = parser.parse_args()
    try:
        sizes = draw_sizes(parse_sizes(args.sizes), args.pods, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    rows = rows_of(args.kubegpu_policy, args.peer_choice)
    peer: Path | None = None
    commit = ""
    if any(not r.kubegpu for r in rows):
        if args.peer_source is None:
            parser.error("--peer-source is needed for the gpushare rows (or --peer-choice none)")
        peer = peer_binary(args.peer_source.resolve(), args.cache_dir.expanduser())
        commit = source_commit(args.peer_source)
    cluster = Cluster(
        tuple(f"node-{i:03d}" for i in range(args.nodes)), args.cards, args.model, args.card_mib
    )
    started = datetime.datetime.now(datetime.UTC)
    load = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="kubegpu-bench-peer-"))
    plane = ControlPlane(args.k8s_bin or k8s_bin_dir(), work)
    results = []
    try:
        plane.start()
        for row in rows:
            results.append(
                asyncio.run(run_row(plane, row, cluster, sizes, peer, args.peer_log_level))
            )
    except BaseException:
        print(f"failed; logs kept in {work / 'logs'}", file=sys.stderr)
        raise
    finally:
        plane.stop()
    asked_pct = round(100 * sum(sizes) * 1024 / cluster.total_mib, 1)
    report = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "load_average_at_start": [round(x, 2) for x in load],
        "command": " ".join(sys.argv),
        "kubernetes_bin": str(plane.bin_dir),
        "peer": {"source": str(args.peer_source or ""), "commit": commit, "binary": str(peer)},
        "cluster": {
            "nodes": args.nodes,
            "cards": args.cards,
            "model": args.model,
            "card_mib": args.card_mib,
            "peer_card_gib": args.card_mib // 1024,
        },
        "pods": {
            "count": args.pods,
            "seed": args.seed,
            "sizes": args.sizes,
            "asked_gib": sum(sizes),
            "asked_pct_of_memory": asked_pct,
        },
        "rows": results,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.keep_work:
        print(f"work folder kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{report['date']}, {report['machine']}, load average {load[0]:.2f} at start")
    print(
        f"{args.nodes} nodes x {args.cards} x {args.model} ({args.card_mib} MiB); "
        f"{args.pods} pods, sizes {args.sizes}, seed {args.seed}: "
        f"{sum(sizes):,} GiB asked, {asked_pct} % of card memory"
    )
    print(format_table(results))
    for r in results:
        for problem in (r["overcommitted"] + r["record_problems"] + r["bind_errors"])[:10]:
            print(f"{r['label']}: {problem}")


if __name__ == "__main__":
    main()
