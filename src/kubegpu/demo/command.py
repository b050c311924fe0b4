"""``kubegpu demo``: the whole system on a laptop, no GPU and no cluster needed.

Composition root of the demo. It starts, as real processes talking over real sockets and HTTP:
the fake Kubernetes API server (``kubegpu fake-apiserver``), the scheduler extender
(``kubegpu extender``) and, per node, a node agent (``kubegpu device-plugin --backend fake`` with
card-level sharing on) registered with an in-process kubelet emulator over unix-socket gRPC.
In this process run the kubelets' pod admission (:mod:`kubegpu.testing.node`) and a
kube-scheduler stand-in (:mod:`kubegpu.testing.scheduler`), both through lightkube. It then
submits the scenario's pods, shows progress until every pod is running or refused, prints the
``kubegpu inspect`` table and a summary, and tears everything down: children get SIGTERM, a
bounded wait, then SIGKILL, and the work directory (sockets included) is removed, also on
Ctrl-C or SIGTERM.

The run's state is :mod:`kubegpu.demo.run`, bringing the cluster up
:mod:`kubegpu.demo.startup`, the replay :mod:`kubegpu.demo.replay`; this module orchestrates
them and is the command line.

Exit codes: 0 done, 1 a component did not start or the run did not settle (the message names
the component and ends with its log tail), 2 bad usage, 130 interrupted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import click

from kubegpu.cli.types import MAX_SEED, POSITIVE_SECONDS, Folder, OutputFile, input_file
from kubegpu.demo.processes import ComponentError, Interrupted, InterruptGuard, Supervisor
from kubegpu.demo.replay import replay
from kubegpu.demo.run import DemoError, DemoOptions, DemoRun, NodeRuntime, echo
from kubegpu.demo.scenario import (
    DemoPod,
    ScenarioError,
    builtin_pods,
    node_layout,
    take,
    trace_pods,
)
from kubegpu.demo.startup import (
    client_for,
    register_nodes,
    start_api_server,
    start_extender,
    start_nodes,
    wait_for_extender_view,
    wait_for_nodes,
)
from kubegpu.demo.summary import DemoSummary, render_summary
from kubegpu.kubelet.resources import socket_name_for
from kubegpu.kubelet.socketdir import SocketDirError, check_socket_dir
from kubegpu.testing.kubelet import KubeletEmulator

log = logging.getLogger(__name__)

DEFAULT_TRACE = Path("../shared/traces/openb/openb_pod_list_default.csv")


# --------------------------------------------------------------------------- orchestration
def load_pods(options: DemoOptions) -> tuple[list[DemoPod], str]:
    if options.trace is not None and str(options.trace) == "openb":
        if not DEFAULT_TRACE.is_file():
            raise ScenarioError(
                f"--trace openb reads {DEFAULT_TRACE} (relative to this directory), which is "
                "not there; give the pod CSV's path instead"
            )
        options = replace(options, trace=DEFAULT_TRACE)
    if options.trace is not None:
        count_ = options.pods if options.pods is not None else 40
        return trace_pods(options.trace, count_, options.seed), f"openb trace {options.trace}"
    return take(builtin_pods(), options.pods), "built-in scenario"


def run_demo(options: DemoOptions) -> int:
    pods, source = load_pods(options)
    if options.pid_file is not None:
        options.pid_file.write_text("")
    parent = options.work_dir
    if parent is None and len(tempfile.gettempdir()) > 40 and Path("/tmp").is_dir():
        # Unix socket paths are limited to 107 bytes (macOS's $TMPDIR alone is ~50).
        parent = Path("/tmp")
    root = Path(tempfile.mkdtemp(prefix="kgd-", dir=parent))
    (root / "logs").mkdir()
    guard = InterruptGuard()
    run = DemoRun(options, root, Supervisor(root / "logs", options.pid_file, guard))
    run.nodes = [
        NodeRuntime(
            spec,
            root / f"n{i}",
            KubeletEmulator(
                root / f"n{i}" / "dp",
                pod_resources_socket=root / f"n{i}" / "pr.sock",
                node_name=spec.name,
            ),
        )
        for i, spec in enumerate(node_layout(options.nodes))
    ]
    echo(f"kubegpu demo: {options.nodes} nodes, {len(pods)} pods from the {source}")
    echo(f"work directory {root} (removed on exit)")
    code = 0
    reported: list[DemoSummary] = []

    def report(summary: DemoSummary, table: str, examples: list[str]) -> None:
        echo("")
        echo("kubectl gpu inspect:")
        click.echo(table, nl=False)
        echo("")
        if examples:
            echo("what the node agents' Allocate told two of the containers:")
            for line in examples:
                echo(f"  {line}")
            echo("")
        echo("summary:")
        for line in render_summary(summary):
            echo(f"  {line}")
        if options.summary_json is not None:
            doc = {"kubeconfig": str(run.kubeconfig), **summary.to_json()}
            options.summary_json.write_text(json.dumps(doc, indent=2))
        reported.append(summary)

    guard.install()  # from here to the report, Ctrl-C / SIGTERM end the run cleanly
    try:
        started = time.monotonic()
        start_api_server(run)
        client = client_for(run)
        try:
            register_nodes(run, client)
            extender = start_extender(run)
            start_nodes(run)
            wait_for_nodes(run, client)
        finally:
            client.close()
        wait_for_extender_view(run, extender)
        echo(f"cluster up in {time.monotonic() - started:.1f} s")
        _run_async(run, pods, report, lambda: bool(reported))
    except Interrupted as exc:
        echo(f"interrupted ({exc}); cleaning up")
        code = 0 if options.keep_running and reported else 130
    except (ComponentError, DemoError, ScenarioError) as exc:
        click.echo(f"kubegpu demo: {exc}", err=True)
        code = 1
    finally:
        # A second Ctrl-C must not cut the clean-up short (it is bounded anyway).
        guard.restore()
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            leftovers = run.close()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        echo(f"stopped {len(run.nodes)} kubelet emulators and every child process")
        if leftovers:
            click.echo(f"warning: sockets left behind: {leftovers}", err=True)
    return code


def _run_async(
    run: DemoRun,
    pods: list[DemoPod],
    report: Callable[[DemoSummary, str, list[str]], None],
    reported: Callable[[], bool],
) -> None:
    """The asyncio part. SIGINT/SIGTERM cancel it, except once the summary is out under
    --keep-running, where they are the normal way to stop (exit 0)."""
    interrupted: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        me = asyncio.current_task()
        assert me is not None

        def on_signal(name: str) -> None:
            interrupted.append(name)
            if run.options.keep_running and reported():
                stop.set()
            else:
                me.cancel()

        saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in saved:
            loop.add_signal_handler(sig, on_signal, sig.name)
        try:
            await replay(run, pods, report, stop)
        finally:
            for sig, handler in saved.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, handler)  # remove_signal_handler leaves SIG_DFL behind

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        raise Interrupted(interrupted[0] if interrupted else "cancelled") from None
    if interrupted:
        raise Interrupted(interrupted[0])


# --------------------------------------------------------------------------- CLI
def _known_policy(value: str) -> str:
    """The extender's own check, here: its refusal would come only after the cluster started."""
    from kubegpu.placement.policies import extender_accepts

    known = extender_accepts()
    if value.lower() not in known:
        raise click.BadParameter(f"{value!r} is not one of {', '.join(sorted(known))}")
    return value


def _short_enough(work_dir: Path | None) -> Path | None:
    """The node agents' sockets go in <work-dir>/kgd-XXXXXXXX/n<i>/dp: refuse a folder so deep
    that they would not fit in a unix socket path, before anything starts."""
    if work_dir is None:
        return None
    deepest = work_dir / "kgd-xxxxxxxx" / "n31" / "dp"
    try:
        check_socket_dir(deepest, [socket_name_for("kubegpu.io/gpu-shared"), "kubelet.sock"])
    except SocketDirError as exc:
        raise click.BadParameter(f"too deep for the demo's sockets: {exc}") from None
    return work_dir


# Pods one demo may replay: a laptop's cluster of at most 32 fake nodes.
MAX_DEMO_PODS = 1000


@click.command("demo")
@click.option(
    "--nodes",
    type=click.IntRange(1, 32),
    default=4,
    show_default=True,
    help="Fake GPU nodes, cycling 8xA100-80GB-NVLink, 4xT4, 2xV100-2xT4.",
)
@click.option(
    "--pods",
    type=click.IntRange(1, MAX_DEMO_PODS),
    default=None,
    help="Pods to replay [default: the whole built-in scenario, or 40 trace rows].",
)
@click.option(
    "--trace",
    type=input_file(exists=False),  # "openb" is a name, not a path
    default=None,
    help=f"An openb pod CSV to replay a slice of instead of the built-in scenario; 'openb' "
    f"means {DEFAULT_TRACE}.",
)
@click.option(
    "--policy",
    default="kubegpu",
    show_default=True,
    callback=lambda _ctx, _param, value: _known_policy(value),
    help="Extender placement policy: binpack, spread, fgd or kubegpu.",
)
@click.option(
    "--seed",
    type=click.IntRange(0, MAX_SEED),
    default=0,
    show_default=True,
    help="Picks where the trace slice starts.",
)
@click.option(
    "--keep-running",
    is_flag=True,
    help="After the summary, keep the cluster up (KUBECONFIG printed) until Ctrl-C.",
)
@click.option(
    "--summary-json",
    # Its folder must exist and be writable now, not only once the whole run is over.
    type=OutputFile(),
    default=None,
    help="Also write the summary (with per-card use and placements) as JSON here.",
)
@click.option(
    "--pid-file",
    type=OutputFile(),
    default=None,
    help="Append '<pid> <component>' for every child process started.",
)
@click.option(
    "--work-dir",
    type=Folder(must_exist=True, purpose="make the demo's work folder"),
    callback=lambda _ctx, _param, value: _short_enough(value),
    default=None,
    help="Parent of the temporary work directory [default: $TMPDIR].",
)
@click.option(
    "--slots-per-card",
    type=click.IntRange(1, 64),
    default=8,
    show_default=True,
    help="Containers that may share one card (the node agent's slotsPerCard).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=POSITIVE_SECONDS,
    default=180.0,
    show_default=True,
    help="Seconds the pods may take to settle.",
)
@click.option(
    "--component-log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Log level of the child processes (their logs stay in the work directory).",
)
def demo_command(
    nodes: int,
    pods: int | None,
    trace: Path | None,
    policy: str,
    seed: int,
    keep_running: bool,
    summary_json: Path | None,
    pid_file: Path | None,
    work_dir: Path | None,
    slots_per_card: int,
    timeout_s: float,
    component_log_level: str,
) -> None:
    """Run the whole system on this machine: fake API server, fake-GPU nodes with real node
    agents, the real extender, a scheduler and kubelets; replay pods and show the result."""
    options = DemoOptions(
        nodes=nodes,
        pods=pods,
        trace=trace,
        policy=policy,
        seed=seed,
        keep_running=keep_running,
        summary_json=summary_json,
        pid_file=pid_file,
        work_dir=work_dir,
        slots_per_card=slots_per_card,
        timeout_s=timeout_s,
        child_log_level=component_log_level,
    )
    try:
        load_pods(options)
    except ScenarioError as exc:
        raise click.UsageError(str(exc)) from None
    root_logger = logging.getLogger()
    if root_logger.level > logging.DEBUG:
        # The demo narrates with its own lines; every HTTP request at INFO would drown them.
        # --log-level debug shows it all (children log to files in the work directory).
        root_logger.setLevel(logging.WARNING)
    code = run_demo(options)
    if code:
        raise SystemExit(code)
