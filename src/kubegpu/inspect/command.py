"""The ``kubegpu inspect`` command, also installed as the kubectl plugin ``kubectl-gpu``.

kubectl runs ``kubectl-gpu`` with the words after ``gpu``, so ``kubectl gpu inspect --node x``
reaches :func:`kubectl_gpu_main` as ``inspect --node x`` and runs the very same click command.
Thin: resolve the cluster, list (or list + watch), fetch exporter usage, build the report with
:func:`kubegpu.inspect.model.build_report`, print it. Exit codes: 0 shown, 1 the cluster could
not be read (message on stderr), 2 bad usage (click's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

import click

from kubegpu.cli.types import FiniteFloatRange, NonEmptyPath
from kubegpu.inspect.exporters import (
    DEFAULT_EXPORTER_LABEL,
    DEFAULT_URL_TEMPLATE,
    exporter_pod_ips,
    exporter_url,
    fetch_usage,
)
from kubegpu.inspect.model import ReadCache, build_report
from kubegpu.inspect.reading import gpu_node_names, node_address
from kubegpu.inspect.render import render_text, report_to_json
from kubegpu.inspect.report import Filters, InspectReport
from kubegpu.inspect.usage import UsageResult
from kubegpu.kube.cluster_reader import (
    ClusterError,
    ClusterState,
    Connection,
    KubeconfigProblem,
    follow_cluster,
    list_cluster,
    make_client,
)

log = logging.getLogger(__name__)

CLEAR_SCREEN = "\x1b[H\x1b[2J"  # cursor home, erase display: what `watch` does


@dataclass(frozen=True)
class InspectOptions:
    output: str = "table"
    filters: Filters = field(default_factory=Filters)
    usage: bool = True
    url_template: str = DEFAULT_URL_TEMPLATE
    exporter_label: str = DEFAULT_EXPORTER_LABEL
    exporter_timeout_s: float = 2.0
    exporter_concurrency: int = 64


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def build_cluster_report(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    options: InspectOptions,
    usage: Mapping[str, UsageResult] | None = None,
    cache: ReadCache | None = None,
) -> tuple[InspectReport, dict[str, UsageResult] | None]:
    """The report, fetching exporter usage for the nodes it shows unless ``usage`` is given
    (watch mode reuses the last fetch between refreshes). Returns the usage it used."""
    nodes = list(nodes)
    pods = list(pods)
    fetched: dict[str, UsageResult] | None = dict(usage) if usage is not None else None
    if options.usage and fetched is None:
        shown = set(gpu_node_names(nodes, options.filters))
        pod_ips = exporter_pod_ips(pods, options.exporter_label)
        urls = {}
        for node in nodes:
            name = str((node.get("metadata") or {}).get("name") or "")
            if name in shown:
                urls[name] = exporter_url(
                    options.url_template, name, node_address(node), pod_ips.get(name, "")
                )
        fetched = await fetch_usage(
            urls,
            timeout_s=options.exporter_timeout_s,
            concurrency=options.exporter_concurrency,
        )
    report = build_report(
        nodes,
        pods,
        fetched if options.usage else None,
        filters=options.filters,
        generated_at=_now(),
        cache=cache,
    )
    return report, fetched


async def inspect_once(connection: Connection, options: InspectOptions) -> InspectReport:
    """List the cluster once and build its report; raises ``ClusterError``."""
    try:
        listing = await list_cluster(
            connection.client, connection.server_url, options.filters.nodes
        )
    finally:
        await connection.client.close()
    report, _ = await build_cluster_report(listing.nodes, listing.pods, options)
    return report


def emit(report: InspectReport, output: str, out: TextIO, *, stream: bool = False) -> None:
    """Write ``report``; ``stream`` (watch without a terminal) writes JSON one document a line."""
    if output == "json":
        doc = report_to_json(report)
        text = json.dumps(doc, separators=(",", ":")) if stream else json.dumps(doc, indent=2)
        out.write(text + "\n")
    else:
        out.write(render_text(report, wide=output == "wide"))
    out.flush()


async def inspect_watch(
    connection: Connection,
    options: InspectOptions,
    out: TextIO,
    *,
    refresh_interval_s: float = 1.0,
    usage_interval_s: float = 10.0,
) -> None:
    """Re-render on every change (at most once per ``refresh_interval_s``) until SIGINT or
    SIGTERM; the first list failing raises ``ClusterError``."""
    # Fail like a plain inspect when the cluster cannot be read at all.
    try:
        first = await list_cluster(connection.client, connection.server_url)
    except BaseException:
        await connection.client.close()
        raise
    state = ClusterState()
    for node in first.nodes:
        state.apply("nodes", "ADDED", node)
    for pod in first.pods:
        state.apply("pods", "ADDED", pod)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    errors: deque[str] = deque(maxlen=1)  # the latest watch failure, shown under the table
    follower = asyncio.create_task(
        follow_cluster(
            connection.client, state, server_url=connection.server_url, on_error=errors.append
        )
    )
    interactive = out.isatty()
    usage: dict[str, UsageResult] | None = None
    usage_at = -float("inf")
    cache = ReadCache()
    try:
        while not stop.is_set():
            state.changed.clear()
            if options.usage and time.monotonic() - usage_at >= usage_interval_s:
                usage, usage_at = None, time.monotonic()
            report, usage = await build_cluster_report(
                list(state.nodes.values()), list(state.pods.values()), options, usage, cache
            )
            if interactive:
                out.write(CLEAR_SCREEN)
            elif options.output != "json":
                out.write(f"--- {report.generated_at}\n")
            emit(report, options.output, out, stream=not interactive)
            if errors and interactive:
                out.write(f"watch: {errors[-1]}\n")
                out.flush()
            # Bounded refresh rate: sleep, then wait for a change, a usage refresh or a stop.
            await _wait(stop, refresh_interval_s)
            wake = asyncio.create_task(state.changed.wait())
            halt = asyncio.create_task(stop.wait())
            timeout = (
                max(0.0, usage_at + usage_interval_s - time.monotonic()) if options.usage else None
            )
            _, pending = await asyncio.wait(
                {wake, halt}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await connection.client.close()


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()


@click.command("inspect")
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "wide", "json"]),
    default="table",
    show_default=True,
    help="table: per node and card; wide: adds UUID, free memory, utilisation and per-pod "
    "shares; json: the document described by kubegpu/inspect/schema.json.",
)
@click.option(
    "--node",
    "nodes",
    multiple=True,
    metavar="NAME",
    help="Only this node (repeatable).",
)
@click.option(
    "-n",
    "--namespace",
    default="",
    help="Only pods of this namespace (every GPU node is still shown, and card figures still "
    "count every pod).",
)
@click.option("-w", "--watch", is_flag=True, help="Re-render on every change until Ctrl-C.")
@click.option(
    "--kubeconfig",
    type=NonEmptyPath(dir_okay=False),
    default=None,
    help="Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster).",
)
@click.option("--context", default=None, help="Kubeconfig context (default: current).")
@click.option(
    "--request-timeout",
    type=FiniteFloatRange(min=0.1, max=3600),
    default=10.0,
    show_default=True,
    help="Seconds to wait for the API server.",
)
@click.option(
    "--usage/--no-usage",
    default=True,
    show_default=True,
    help="Ask each GPU node's exporter for used memory.",
)
@click.option(
    "--exporter-url-template",
    default=DEFAULT_URL_TEMPLATE,
    show_default=True,
    help="Exporter metrics URL per node: {node} is the Node name, {address} its InternalIP, "
    "{pod_ip} the IP of the node agent pod there (see --exporter-pod-label; falls back to "
    "{address}).",
)
@click.option(
    "--exporter-pod-label",
    default=DEFAULT_EXPORTER_LABEL,
    show_default=True,
    metavar="KEY=VALUE",
    help="Label of the pods serving the exporter, for {pod_ip}.",
)
@click.option(
    "--exporter-timeout",
    type=FiniteFloatRange(min=0.05, max=3600),
    default=2.0,
    show_default=True,
    help="Seconds to wait for all exporters together; late ones show '?'.",
)
@click.option(
    "--refresh-interval",
    type=FiniteFloatRange(min=0.05, max=3600),
    default=1.0,
    show_default=True,
    help="--watch: least seconds between two renders.",
)
@click.option(
    "--usage-interval",
    type=FiniteFloatRange(min=0.5, max=3600),
    default=10.0,
    show_default=True,
    help="--watch: seconds between two exporter fetches.",
)
def inspect_command(
    output: str,
    nodes: tuple[str, ...],
    namespace: str,
    watch: bool,
    kubeconfig: str | None,
    context: str | None,
    request_timeout: float,
    usage: bool,
    exporter_url_template: str,
    exporter_pod_label: str,
    exporter_timeout: float,
    refresh_interval: float,
    usage_interval: float,
) -> None:
    """Show every GPU node's cards: allocated and used memory, compute, health, the pods on
    each card, pending GPU pods and drift warnings."""
    try:
        exporter_url(exporter_url_template, "node", "127.0.0.1", "127.0.0.2")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--exporter-url-template") from None
    if "=" not in exporter_pod_label:
        raise click.BadParameter("expected KEY=VALUE", param_hint="--exporter-pod-label")
    options = InspectOptions(
        output=output,
        filters=Filters(tuple(nodes), namespace),
        usage=usage,
        url_template=exporter_url_template,
        exporter_label=exporter_pod_label,
        exporter_timeout_s=exporter_timeout,
    )
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # One INFO line per HTTP request would bury the table; --log-level debug shows them.
        logging.getLogger("httpx2").setLevel(logging.WARNING)
    out = sys.stdout
    try:
        connection = make_client(kubeconfig, context=context, request_timeout_s=request_timeout)
        if watch:
            asyncio.run(
                inspect_watch(
                    connection,
                    options,
                    out,
                    refresh_interval_s=refresh_interval,
                    usage_interval_s=usage_interval,
                )
            )
            return
        report = asyncio.run(inspect_once(connection, options))
    except ClusterError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2 if isinstance(exc, KubeconfigProblem) else 1)
    except KeyboardInterrupt:
        return
    except BrokenPipeError:
        _quiet_stdout()
        return
    try:
        emit(report, output, out)
    except BrokenPipeError:
        _quiet_stdout()


def _quiet_stdout() -> None:
    # `kubectl gpu inspect | head`: the reader left; exit without a traceback from the final
    # flush (the recipe in Python's signal module documentation).
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


@click.group("kubectl-gpu", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="warning",
    show_default=True,
    help="Least severe log lines shown (on stderr).",
)
def kubectl_gpu(log_level: str) -> None:
    """kubectl plugin for kubegpu: `kubectl gpu inspect`."""
    from kubegpu.cli.logs import configure_logging

    configure_logging(getattr(logging, log_level.upper()))


kubectl_gpu.add_command(inspect_command)


def kubectl_gpu_main(argv: list[str] | None = None) -> Any:
    """Entry point of the ``kubectl-gpu`` executable."""
    return kubectl_gpu.main(args=argv, prog_name="kubectl gpu", auto_envvar_prefix="KUBEGPU")
