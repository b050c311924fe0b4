"""The demo's replay: submit the scenario's pods, show progress, and collect the outcome.

In this process the kube-scheduler stand-in and one kubelet driver per node run against the
fake API server; :func:`replay` submits the pods a few per tick, draws progress (bars on a
terminal, plain lines elsewhere) until every pod runs or is refused, then hands the
``kubectl gpu inspect`` table, the summary and two containers' environments to the caller.
Separate from the start-up (the cluster must be up first) and from the command's orchestration.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubegpu.demo.run import POLL_S, START_TIMEOUT_S, DemoError, DemoRun, echo
from kubegpu.demo.scenario import DEMO_LABEL, DEMO_NAMESPACE, DemoPod, pod_manifest
from kubegpu.demo.summary import DemoSummary, summarize
from kubegpu.kube import demo_api
from kubegpu.testing.node import KubeletDriver
from kubegpu.testing.scheduler import (
    DEFAULT_SCHEDULER_NAME,
    Outcome,
    SchedulerSettings,
    SchedulerStandIn,
    node_allocatable,
)

# Without a terminal (a pipe, a CI log) progress is plain lines, at most one per this many
# seconds besides the first and the last, instead of bars redrawn in place.
PROGRESS_LINE_S = 1.0


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
            echo("")
            echo("the cluster keeps running; from another terminal:")
            echo(f"  export KUBECONFIG={run.kubeconfig}")
            echo("  kubegpu inspect --no-usage      # or: kubectl gpu inspect, kubectl get pods")
            echo("Ctrl-C to stop and clean up")
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
    echo(f"replaying {total} pods (schedulerName {DEFAULT_SCHEDULER_NAME})")
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
                    echo(state.line(total, now - started))
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
    echo(f"settled in {time.monotonic() - started:.1f} s")
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
