"""A kube-scheduler stand-in that schedules through the extender, over real HTTP.

What it owns: the part of kube-scheduler a cluster with our extender relies on, for the demo and
for end-to-end tests where no real kube-scheduler can run. It lists and watches nodes and pods
through lightkube, and for every pending pod whose ``spec.schedulerName`` is ours it sends the
extender exactly what kube-scheduler sends with ``nodeCacheCapable: true``: ``ExtenderArgs``
(``Pod`` plus ``NodeNames``) to ``/filter`` and ``/prioritize``, then ``ExtenderBindingArgs`` to
``/bind`` (the extender posts the Binding itself, as ``bindVerb`` asks).

Deliberate reductions, documented because they change outcomes:

* Of kube-scheduler's in-tree filters only two run, before the extender as in kube-scheduler:
  node Ready and schedulable, and NodeResourcesFit (CPU, memory, pod count, and the extended
  resources the extender leaves to the scheduler: ``nvidia.com/gpu`` and the share slot,
  against the node's ``status.allocatable`` minus what its bound pods request; the card
  memory and compute resources are ``ignoredByScheduler``). Pods just bound count at once, as
  kube-scheduler's "assumed" pods do.
* Scoring is the extender's score alone (kube-scheduler adds its in-tree scores to
  ``score x weight``); ties go to the lexicographically smallest node name, where
  kube-scheduler picks among ties at random. Deterministic runs are worth more in a demo.
* One pod at a time, binding included (kube-scheduler binds asynchronously).

A pod nobody can take gets ``PodScheduled=False`` (reason ``Unschedulable``) with kube-scheduler's
message shape ("0/3 nodes are available: ...") built from the extender's per-node reasons, and a
``FailedScheduling`` Warning Event. Unschedulable pods are retried when capacity may have freed
(a pod deleted or finished, a node added, its GPU inventory or allocatable changed) and, like
kube-scheduler's periodic flush, every ``retry_interval_s`` while idle; at most
``max_attempts`` times each, so a pod nothing can ever hold stops costing extender calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import aiohttp
import lightkube
from lightkube import ApiError
from lightkube.resources.core_v1 import Event, Node, Pod, PodStatus
from lightkube.types import PatchType

from kubegpu.extender.reasons import reason_counts
from kubegpu.sharing.annotations import INVENTORY_ANNOTATION
from kubegpu.sharing.claim import read_claim
from kubegpu.sharing.podstate import pod_uid
from kubegpu.sharing.resources import RequestError, ResourceNames, parse_quantity

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER_NAME = "kubegpu-scheduler"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class SchedulingError(Exception):
    """The extender could not be asked (connection refused, non-JSON answer, HTTP error)."""


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"


def node_ready(node: Mapping[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def unschedulable_message(total_nodes: int, reasons: Mapping[str, str]) -> str:
    """kube-scheduler's FitError wording (framework/types.go): each distinct reason once,
    prefixed by how many nodes gave it, the "count reason" strings sorted as strings (the
    extender's log counts its rejections the same way, with the same function)."""
    return f"0/{total_nodes} nodes are available: {reason_counts(reasons)}."


def pick_node(scores: Mapping[str, int]) -> str:
    """Highest score; ties to the smallest name (kube-scheduler would pick one at random)."""
    return min(scores, key=lambda name: (-scores[name], name))


async def follow(
    client: lightkube.AsyncClient,
    kind: type[Node] | type[Pod],
    *,
    fields: Mapping[str, str] | None = None,
    retry_s: float = 0.5,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """List, then watch from the list's version, forever: ``("ADDED", obj)`` for each listed
    object, ``("SYNCED", {})`` after a list, then watch events. A failed or expired watch lists
    again (objects deleted meanwhile are not reported; callers here only add and update)."""
    extra: dict[str, Any] = {"namespace": "*"} if kind is Pod else {}
    if fields:
        extra["fields"] = dict(fields)
    while True:
        try:
            listing = client.list(kind, **extra)
            objects = [obj.to_dict() async for obj in listing]
            version: str | None = listing.resourceVersion
            for obj in objects:
                yield "ADDED", obj
            yield "SYNCED", {}
            async for event, changed in client.watch(kind, resource_version=version, **extra):
                if event != "BOOKMARK":
                    yield event, cast(Any, changed).to_dict()
        except asyncio.CancelledError:
            raise
        except (ApiError, aiohttp.ClientError, OSError, ValueError) as exc:
            log.info("%s watch interrupted (%s); listing again", kind.__name__, exc)
        except Exception as exc:  # httpx errors: lightkube's transport
            log.info("%s watch interrupted (%s: %s); listing again", kind.__name__, type(exc), exc)
        # The stand-in's own pause before listing again, as kube-scheduler's reflector backs
        # off: behaviour of the component, not a test waiting.
        await asyncio.sleep(retry_s)


@dataclass(frozen=True)
class Footprint:
    """What a pod counts against its node in NodeResourcesFit."""

    cpu_milli: int = 0
    memory_mib: int = 0
    extended: Mapping[str, int] = field(default_factory=dict)


def footprint(pod: Mapping[str, Any], names: ResourceNames) -> Footprint:
    totals = read_claim(pod, names).totals
    if totals is None:
        return Footprint()  # the extender explains; nothing to count
    return Footprint(
        totals.cpu_milli,
        totals.host_memory_mib,
        {names.whole_gpu: totals.whole_gpus, names.share_slot: totals.share_slots},
    )


def node_allocatable(node: Mapping[str, Any]) -> dict[str, int]:
    """``status.allocatable`` as integers: cpu in milli, memory in MiB, the rest as counts."""
    out: dict[str, int] = {}
    for name, raw in ((node.get("status") or {}).get("allocatable") or {}).items():
        try:
            value = parse_quantity(raw)
        except RequestError:
            continue
        if name == "cpu":
            out[name] = int(value * 1000)
        elif name == "memory":
            out[name] = int(value / (1 << 20))
        else:
            out[name] = int(value)
    return out


def fit_reasons(pod: Footprint, node: Mapping[str, Any], bound: list[Footprint]) -> list[str]:
    """NodeResourcesFit's refusals, in its words ("Insufficient cpu", "Too many pods")."""
    allocatable = node_allocatable(node)
    reasons = []
    if len(bound) + 1 > allocatable.get("pods", 110):
        reasons.append("Too many pods")
    if pod.cpu_milli and pod.cpu_milli > allocatable.get("cpu", 0) - sum(
        b.cpu_milli for b in bound
    ):
        reasons.append("Insufficient cpu")
    if pod.memory_mib and pod.memory_mib > allocatable.get("memory", 0) - sum(
        b.memory_mib for b in bound
    ):
        reasons.append("Insufficient memory")
    for name, amount in sorted(pod.extended.items()):
        used = sum(b.extended.get(name, 0) for b in bound)
        if amount and amount > allocatable.get(name, 0) - used:
            reasons.append(f"Insufficient {name}")
    return reasons


@dataclass(frozen=True)
class SchedulerSettings:
    extender_url: str
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    max_attempts: int = 10
    retry_interval_s: float = 5.0
    http_timeout_s: float = 10.0
    names: ResourceNames = field(default_factory=ResourceNames)


@dataclass(frozen=True)
class Outcome:
    """The last scheduling attempt of one pod: ``node`` when bound, else the reasons."""

    pod: str
    uid: str
    node: str | None
    attempts: int
    message: str = ""
    reasons: Mapping[str, str] = field(default_factory=dict)


class ExtenderClient:
    """kube-scheduler's HTTP extender client (``HTTPExtender``), cache-capable flavour."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url.rstrip("/")
        self.session = session

    async def _post(self, verb: str, body: Mapping[str, Any]) -> Any:
        try:
            async with self.session.post(
                f"{self.url}/{verb}",
                data=json.dumps(body),
                headers={"Content-Type": "application/json"},
            ) as response:
                text = await response.text()
                if response.status != 200:
                    raise SchedulingError(f"extender {verb}: HTTP {response.status}: {text[:300]}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SchedulingError(f"extender {verb}: {type(exc).__name__}: {exc}") from exc
        try:
            return json.loads(text)
        except ValueError as exc:
            raise SchedulingError(f"extender {verb}: answer is not JSON: {text[:200]}") from exc

    async def filter(
        self, pod: Mapping[str, Any], nodes: list[str]
    ) -> tuple[list[str], dict[str, str]]:
        """Passing node names and node -> reason for the others."""
        result = await self._post("filter", {"Pod": pod, "Nodes": None, "NodeNames": nodes})
        if not isinstance(result, dict):
            raise SchedulingError(f"extender filter: not an ExtenderFilterResult: {result!r:.200}")
        if result.get("Error"):
            raise SchedulingError(f"extender filter: {result['Error']}")
        passed = [str(n) for n in (result.get("NodeNames") or [])]
        failed = {
            **{str(k): str(v) for k, v in (result.get("FailedNodes") or {}).items()},
            **{str(k): str(v) for k, v in (result.get("FailedAndUnresolvableNodes") or {}).items()},
        }
        return passed, failed

    async def prioritize(self, pod: Mapping[str, Any], nodes: list[str]) -> dict[str, int]:
        result = await self._post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": nodes})
        scores = dict.fromkeys(nodes, 0)
        for item in result or []:
            host = item.get("Host") if isinstance(item, dict) else None
            if host in scores:
                scores[host] = int(item.get("Score") or 0)
        return scores

    async def bind(self, pod: Mapping[str, Any], node: str) -> str:
        meta = pod.get("metadata") or {}
        result = await self._post(
            "bind",
            {
                "PodName": meta.get("name"),
                "PodNamespace": meta.get("namespace") or "default",
                "PodUID": meta.get("uid"),
                "Node": node,
            },
        )
        return str((result or {}).get("Error") or "") if isinstance(result, dict) else str(result)


class SchedulerStandIn:
    """``await SchedulerStandIn(client, settings).run()`` schedules until cancelled.

    ``outcomes`` holds every pod's latest attempt; ``on_outcome`` is called after each one.
    """

    def __init__(
        self,
        client: lightkube.AsyncClient,
        settings: SchedulerSettings,
        *,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.on_outcome = on_outcome
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> pod JSON, ours and pending
        self.bound: dict[str, tuple[str, Footprint]] = {}  # uid -> node, request (any pod)
        self.outcomes: dict[str, Outcome] = {}
        self._active: dict[str, None] = {}  # FIFO of uids to try
        self._unschedulable: dict[str, int] = {}  # uid -> attempts so far
        self._attempts: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._synced: set[str] = set()
        self.synced = asyncio.Event()

    @property
    def queue_length(self) -> int:
        return len(self._active)

    def idle(self) -> bool:
        """Nothing queued and no pod of ours left pending without a verdict."""
        return not self._active and all(uid in self.outcomes for uid in self.pods)

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.settings.http_timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            asyncio.TaskGroup() as group,
        ):
            extender = ExtenderClient(self.settings.extender_url, session)
            group.create_task(self._watch_nodes())
            group.create_task(self._watch_pods())
            group.create_task(self._loop(extender))

    # ------------------------------------------------------------------ informers
    def _mark_synced(self, what: str) -> None:
        self._synced.add(what)
        if self._synced >= {"nodes", "pods"}:
            self.synced.set()
            self._wake.set()

    async def _watch_nodes(self) -> None:
        async for event, node in follow(self.client, Node):
            if event == "SYNCED":
                self._mark_synced("nodes")
                continue
            name = str((node.get("metadata") or {}).get("name") or "")
            before = self.nodes.get(name)
            if event == "DELETED":
                self.nodes.pop(name, None)
                continue
            self.nodes[name] = node
            if before is None or _inventory(before) != _inventory(node):
                self._retry_unschedulable(f"node {name} added or its GPUs changed")
            elif node_allocatable(before) != node_allocatable(node):
                self._retry_unschedulable(f"node {name}: allocatable changed")

    async def _watch_pods(self) -> None:
        async for event, pod in follow(self.client, Pod):
            if event == "SYNCED":
                self._mark_synced("pods")
                continue
            uid = pod_uid(pod)
            spec = pod.get("spec") or {}
            status = pod.get("status") or {}
            meta = pod.get("metadata") or {}
            gone = event == "DELETED" or status.get("phase") in TERMINAL_PHASES
            if gone and self.bound.pop(uid, None) is not None:
                # A bound pod left: its node resources and cards are free again.
                self._retry_unschedulable(f"pod {pod_name(pod)} finished or was deleted")
            elif not gone and spec.get("nodeName"):
                self.bound[uid] = (str(spec["nodeName"]), footprint(pod, self.settings.names))
            ours = spec.get("schedulerName") == self.settings.scheduler_name
            if gone or spec.get("nodeName") or meta.get("deletionTimestamp") or not ours:
                self.pods.pop(uid, None)
                self._active.pop(uid, None)
                self._unschedulable.pop(uid, None)
                continue
            first_time = uid not in self.pods
            self.pods[uid] = pod
            if first_time and uid not in self.outcomes:
                self._active[uid] = None
                self._wake.set()

    def _retry_unschedulable(self, why: str) -> None:
        retry = [u for u, n in self._unschedulable.items() if n < self.settings.max_attempts]
        if not retry:
            return
        log.info("retrying %d unschedulable pods: %s", len(retry), why)
        for uid in retry:
            self._unschedulable.pop(uid, None)
            self._active[uid] = None
        self._wake.set()

    # ------------------------------------------------------------------ scheduling
    async def _loop(self, extender: ExtenderClient) -> None:
        await self.synced.wait()
        while True:
            if not self._active:
                self._wake.clear()
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
                # that lands as the event is set, and this loop then never ends (seen as a demo
                # hanging after Ctrl-C).
                try:
                    async with asyncio.timeout(self.settings.retry_interval_s):
                        await self._wake.wait()
                except TimeoutError:
                    # Like kube-scheduler's periodic flush of its unschedulable queue: covers a
                    # freed card the extender had not seen yet when the event retry ran.
                    self._retry_unschedulable("periodic retry")
                continue
            uid = next(iter(self._active))
            del self._active[uid]
            pod = self.pods.get(uid)
            if pod is None:
                continue
            outcome = await self.schedule_one(extender, pod)
            self.outcomes[uid] = outcome
            if outcome.node is None and uid in self.pods:
                self._unschedulable[uid] = outcome.attempts
            if self.on_outcome is not None:
                self.on_outcome(outcome)

    async def schedule_one(self, extender: ExtenderClient, pod: dict[str, Any]) -> Outcome:
        uid = pod_uid(pod)
        key = pod_name(pod)
        attempts = self._attempts.get(uid, 0) + 1
        self._attempts[uid] = attempts
        reasons: dict[str, str] = {}
        wants = footprint(pod, self.settings.names)
        on_node: dict[str, list[Footprint]] = {}
        for node_name, use in self.bound.values():
            on_node.setdefault(node_name, []).append(use)
        candidates = []
        for name, node_obj in sorted(self.nodes.items()):
            if not node_ready(node_obj):
                reasons[name] = "node(s) were not ready or were unschedulable"
            elif misfit := fit_reasons(wants, node_obj, on_node.get(name, [])):
                reasons[name] = ", ".join(misfit)
            else:
                candidates.append(name)
        try:
            passed, failed = await extender.filter(pod, candidates) if candidates else ([], {})
            reasons.update(failed)
            if passed:
                scores = await extender.prioritize(pod, passed)
                node = pick_node(scores)
                error = await extender.bind(pod, node)
                if not error:
                    self.bound[uid] = (node, wants)  # assumed until the watch says so
                    log.info("pod %s bound to node %s (score %d)", key, node, scores[node])
                    return Outcome(key, uid, node, attempts)
                reasons = {node: f"binding rejected: {error}"}
        except SchedulingError as exc:
            reasons.update({name: str(exc) for name in candidates} or {"-": str(exc)})
        message = unschedulable_message(len(self.nodes), reasons)
        log.info("pod %s unschedulable (attempt %d): %s", key, attempts, message)
        await self._record_unschedulable(pod, message)
        return Outcome(key, uid, None, attempts, message, reasons)

    async def _record_unschedulable(self, pod: Mapping[str, Any], message: str) -> None:
        meta = pod.get("metadata") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace") or "default")
        now = now_rfc3339()
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": now,
        }
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{secrets.token_hex(8)}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": name,
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            "reason": "FailedScheduling",
            "message": message,
            "type": "Warning",
            "source": {"component": self.settings.scheduler_name},
            "reportingComponent": self.settings.scheduler_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        with contextlib.suppress(ApiError):  # the pod may be gone meanwhile
            await self.client.patch(
                PodStatus,
                name,
                {"status": {"conditions": [condition]}},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
        try:
            await self.client.create(cast(Event, Event.from_dict(event)))
        except ApiError as exc:
            log.warning(
                "pod %s/%s: could not record FailedScheduling event: %s", namespace, name, exc
            )


def _inventory(node: Mapping[str, Any]) -> str | None:
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(INVENTORY_ANNOTATION)
    return None if value is None else str(value)
