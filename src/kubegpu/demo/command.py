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

Exit codes: 0 done, 1 a component did not start or the run did not settle (the message names
the component and ends with its log tail), 2 bad usage, 130 interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click
import yaml

from kubegpu.cli.types import MAX_SEED, POSITIVE_SECONDS, Folder, OutputFile, input_file
from kubegpu.demo.processes import (
    Child,
    ComponentError,
    Interrupted,
    InterruptGuard,
    Supervisor,
    kubegpu_command,
)
from kubegpu.demo.scenario import (
    DEMO_LABEL,
    DEMO_NAMESPACE,
    DemoNode,
    DemoPod,
    ScenarioError,
    builtin_pods,
    node_gpu_spec,
    node_layout,
    pod_manifest,
    take,
    trace_pods,
)
from kubegpu.demo.summary import DemoSummary, render_summary, summarize
from kubegpu.kube import demo_api
from kubegpu.kubelet.resources import socket_name_for
from kubegpu.kubelet.socketdir import SocketDirError, check_socket_dir
from kubegpu.sharing.annotations import INVENTORY_ANNOTATION
from kubegpu.sharing.resources import ResourceNames
from kubegpu.testing.apiserver.objects import make_node
from kubegpu.testing.kubelet import KubeletEmulator
from kubegpu.testing.node import KubeletDriver
from kubegpu.testing.scheduler import (
    DEFAULT_SCHEDULER_NAME,
    Outcome,
    SchedulerSettings,
    SchedulerStandIn,
    node_allocatable,
)

log = logging.getLogger(__name__)

DEFAULT_TRACE = Path("../shared/traces/openb/openb_pod_list_default.csv")
START_TIMEOUT_S = 60.0
POLL_S = 0.1
# Without a terminal (a pipe, a CI log) progress is plain lines, at most one per this many
# seconds besides the first and the last, instead of bars redrawn in place.
PROGRESS_LINE_S = 1.0

AGENT_CONFIG = """\
version: v1
sharing:
  gpuShare:
    enabled: true
    slotsPerCard: {slots}
    enforcement: none
    syncIntervalS: 0.5
    reconcileIntervalS: 2
    inventoryIntervalS: 60
    podResourcesSocket: {pod_resources}
"""


class DemoError(Exception):
    """The demo cannot go on; the message says which component and why."""


@dataclass(frozen=True)
class DemoOptions:
    nodes: int = 4
    pods: int | None = None
    trace: Path | None = None
    policy: str = "kubegpu"
    seed: int = 0
    keep_running: bool = False
    summary_json: Path | None = None
    pid_file: Path | None = None
    work_dir: Path | None = None
    slots_per_card: int = 8
    timeout_s: float = 180.0
    child_log_level: str = "info"


@dataclass
class NodeRuntime:
    spec: DemoNode
    directory: Path
    emulator: KubeletEmulator
    agent: Child | None = None


@dataclass
class DemoRun:
    """Everything one demo run started; :meth:`close` undoes all of it."""

    options: DemoOptions
    root: Path
    supervisor: Supervisor
    names: ResourceNames = field(default_factory=ResourceNames)
    kubeconfig: Path | None = None
    api_url: str = ""
    extender_url: str = ""
    nodes: list[NodeRuntime] = field(default_factory=list)

    def close(self) -> list[str]:
        """Stop emulators and children, remove the work directory; returns leftover sockets
        (there should be none) for the caller to report."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.emulator.stop()
        self.supervisor.stop_all()
        leftovers = [str(p) for p in _sockets(self.root)]
        shutil.rmtree(self.root, ignore_errors=True)
        return leftovers


def _sockets(root: Path) -> Iterator[Path]:
    if not root.exists():
        return
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                yield path


def _echo(message: str) -> None:
    click.echo(message)


# --------------------------------------------------------------------------- start-up
def start_api_server(run: DemoRun) -> None:
    kubeconfig = run.root / "kubeconfig"
    child = run.supervisor.start(
        "fake-apiserver",
        kubegpu_command(
            "fake-apiserver",
            "--port",
            "0",
            "--kubeconfig",
            str(kubeconfig),
            log_level=run.options.child_log_level,
        ),
    )
    _echo(f"fake API server: pid {child.pid}")
    run.supervisor.wait_for(
        child,
        # The server logs "listening on" before its CLI writes the kubeconfig; "written" comes
        # after the file is complete (it is renamed into place).
        lambda: kubeconfig.exists() and "kubeconfig written to" in child.tail(),
        "serving",
        START_TIMEOUT_S,
    )
    doc = yaml.safe_load(kubeconfig.read_text())
    run.kubeconfig = kubeconfig
    run.api_url = str(doc["clusters"][0]["cluster"]["server"])
    _echo(f"  listening on {run.api_url}, kubeconfig {kubeconfig}")


def client_for(run: DemoRun) -> demo_api.Client:
    assert run.kubeconfig is not None
    return demo_api.sync_client(run.kubeconfig)


def register_nodes(run: DemoRun, client: demo_api.Client) -> None:
    """Create the Node objects as kubelets do at registration: create, then report status."""
    for node in run.nodes:
        doc = make_node(
            node.spec.name,
            cpu=node.spec.cpu,
            memory=node.spec.memory,
            labels={DEMO_LABEL: "true", "kubegpu.io/demo-preset": node.spec.preset},
        )
        demo_api.register_node(client, doc)


def start_extender(run: DemoRun) -> Child:
    assert run.kubeconfig is not None
    child = run.supervisor.start(
        "extender",
        kubegpu_command(
            "extender",
            "--port",
            "0",
            "--kubeconfig",
            str(run.kubeconfig),
            "--policy",
            run.options.policy,
            # One extender and one scheduler stand-in for the demo's lifetime: nothing to guard.
            "--leader-lease",
            "none",
            log_level=run.options.child_log_level,
        ),
        env=_no_proxy(),
    )
    _echo(f"scheduler extender: pid {child.pid} (policy {run.options.policy})")
    pattern = re.compile(r"kubegpu extender on (https?://\S+?),? policy")

    def listening() -> bool:
        match = pattern.search(child.tail(20000))
        if match:
            run.extender_url = match.group(1)
        return bool(match)

    run.supervisor.wait_for(child, listening, "listening", START_TIMEOUT_S)
    run.supervisor.wait_for(
        child, lambda: _http_ok(f"{run.extender_url}/readyz"), "ready (/readyz)", START_TIMEOUT_S
    )
    _echo(f"  serving filter/prioritize/bind on {run.extender_url}")
    return child


def _no_proxy() -> dict[str, str]:
    # Everything is on loopback; a proxy from the user's environment must not be used.
    return {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def _http_ok(url: str) -> bool:
    import urllib.request

    handler = urllib.request.ProxyHandler({})
    try:
        with urllib.request.build_opener(handler).open(url, timeout=2) as response:
            return int(response.status) == 200
    except OSError:
        return False


def start_nodes(run: DemoRun) -> None:
    assert run.kubeconfig is not None
    for node in run.nodes:
        d = node.directory
        d.mkdir(parents=True)
        (d / "gpus.yaml").write_text(node_gpu_spec(node.spec))
        (d / "agent.yaml").write_text(
            AGENT_CONFIG.format(slots=run.options.slots_per_card, pod_resources=d / "pr.sock")
        )
        with run.supervisor.guard.critical():  # a started emulator is one run.close() stops
            node.emulator.start()
        node.agent = run.supervisor.start(
            f"node-agent-{node.spec.name}",
            kubegpu_command(
                "device-plugin",
                "--backend",
                "fake",
                "--fake-gpus",
                str(d / "gpus.yaml"),
                "--fake-control",
                str(d / "ctl.sock"),
                "--kubelet-dir",
                str(d / "dp"),
                "--config",
                str(d / "agent.yaml"),
                "--node-name",
                node.spec.name,
                "--kubeconfig",
                str(run.kubeconfig),
                log_level=run.options.child_log_level,
            ),
            env=_no_proxy(),
        )
        _echo(
            f"node {node.spec.name} ({node.spec.preset}): node agent pid {node.agent.pid}, "
            f"kubelet emulator on {node.emulator.kubelet_socket}"
        )


def wait_for_nodes(run: DemoRun, client: demo_api.Client) -> None:
    names = run.names
    for node in run.nodes:
        assert node.agent is not None
        emulator = node.emulator

        def registered(emulator: KubeletEmulator = emulator) -> bool:
            return all(emulator.allocatable(r) > 0 for r in (names.whole_gpu, names.share_slot))

        run.supervisor.wait_for(
            node.agent, registered, "registered with its kubelet", START_TIMEOUT_S
        )

        def published(name: str = node.spec.name) -> bool:
            return INVENTORY_ANNOTATION in demo_api.node_annotations(client, name)

        run.supervisor.wait_for(
            node.agent, published, "publishing its GPU inventory", START_TIMEOUT_S, poll_s=0.2
        )
        whole = emulator.allocatable(names.whole_gpu)
        slots = emulator.allocatable(names.share_slot)
        _echo(
            f"  {node.spec.name}: {whole} x {names.whole_gpu}, {slots} x {names.share_slot} "
            "advertised; inventory published"
        )


def wait_for_extender_view(run: DemoRun, extender: Child) -> None:
    """Ask the extender's real /filter about a one-card pod until it sees every node's cards."""
    import urllib.request

    probe = pod_manifest(
        DemoPod("kubegpu-demo-probe", 1, 1, gpus=1), scheduler_name=DEFAULT_SCHEDULER_NAME
    )
    probe["metadata"]["uid"] = "kubegpu-demo-probe"
    node_names = [n.spec.name for n in run.nodes]
    body = json.dumps({"Pod": probe, "Nodes": None, "NodeNames": node_names}).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def sees_all() -> bool:
        request = urllib.request.Request(
            f"{run.extender_url}/filter", body, {"Content-Type": "application/json"}
        )
        try:
            with opener.open(request, timeout=5) as response:
                result = json.loads(response.read())
        except (OSError, ValueError):
            return False
        return sorted(result.get("NodeNames") or []) == sorted(node_names)

    run.supervisor.wait_for(
        extender, sees_all, "seeing every node's GPUs", START_TIMEOUT_S, poll_s=0.2
    )


# --------------------------------------------------------------------------- the replay
@dataclass
class Progress:
    submitted: int = 0
    bound: int = 0
    running: int = 0
    refused: int = 0
    failed: int = 0

    def settled(self, total: int) -> bool:
        return self.submitted == total and self.running + self.refused + self.failed == total

    def line(self, total: int, elapsed_s: float) -> str:
        return (
            f"progress {elapsed_s:5.1f} s: {self.submitted}/{total} submitted, {self.bound} bound, "
            f"{self.running} running, {self.refused} refused, {self.failed} failed"
        )


def count(pods: list[dict[str, Any]], outcomes: dict[str, Outcome]) -> Progress:
    from kubegpu.demo.summary import refused_condition

    progress = Progress(submitted=len(pods))
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        uid = (pod.get("metadata") or {}).get("uid")
        progress.bound += bound
        if phase == "Running":
            progress.running += 1
        elif phase == "Failed":
            progress.failed += 1
        elif not bound and refused_condition(pod) is not None:
            outcome = outcomes.get(str(uid))
            # Refused and not queued again: the scheduler's verdict stands for now.
            if outcome is not None and outcome.node is None:
                progress.refused += 1
    return progress


async def replay(
    run: DemoRun,
    pods: list[DemoPod],
    report: Callable[[DemoSummary, str, list[str]], None],
    stop: asyncio.Event,
) -> None:
    """Run the scheduler and the kubelets, submit ``pods``, wait until they settle, hand the
    inspect table and summary to ``report``; with keep-running, go on until ``stop``."""
    assert run.kubeconfig is not None
    client = demo_api.async_client(run.kubeconfig)
    scheduler = SchedulerStandIn(
        client, SchedulerSettings(run.extender_url, scheduler_name=DEFAULT_SCHEDULER_NAME)
    )
    drivers = [
        KubeletDriver(client, n.spec.name, n.emulator, names=run.names, pod_ip_prefix=f"10.{i}.0.")
        for i, n in enumerate(run.nodes)
    ]
    tasks = [asyncio.create_task(scheduler.run(), name="scheduler")]
    tasks += [asyncio.create_task(d.run(), name=f"kubelet-{d.node_name}") for d in drivers]
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            await scheduler.synced.wait()
        await _wait_for_capacity(run, scheduler)
        summary, table = await _submit_and_wait(run, client, scheduler, pods, tasks)
        report(summary, table, allocation_examples(summary, drivers))
        if run.options.keep_running:
            _echo("")
            _echo("the cluster keeps running; from another terminal:")
            _echo(f"  export KUBECONFIG={run.kubeconfig}")
            _echo("  kubegpu inspect --no-usage      # or: kubectl gpu inspect, kubectl get pods")
            _echo("Ctrl-C to stop and clean up")
            await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()


def allocation_examples(summary: DemoSummary, drivers: list[KubeletDriver]) -> list[str]:
    """The environment of the first running shared pod and the first whole-GPU pod."""
    envs = {pod: env for d in drivers for pod, env in d.container_env.items()}
    lines = []
    for shared in (True, False):
        pod = next(
            (
                key
                for key, place in summary.placements.items()
                if place["phase"] == "Running" and place["shared"] is shared and key in envs
            ),
            None,
        )
        if pod is None:
            continue
        for container, env in envs[pod].items():
            shown = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
            lines.append(f"{pod} ({container}): {shown}")
    return lines


async def _wait_for_capacity(run: DemoRun, scheduler: SchedulerStandIn) -> None:
    """Until the scheduler sees each node's device-plugin resources in its allocatable (the
    kubelets publish them), or NodeResourcesFit would refuse every GPU pod."""
    wanted = (run.names.whole_gpu, run.names.share_slot)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        missing = [
            n.spec.name
            for n in run.nodes
            if not all(
                node_allocatable(scheduler.nodes.get(n.spec.name) or {}).get(r, 0) > 0
                for r in wanted
            )
        ]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise DemoError(f"kubelet: nodes {missing} never reported GPU allocatable")
        await asyncio.sleep(POLL_S)


async def _submit_and_wait(
    run: DemoRun,
    client: demo_api.AsyncClient,
    scheduler: SchedulerStandIn,
    pods: list[DemoPod],
    tasks: list[asyncio.Task[None]],
) -> tuple[DemoSummary, str]:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    from kubegpu.inspect.command import InspectOptions, build_cluster_report
    from kubegpu.inspect.render import render_text
    from kubegpu.kube.cluster_reader import list_cluster

    total = len(pods)
    started = time.monotonic()
    _echo(f"replaying {total} pods (schedulerName {DEFAULT_SCHEDULER_NAME})")
    columns = (
        TextColumn("{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    bar = Bar(*columns, transient=False)
    # rich draws bars only on a terminal (elsewhere just the final frame): lines otherwise.
    lines = not bar.console.is_terminal
    shown: tuple[Progress, float] | None = None
    with contextlib.nullcontext() if lines else bar:
        rows = {
            name: bar.add_task(name, total=total)
            for name in ("submitted", "bound", "running", "refused", "failed")
        }
        deadline = started + run.options.timeout_s
        submitted = 0
        while True:
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise DemoError(f"{task.get_name()} stopped: {task.exception()!r}")
            run.supervisor.check_alive()
            # Submit a few pods per tick so progress is visible and arrivals interleave.
            for pod in pods[submitted : submitted + 4]:
                manifest = pod_manifest(pod, scheduler_name=DEFAULT_SCHEDULER_NAME, names=run.names)
                await demo_api.create_pod(client, manifest)
                submitted += 1
            current = await demo_api.list_pods(client, DEMO_NAMESPACE, {DEMO_LABEL: "true"})
            state = count(current, scheduler.outcomes)
            done = state.settled(total) and scheduler.idle()
            now = time.monotonic()
            if lines:
                if shown is None or (
                    state != shown[0] and (done or now - shown[1] >= PROGRESS_LINE_S)
                ):
                    _echo(state.line(total, now - started))
                    shown = (state, now)
            else:
                for name, task_id in rows.items():
                    bar.update(task_id, completed=getattr(state, name))
            if done:
                break
            if now > deadline:
                raise DemoError(
                    f"pods did not settle within {run.options.timeout_s:g} s: {state}; "
                    f"scheduler queue {scheduler.queue_length}"
                )
            await asyncio.sleep(POLL_S)
    _echo(f"settled in {time.monotonic() - started:.1f} s")
    listing_all = await list_cluster(client, run.api_url)
    report, _ = await build_cluster_report(
        listing_all.nodes, listing_all.pods, InspectOptions(usage=False)
    )
    table = render_text(report)
    demo_pods = [
        p
        for p in listing_all.pods
        if ((p.get("metadata") or {}).get("labels") or {}).get(DEMO_LABEL) == "true"
    ]
    refusals = {o.pod: dict(o.reasons) for o in scheduler.outcomes.values() if o.node is None}
    return summarize(listing_all.nodes, demo_pods, refusals), table


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
    _echo(f"kubegpu demo: {options.nodes} nodes, {len(pods)} pods from the {source}")
    _echo(f"work directory {root} (removed on exit)")
    code = 0
    reported: list[DemoSummary] = []

    def report(summary: DemoSummary, table: str, examples: list[str]) -> None:
        _echo("")
        _echo("kubectl gpu inspect:")
        click.echo(table, nl=False)
        _echo("")
        if examples:
            _echo("what the node agents' Allocate told two of the containers:")
            for line in examples:
                _echo(f"  {line}")
            _echo("")
        _echo("summary:")
        for line in render_summary(summary):
            _echo(f"  {line}")
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
        _echo(f"cluster up in {time.monotonic() - started:.1f} s")
        _run_async(run, pods, report, lambda: bool(reported))
    except Interrupted as exc:
        _echo(f"interrupted ({exc}); cleaning up")
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
        _echo(f"stopped {len(run.nodes)} kubelet emulators and every child process")
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
