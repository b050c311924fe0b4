"""``kubectl inspect gpushare``: the inspect report in Alibaba gpushare's column layout, for
admins moving over from it (shared/specs/peers/gpu-sharing-systems.md §4.6).

Installed as the kubectl plugin ``kubectl-inspect-gpushare``: kubectl runs it for
``kubectl inspect gpushare [NODE] [-d]``. The figures are kubegpu's (every pod on a card,
kubegpu-style and peer-style alike, from the extender's decisions), shown as gpushare shows
them: per card ``Allocated/Total`` in one memory unit (GiB by default), pods bound without a
card in ``PENDING(Allocated)``, and the cluster's allocated/total. Like gpushare's it shows
allocations, never real usage (``kubectl gpu inspect`` has that). Exit codes as
``kubectl gpu inspect``: 0 shown, 1 the cluster could not be read, 2 bad usage.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import Any

import click

from kubegpu.inspect.report import Filters, InspectReport, NodeView
from kubegpu.sharing.peers import MIB_PER_UNIT


def _amount(mib: int, unit_mib: int) -> str:
    """MiB in the unit: whole numbers as gpushare prints them, a tenth where a kubegpu-style
    share is not a whole number of units."""
    if mib % unit_mib == 0:
        return str(mib // unit_mib)
    return f"{mib / unit_mib:.1f}"


def _percent(part: int, whole: int) -> int:
    return int(part * 100 / whole) if whole else 0


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _pending_mib(node: NodeView) -> int:
    return sum(p.memory_mib for p in node.unplaced)


def render_summary(report: InspectReport, unit: str = "GiB") -> str:
    unit_mib = MIB_PER_UNIT[unit]
    nodes = [n for n in report.nodes if n.cards]
    if not nodes:
        return "No GPU node found\n"
    width = max(len(n.cards) for n in nodes)
    pending = any(_pending_mib(n) for n in nodes)
    header = ["NAME", "IPADDRESS"]
    header += [f"GPU{i}(Allocated/Total)" for i in range(width)]
    header += ["PENDING(Allocated)"] if pending else []
    header += [f"GPU Memory({unit})"]
    rows = [header]
    allocated = total = 0
    for node in nodes:
        cards = sorted(node.cards, key=lambda c: c.index)
        row = [node.name, node.address]
        row += [
            f"{_amount(c.allocated_memory_mib, unit_mib)}/{_amount(c.memory_mib, unit_mib)}"
            for c in cards
        ]
        row += [""] * (width - len(cards))
        node_pending = _pending_mib(node)
        row += [_amount(node_pending, unit_mib)] if pending else []
        node_allocated = sum(c.allocated_memory_mib for c in cards) + node_pending
        node_total = sum(c.memory_mib for c in cards)
        row += [f"{_amount(node_allocated, unit_mib)}/{_amount(node_total, unit_mib)}"]
        rows.append(row)
        allocated += node_allocated
        total += node_total
    lines = _table(rows)
    lines.append("-" * max(len(line) for line in lines))
    lines.append(
        "Allocated/Total GPU Memory In Cluster: "
        f"{_amount(allocated, unit_mib)}/{_amount(total, unit_mib)} "
        f"({_percent(allocated, total)}%)"
    )
    return "\n".join(lines) + "\n"


def render_details(report: InspectReport, unit: str = "GiB") -> str:
    unit_mib = MIB_PER_UNIT[unit]
    out: list[str] = []
    allocated_all = total_all = 0
    for node in (n for n in report.nodes if n.cards):
        cards = sorted(node.cards, key=lambda c: c.index)
        per_pod: dict[tuple[str, str], dict[int, int]] = {}
        for card in cards:
            for pod in card.pods:
                held = per_pod.setdefault((pod.name, pod.namespace), {})
                held[card.index] = held.get(card.index, 0) + pod.memory_mib
        for unplaced in node.unplaced:
            held = per_pod.setdefault((unplaced.name, unplaced.namespace), {})
            held[-1] = held.get(-1, 0) + unplaced.memory_mib
        pending = any(-1 in held for held in per_pod.values())
        header = ["NAME", "NAMESPACE"] + [f"GPU{c.index}(Allocated)" for c in cards]
        header += ["PENDING(Allocated)"] if pending else []
        rows = [header]
        for (name, namespace), held in sorted(per_pod.items(), key=lambda i: (i[0][1], i[0][0])):
            row = [name, namespace] + [_amount(held.get(c.index, 0), unit_mib) for c in cards]
            row += [_amount(held.get(-1, 0), unit_mib)] if pending else []
            rows.append(row)
        allocated = sum(sum(held.values()) for held in per_pod.values())
        total = sum(c.memory_mib for c in cards)
        allocated_all += allocated
        total_all += total
        out += [f"NAME:       {node.name}", f"IPADDRESS:  {node.address}", ""]
        out += _table(rows)
        out += [
            f"Allocated :  {_amount(allocated, unit_mib)} ({_percent(allocated, total)}%)",
            f"Total :      {_amount(total, unit_mib)}",
            "-" * 78,
            "",
        ]
    if not out:
        return "No GPU node found\n"
    out.append(
        "Allocated/Total GPU Memory In Cluster:  "
        f"{_amount(allocated_all, unit_mib)}/{_amount(total_all, unit_mib)} "
        f"({_percent(allocated_all, total_all)}%)"
    )
    return "\n".join(out) + "\n"


@click.command("kubectl-inspect-gpushare", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("node", required=False)
@click.option("-d", "--details", is_flag=True, help="Per node, the pods on each card.")
@click.option(
    "--unit",
    type=click.Choice(list(MIB_PER_UNIT)),
    default="GiB",
    show_default=True,
    help="Memory unit (gpushare's --memory-unit).",
)
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None)
@click.option("--context", default=None, help="Kubeconfig context (default: current).")
@click.option("--request-timeout", type=click.FloatRange(min=0.1), default=10.0)
def inspect_gpushare(
    node: str | None,
    details: bool,
    unit: str,
    kubeconfig: str | None,
    context: str | None,
    request_timeout: float,
) -> None:
    """Display GPU share allocation per node and card, as gpushare's kubectl plugin does
    (an alias of `kubectl gpu inspect` in that layout)."""
    from kubegpu.inspect.command import InspectOptions, inspect_once
    from kubegpu.kube.cluster_reader import ClusterError, KubeconfigProblem, make_client

    logging.getLogger("httpx2").setLevel(logging.WARNING)
    options = InspectOptions(filters=Filters((node,) if node else ()), usage=False)
    try:
        connection = make_client(kubeconfig, context=context, request_timeout_s=request_timeout)
        report = asyncio.run(inspect_once(connection, options))
    except ClusterError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2 if isinstance(exc, KubeconfigProblem) else 1)
    if node and not any(n.name == node and n.cards for n in report.nodes):
        click.echo(f"error: node {node} has no GPU shown by kubegpu", err=True)
        sys.exit(1)
    click.echo(render_details(report, unit) if details else render_summary(report, unit), nl=False)


def kubectl_inspect_gpushare_main(argv: list[str] | None = None) -> Any:
    """Entry point of the ``kubectl-inspect-gpushare`` executable."""
    return inspect_gpushare.main(
        args=argv, prog_name="kubectl inspect gpushare", auto_envvar_prefix="KUBEGPU"
    )
