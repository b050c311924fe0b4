"""Creating a trace's pods on the real cluster and reading back what the scheduler did.

:func:`replay_in_order` is the paper's protocol on the real control plane: one pod at a time in
arrival order, the next created only once the last is bound or marked unschedulable by
kube-scheduler (``PodScheduled=False``), pods never deleted. :func:`replay_burst` creates pods
as fast as the API server takes them, ``parallel`` at a time, for pods per second end to end.
Both watch the namespace's pods from before the first is created, so no outcome is missed, and
keep watching to the end: a pod marked unschedulable that binds later is counted
(``late_binds``), which the paper's protocol has no place for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2
import lightkube
from lightkube.resources.core_v1 import Namespace, Pod

from kubegpu.placement.model import MILLI_PER_GPU, PodRequest
from kubegpu.sharing.claim import read_claim
from kubegpu.sharing.resources import RequestKind
from kubegpu_e2e.scale.trace import REPLAY_LABEL, SCHEDULER_NAME, gpu_milli, pod_manifest

BOUND = "bound"
REFUSED = "refused"
# How long a replay keeps watching after the last pod settled, for a late bind to show.
LATE_BIND_GRACE_S = 5.0

# (pod, namespace, run, scheduler name) -> the Pod to create; trace.pod_manifest by default
# (the device-plugin path), the DRA replay's builds a Pod with a claim from a template.
ManifestBuilder = Callable[[PodRequest, str, str, str], dict[str, Any]]


@dataclass
class PodOutcome:
    name: str
    gpu_milli: int
    created_s: float
    result: str = ""
    settled_s: float = 0.0
    node: str = ""
    message: str = ""  # the real kube-scheduler's last PodScheduled=False message


@dataclass
class ReplayOutcome:
    pods: list[PodOutcome]
    wall_s: float
    late_binds: list[str] = field(default_factory=list)
    refusals_seen: int = 0  # PodScheduled=False updates, retries included

    def bound_milli(self) -> int:
        return sum(p.gpu_milli for p in self.pods if p.result == BOUND)

    def curve(self) -> list[int]:
        """GPU milli bound after each pod, in creation order (as the simulator records)."""
        total, out = 0, []
        for p in self.pods:
            total += p.gpu_milli if p.result == BOUND else 0
            out.append(total)
        return out

    def latencies_s(self) -> list[float]:
        return sorted(p.settled_s - p.created_s for p in self.pods if p.result == BOUND)


def _outcome_of(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(result, node, refusal message) once the pod is bound or refused."""
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        return BOUND, str(node), ""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return REFUSED, "", str(condition.get("message") or "")
    return None


class PodWatch:
    """The namespace's pods as they change; settles each pod's outcome once, and notes binds
    that come after a refusal."""

    def __init__(self, client: lightkube.AsyncClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.outcomes: dict[str, PodOutcome] = {}
        self.waiters: dict[str, asyncio.Future[None]] = {}
        self.late_binds: list[str] = []
        self.refusals_seen = 0
        self.watch_errors: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())
        await self._ready.wait()

    async def _run(self) -> None:
        # A list, then a watch from its version; when the API server goes away (the fault
        # scenario restarts it) or ends the watch, list again: nothing changed meanwhile is
        # missed, since a list shows every pod's current state.
        while True:
            try:
                listing = self.client.list(Pod, namespace=self.namespace)
                async for pod in listing:
                    self._seen(pod.to_dict())
                self._ready.set()
                stream = self.client.watch(
                    Pod, namespace=self.namespace, resource_version=listing.resourceVersion
                )
                async for _event, pod in stream:
                    self._seen(pod.to_dict())
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the API server restarting, a watch expiring
                self.watch_errors.append(f"{type(error).__name__}: {error}"[:200])
                await asyncio.sleep(0.5)

    def _seen(self, pod: Mapping[str, Any]) -> None:
        name = (pod.get("metadata") or {}).get("name", "")
        outcome = self.outcomes.get(name)
        settled = _outcome_of(pod)
        if outcome is None or settled is None:
            return
        result, node, message = settled
        if result == REFUSED:
            self.refusals_seen += 1
            outcome.message = message
        if outcome.result == REFUSED and result == BOUND:
            self.late_binds.append(name)
            outcome.node = node
            return
        if outcome.result:
            return
        outcome.result, outcome.node, outcome.settled_s = result, node, time.monotonic()
        waiter = self.waiters.pop(name, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def expect(self, name: str, milli: int) -> asyncio.Future[None]:
        self.outcomes[name] = PodOutcome(name, milli, time.monotonic())
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters[name] = future
        return future

    def outcome(self, pods: Sequence[PodRequest], wall_s: float) -> ReplayOutcome:
        """What became of ``pods``, in their order, after a replay of ``wall_s`` seconds."""
        outcomes = [self.outcomes[p.name or ""] for p in pods]
        return ReplayOutcome(outcomes, wall_s, list(self.late_binds), self.refusals_seen)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


async def create_pod(client: lightkube.AsyncClient, manifest: dict[str, Any]) -> None:
    """Create, retrying while the API server cannot be reached (the fault scenario restarts
    it); an "already exists" after a retry means the first try went through."""
    deadline = time.monotonic() + 120
    retried = False
    while True:
        try:
            await client.create(Pod.from_dict(manifest))
            return
        except lightkube.ApiError as error:
            if retried and error.status.code == 409:
                return
            if error.status.code not in (429, 500, 503, 504) or time.monotonic() > deadline:
                raise
        except (OSError, httpx2.TransportError):
            if time.monotonic() > deadline:
                raise
        retried = True
        await asyncio.sleep(0.5)


async def ensure_namespace(client: lightkube.AsyncClient, namespace: str) -> None:
    with contextlib.suppress(lightkube.ApiError):
        await client.create(Namespace.from_dict({"metadata": {"name": namespace}}))


async def replay_in_order(
    client: lightkube.AsyncClient,
    pods: Sequence[PodRequest],
    namespace: str,
    run: str,
    pod_timeout_s: float = 120.0,
    progress: Any = None,
    manifest: ManifestBuilder = pod_manifest,
    scheduler_name: str = SCHEDULER_NAME,
) -> ReplayOutcome:
    """Each pod created once the previous one is settled (bound or unschedulable)."""
    await ensure_namespace(client, namespace)
    watch = PodWatch(client, namespace)
    await watch.start()
    started = time.monotonic()
    try:
        for i, pod in enumerate(pods):
            settled = watch.expect(pod.name or "", gpu_milli(pod))
            await create_pod(client, manifest(pod, namespace, run, scheduler_name))
            try:
                await asyncio.wait_for(settled, pod_timeout_s)
            except TimeoutError:
                raise AssertionError(
                    f"pod {namespace}/{pod.name} neither bound nor marked unschedulable "
                    f"within {pod_timeout_s:.0f} s (pod {i + 1} of {len(pods)})"
                ) from None
            if progress is not None:
                step = progress(i + 1, len(pods), watch)
                if asyncio.iscoroutine(step):
                    await step  # the fault scenario acts between pods
        wall = time.monotonic() - started
        # Refused pods stay in the scheduler's queue: give retries a moment to show a late bind.
        await asyncio.sleep(LATE_BIND_GRACE_S)
    finally:
        await watch.stop()
    return watch.outcome(pods, wall)


async def replay_burst(
    client: lightkube.AsyncClient,
    pods: Sequence[PodRequest],
    namespace: str,
    run: str,
    parallel: int = 8,
    settle_timeout_s: float = 600.0,
    scheduler_name: str = SCHEDULER_NAME,
    manifest: ManifestBuilder = pod_manifest,
) -> ReplayOutcome:
    """Every pod created as fast as ``parallel`` creators can; waits until all are settled."""
    await ensure_namespace(client, namespace)
    watch = PodWatch(client, namespace)
    await watch.start()
    gate = asyncio.Semaphore(parallel)
    started = time.monotonic()
    futures: list[asyncio.Future[None]] = []

    async def create(pod: PodRequest) -> None:
        async with gate:
            futures.append(watch.expect(pod.name or "", gpu_milli(pod)))
            await create_pod(client, manifest(pod, namespace, run, scheduler_name))

    try:
        await asyncio.gather(*(create(p) for p in pods))
        await asyncio.wait_for(asyncio.gather(*futures), settle_timeout_s)
        wall = time.monotonic() - started
        # Refused pods stay in the scheduler's queue: give retries a moment to show a late bind.
        await asyncio.sleep(LATE_BIND_GRACE_S)
    finally:
        await watch.stop()
    return watch.outcome(pods, wall)


async def bound_pods(
    client: lightkube.AsyncClient, namespace: str, run: str
) -> list[dict[str, Any]]:
    return [
        p.to_dict()
        async for p in client.list(Pod, namespace=namespace, labels={REPLAY_LABEL: run})
        if p.spec is not None and p.spec.nodeName
    ]


def card_overcommit(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """Cards holding more than one GPU of compute by the extender's recorded decisions, and
    bound GPU pods with no decision on their node."""
    held: dict[str, int] = defaultdict(int)
    problems: list[str] = []
    for pod in pods:
        claim = read_claim(pod)
        if claim.request is None or claim.request.kind is RequestKind.NONE:
            continue
        if claim.decision is None:
            problems.append(f"{pod['metadata']['name']}: bound with no decision")
            continue
        for card in claim.decision.cards:
            held[card.uuid] += card.compute_milli
    problems += [f"card {u}: {m} milli held" for u, m in held.items() if m > MILLI_PER_GPU]
    return problems


def decided_elsewhere(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """Bound pods whose recorded decision names another node than the one they are bound
    to: a pod decided twice (by two extenders, or before and after a failover)."""
    return [
        f"{p['metadata']['name']}: decided for {claim.elsewhere}, bound to {claim.node}"
        for p in pods
        if (claim := read_claim(p)).elsewhere
    ]


async def delete_run(client: lightkube.AsyncClient, namespace: str, timeout_s: float = 300) -> None:
    """Delete the namespace's pods at once and wait until none is left (KWOK finishes them)."""
    names = [p.metadata.name async for p in client.list(Pod, namespace=namespace) if p.metadata]
    gate = asyncio.Semaphore(16)

    async def one(name: str) -> None:
        async with gate:
            with contextlib.suppress(lightkube.ApiError):
                await client.delete(Pod, name, namespace=namespace, grace_period=0)

    await asyncio.gather(*(one(n) for n in names if n))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p async for p in client.list(Pod, namespace=namespace)]
        if not left:
            return
        await asyncio.sleep(1)
    raise AssertionError(f"{len(left)} pods of {namespace} still there after {timeout_s:.0f} s")
