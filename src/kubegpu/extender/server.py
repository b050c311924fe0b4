"""The extender's HTTP face: kube-scheduler's filter / prioritize / bind verbs, probes, metrics.

Handlers are thin: parse (:mod:`kubegpu.extender.wire`), ask the :class:`GpuScheduler`, render.
Bind is the one verb with I/O, in kube-scheduler's own steps, one method each: *reserve*
(decide and hold the cards, synchronously, so concurrent binds see each other), *write the
decision* on the pod with its resourceVersion as precondition (pre-bind; a 409 re-reads the pod
and decides again), *bind* (POST the Binding), and *unreserve* when that fails: the recorded
decision is cleared unless the pod turns out bound after all (a lost reply). The pod is read
once per attempt, through :func:`kubegpu.sharing.claim.read_claim`, and the API server is
reached through the :class:`~kubegpu.sharing.podstore.PodStore` port. Only the pod being bound
is locked, never a node.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kubegpu.config.extender import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_INFLIGHT_BODY_BYTES
from kubegpu.extender.dra_rank import DraRanker
from kubegpu.extender.inflight import NONE, InFlight
from kubegpu.extender.leader import LeaderGate
from kubegpu.extender.metrics import ExtenderMetrics, PodLocks
from kubegpu.extender.pending import PendingGpuPods
from kubegpu.extender.preemption import Preemption
from kubegpu.extender.ranking import cpu_pod_priorities, names_with
from kubegpu.extender.reasons import reason_counts
from kubegpu.extender.scheduler import GpuScheduler, Unschedulable, reason_category
from kubegpu.extender.wire import (
    ExtenderArgs,
    NodeNamesCache,
    PriorityEncoder,
    WireError,
    encode_filter_result,
    filter_result,
    parse_binding_args,
    parse_extender_body,
    parse_preemption_args,
    preemption_result,
    priority_list,
)
from kubegpu.httpd import (
    BODY_KEY,
    BadRequest,
    HttpLimits,
    check_depth,
    decode_json,
    hardened_app,
    json_error,
)
from kubegpu.sharing.accounting import ReservationHeld
from kubegpu.sharing.annotations import AllocationDecision
from kubegpu.sharing.claim import PodClaim, annotation_patch, decide, read_claim, release
from kubegpu.sharing.podstate import pod_uid
from kubegpu.sharing.podstore import Evictions, PodConflict, PodGone, PodStore, PodStoreError
from kubegpu.sharing.resources import GpuRequest, RequestError, RequestKind, pod_key

log = logging.getLogger(__name__)

# msgspec: a filter over 5,000 nodes is ~100 KB in and up to ~400 KB of reasons out; the
# standard library's json costs milliseconds of the latency budget on that.
_ENCODER = msgspec.json.Encoder()


def _reply(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_ENCODER.encode(body), status=status, content_type="application/json")


# Connections the verbs listener serves at once. kube-scheduler is its one client, and a burst
# of binds opens a connection each (Go's transport has no per-host limit): no per-client cap
# below the total, or the scheduler would be throttled. The listener faces only kube-scheduler
# (loopback in the second-scheduler layout, mutual TLS in the default-scheduler one); the head,
# handshake and body deadlines free a slow client's slots.
EXTENDER_MAX_CONNECTIONS = 4096
# The metrics listener faces Prometheus and the kubelet's probes, on the pod network.
METRICS_LIMITS = HttpLimits(max_body_bytes=1024, max_inflight_body_bytes=64 * 1024)


class _Refused(Exception):
    """A bind step's refusal: ``result`` labels the binds metric, ``reason`` goes back to
    kube-scheduler."""

    def __init__(self, result: str, reason: str) -> None:
        super().__init__(reason)
        self.result = result
        self.reason = reason


class ExtenderApp:
    """Everything the HTTP handlers need, wired by the composition root (or a test)."""

    def __init__(
        self,
        scheduler: GpuScheduler,
        pods: PodStore,
        *,
        registry: CollectorRegistry | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_inflight_body_bytes: int = DEFAULT_MAX_INFLIGHT_BODY_BYTES,
        body_timeout_s: float = 30.0,
        head_timeout_s: float = 30.0,
        bind_attempts: int = 5,
        leader: LeaderGate | None = None,
        dra: DraRanker | None = None,
        evictions: Evictions | None = None,
        preempt: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.leader = leader
        self.dra = dra
        self.view = scheduler.view
        self.pods = pods
        self.metrics = ExtenderMetrics(registry or CollectorRegistry())
        self.inflight = InFlight(scheduler, self.metrics)  # filter and score see binds to come
        # Without a store for evictions the verb still answers; the extender evicts nothing.
        self.preemption = Preemption(
            scheduler, evictions, self.metrics, leader=leader, enabled=preempt
        )
        self.metrics.registry.register(
            PendingGpuPods(
                lambda: list(self.view.pod_json.values()), self.view.names, self.view.synced.is_set
            )
        )
        self.limits = HttpLimits(
            head_timeout_s=head_timeout_s,
            body_timeout_s=body_timeout_s,
            max_body_bytes=max_body_bytes,
            max_inflight_body_bytes=max(max_inflight_body_bytes, max_body_bytes),
            max_connections=EXTENDER_MAX_CONNECTIONS,
            max_connections_per_client=EXTENDER_MAX_CONNECTIONS,
        )
        self.metrics_limits = dataclasses.replace(METRICS_LIMITS, head_timeout_s=head_timeout_s)
        self.bind_attempts = bind_attempts
        self.pod_locks = PodLocks()
        self._node_names = NodeNamesCache()
        # Pod JSON -> its GPU request (or why it has none that can be served): prioritize
        # sends the bytes filter just got; parsing quantities costs ~0.1 ms a pod.
        self._requests: collections.OrderedDict[bytes, GpuRequest | str] = collections.OrderedDict()
        self._priorities: PriorityEncoder | None = None

    def application(self) -> web.Application:
        app = hardened_app(
            self.limits,
            error_body=json_error,
            refusals=self.metrics.refused,
            body_bytes=self.metrics.body_bytes_in_flight,
            body_hint="with kube-scheduler's nodeCacheCapable: false, start the extender with "
            "node-cache-capable: false, or raise max-body-bytes",
            outer=[self._served],
        )
        app.router.add_post("/filter", self._timed("filter", self.handle_filter))
        app.router.add_post("/prioritize", self._timed("prioritize", self.handle_prioritize))
        app.router.add_post(
            "/prioritize-dra", self._timed("prioritize-dra", self.handle_prioritize_dra)
        )
        app.router.add_post("/bind", self._timed("bind", self.handle_bind))
        app.router.add_post("/preempt", self._timed("preempt", self.handle_preempt))
        app.router.add_get("/healthz", self.handle_healthz)
        app.router.add_get("/readyz", self.handle_readyz)
        app.router.add_get("/metrics", self.handle_metrics)
        return app

    def metrics_application(self) -> web.Application:
        """The read-only face for the metrics listener: ``/metrics``, ``/healthz`` and
        ``/readyz`` of the same process, nothing else (any other path, the verbs included,
        is 404). Served as plain HTTP off loopback (config.py says why that is safe); no
        handler reads a body, hence the 1 KiB limit."""
        app = hardened_app(
            self.metrics_limits,
            error_body=json_error,
            refusals=self.metrics.refused,
        )
        app.router.add_get("/healthz", self.handle_healthz)
        app.router.add_get("/readyz", self.handle_readyz)
        app.router.add_get("/metrics", self.handle_metrics)
        return app

    @web.middleware
    async def _served(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """Marks the request served from its head to its answer, its body's reading included
        (a 100 KB filter body arrives in several reads), so a workload refresh's build steps
        aside for all of it (:meth:`GpuScheduler.serving`)."""
        with self.scheduler.serving():
            return await handler(request)

    def _timed(
        self, verb: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        histogram = self.metrics.latency.labels(verb)

        async def timed(request: web.Request) -> web.StreamResponse:
            start = time.perf_counter()
            try:
                return await handler(request)
            finally:
                histogram.observe(time.perf_counter() - start)

        return timed

    async def _body(self, request: web.Request, verb: str) -> Any:
        raw = request[BODY_KEY]  # read by the foundation, within its limits
        try:
            return decode_json(raw, max_depth=self.limits.max_json_depth)
        except BadRequest as exc:
            raise self._not_json(verb, exc) from None

    def _not_json(self, verb: str, exc: Exception) -> web.HTTPBadRequest:
        self.metrics.bad_requests.labels(verb).inc()
        if isinstance(exc, BadRequest):
            why = str(exc)
        elif isinstance(exc, UnicodeDecodeError):
            why = f"body is not JSON: not UTF-8 ({exc.reason})"
        else:
            why = f"body is not JSON: {exc}"
        return web.HTTPBadRequest(text=json.dumps({"Error": why}), content_type="application/json")

    async def _extender_args(self, request: web.Request, verb: str) -> ExtenderArgs:
        """The ExtenderArgs of a filter or prioritize call (raises 400 / 413 / WireError)."""
        raw = request[BODY_KEY]  # read by the foundation, within its limits
        try:
            return parse_extender_body(raw, self._node_names, self._check_depth)
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError, BadRequest) as exc:
            # msgspec checks UTF-8 inside strings and says so with a UnicodeDecodeError.
            raise self._not_json(verb, exc) from None

    def _check_depth(self, value: Any) -> None:
        check_depth(value, self.limits.max_json_depth)

    def _gpu_request(self, args: ExtenderArgs) -> GpuRequest:
        """The call's pod's request (its claim's), remembered under the pod's bytes; raises
        :class:`RequestError` for one that cannot be served."""
        found = self._requests.get(args.pod_raw) if args.pod_raw is not None else None
        if found is None:
            claim = read_claim(args.pod, self.view.names)
            # A message, not an exception: re-raising one grows its traceback.
            found = claim.request if claim.request is not None else claim.refusal
            if args.pod_raw is not None:
                self._requests[args.pod_raw] = found
            if len(self._requests) > 64:
                self._requests.popitem(last=False)
        if isinstance(found, str):
            raise RequestError(found)
        return found

    def _bad(self, verb: str, exc: Exception) -> web.Response:
        self.metrics.bad_requests.labels(verb).inc()
        log.warning("%s: malformed request: %s", verb, exc)
        return _reply({"Error": f"malformed {verb} request: {exc}"}, status=400)

    # ------------------------------------------------------------------ filter / prioritize
    async def handle_filter(self, request: web.Request) -> web.Response:
        try:
            args = await self._extender_args(request, "filter")
        except WireError as exc:
            return self._bad("filter", exc)
        if not self.view.synced.is_set():
            return _reply(filter_result(args, [], {}, {}, "kubegpu extender has not synced yet"))
        try:
            gpu = self._gpu_request(args)
        except RequestError as exc:
            # Every node fails for the same, actionable reason; preemption cannot help.
            reason = str(exc)
            self.metrics.decisions.labels("filter", "invalid-request").inc()
            self.metrics.rejections.labels("invalid-request").inc(len(args.node_names))
            return _reply(filter_result(args, [], {}, dict.fromkeys(args.node_names, reason)))
        uid = pod_uid(args.pod)
        held = self.preemption.without_own_hold(uid)
        outcome = self.inflight.filter(args.pod, gpu, args.node_names)
        self.preemption.restore_hold(held)
        if not outcome.passed and outcome.failed:
            # Some node might take it once lower-priority pods go: if kube-scheduler's own
            # preemption cannot see that (card memory or compute), the extender preempts.
            self.preemption.note_unschedulable(args.pod, gpu)
        if gpu.kind is not RequestKind.NONE:
            self.metrics.decisions.labels(
                "filter", "schedulable" if outcome.passed else "unschedulable"
            ).inc()
            for category, count in outcome.categories.items():
                self.metrics.rejections.labels(category).inc(count)
            if not outcome.passed:
                log.info(
                    "pod %s fits none of %d nodes: %s",
                    pod_key(args.pod),
                    len(args.node_names),
                    reason_counts(outcome.failed, outcome.unresolvable),
                )
        if args.nodes is None:
            # Node-cache mode (kube-scheduler's usual): written directly, and the passed list
            # remembered so the prioritize that sends it back is recognised by its bytes.
            body = encode_filter_result(
                outcome.passed, outcome.failed, outcome.unresolvable, self._node_names
            )
            return web.Response(body=body, content_type="application/json")
        return _reply(filter_result(args, outcome.passed, outcome.failed, outcome.unresolvable))

    async def handle_prioritize(self, request: web.Request) -> web.Response:
        try:
            args = await self._extender_args(request, "prioritize")
        except WireError as exc:
            return self._bad("prioritize", exc)
        try:
            gpu = self._gpu_request(args)
        except RequestError:
            return _reply([])  # filter already explained it
        if not self.view.synced.is_set():
            return _reply([])
        held = self.preemption.without_own_hold(pod_uid(args.pod))
        _, rows, scores = self.inflight.prioritize(args.pod, gpu, args.node_names)
        self.preemption.restore_hold(held)
        names = self.scheduler.row_names
        if self._priorities is None or self._priorities.names is not names:
            self._priorities = PriorityEncoder(names)  # once per engine rebuild
        return web.Response(
            body=self._priorities.encode(rows, scores), content_type="application/json"
        )

    async def handle_prioritize_dra(self, request: web.Request) -> web.Response:
        """The second extender entry's verb (no managed resources, so kube-scheduler sends
        every pod): a score per node for a pod that asks for our GPUs through ResourceClaims
        (``kubegpu.extender.dra_rank``) and for a pod that asks for no GPU at all (the policy
        places it: ``kubegpu.extender.ranking``), 0 everywhere for any other pod."""
        try:
            args = await self._extender_args(request, "prioritize-dra")
        except WireError as exc:
            return self._bad("prioritize-dra", exc)
        if self.dra is not None:
            # The entry is configured, so DRA pods may come: list slices and claims from the
            # first call of any pod (kube-scheduler calls it for every pod), not the first DRA
            # pod's, which would otherwise be ranked blind while the lists load.
            self.dra.dra.start()
        scores = self._cpu_pod_scores(args)
        if scores is None:
            if self.dra is None:
                scores = dict.fromkeys(args.node_names, 0)
            else:
                scores = self.dra.rank(args.pod, args.node_names)
        return _reply(priority_list(list(scores.items())))

    def _cpu_pod_scores(self, args: ExtenderArgs) -> dict[str, int] | None:
        """Scores of a pod asking for no GPU at all, by the policy (``kubegpu.extender.ranking``);
        ``None`` for any other pod."""
        if not self.view.synced.is_set() or (args.pod.get("spec") or {}).get("resourceClaims"):
            return None
        try:
            gpu = self._gpu_request(args)
        except RequestError:
            return None
        if gpu.kind is not RequestKind.NONE:
            return None
        if self.dra is not None:
            # DRA nodes' cards are in slices and claims, not in the node view.
            scores = self.dra.rank_cpu_pod(gpu.to_placement(), args.node_names)
            if scores is not None:
                return scores
        engine = self.scheduler.engine()  # first: rows() maps names onto this engine's rows
        rows = self.scheduler.rows(args.node_names)
        priorities = cpu_pod_priorities(engine, gpu.to_placement(), rows)
        return names_with(args.node_names, priorities)

    # ------------------------------------------------------------------ preempt
    async def handle_preempt(self, request: web.Request) -> web.Response:
        """kube-scheduler's preempt verb (:mod:`kubegpu.extender.preemption`): its proposed
        victims per node, narrowed to those that free a card, nodes where none can left out."""
        try:
            args = parse_preemption_args(await self._body(request, "preempt"))
        except WireError as exc:
            return self._bad("preempt", exc)
        if not self.view.synced.is_set():
            return _reply({"Error": "kubegpu extender has not synced yet"}, status=503)
        try:
            victims = await self.preemption.answer(args)
        except Exception as exc:  # the verb's answer must never be a half-made one
            self.metrics.preemptions.labels("verb", "error").inc()
            log.exception("preempt for pod %s failed", pod_key(args.pod))
            return _reply({"Error": f"kubegpu preempt failed: {exc}"}, status=500)
        return _reply(preemption_result(victims))

    # ------------------------------------------------------------------ bind
    async def handle_bind(self, request: web.Request) -> web.Response:
        try:
            args = parse_binding_args(await self._body(request, "bind"))
        except WireError as exc:
            return self._bad("bind", exc)
        self.preemption.release(args.pod_uid)  # cards held for it are its own now
        async with self.pod_locks.hold(args.pod_uid):
            error = await self.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
        return _reply({"Error": error})

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind one pod; returns "" or the reason it was not bound. kube-scheduler's steps:
        reserve the cards (in memory), write the decision on the pod (pre-bind), post the
        Binding, and on failure unreserve. A 409 on the write decides again on fresh data."""
        tentative = NONE  # where the pod's tentative reservation was, if it had one
        try:
            await self._admit_bind()
            pod = self.view.pod_json.get((namespace, name))
            if pod is not None and pod_uid(pod) != uid:
                pod = None  # the watch has not told of a deletion yet: ask the API server
            for attempt in range(1, self.bind_attempts + 1):
                if pod is None or attempt > 1:
                    pod = await self._read_pod(namespace, name)
                claim = self.view.claim_of(pod)  # the pod spec, parsed once
                if self._settled(claim, uid, node):
                    return ""
                request = claim.request
                if request is None:
                    raise _Refused("invalid-request", claim.refusal)
                if request.kind is RequestKind.NONE:
                    return await self._post_binding(claim, node, recorded=False)
                if claim.decision is not None and claim.decision.node == node:
                    # A retried bind whose decision is already recorded: keep it.
                    return await self._post_binding(claim, node, recorded=True)
                if attempt == 1:  # in the step that decides: the room it held is the pod's own
                    tentative = self.inflight.settle(uid, node)
                decision = self._reserve(pod, request, node)
                patch = annotation_patch(claim, decide(claim, decision))
                if all(value is not None for value in patch.values()):
                    # Nothing to remove (the usual case): the Binding carries the decision.
                    adds = {k: v for k, v in patch.items() if v is not None}
                    bound = await self._bind_with_decision(claim, pod, decision, adds, attempt)
                    if bound is None:
                        continue  # 409: the pod moved on; read it again and decide again
                    return bound
                if not await self._write_decision(claim, decision, patch, attempt):
                    continue  # 409: the pod moved on; read it again and decide again
                return await self._post_binding(claim, node, recorded=True)
            raise _Refused(
                "conflicts",
                f"pod {namespace}/{name}: kept changing while binding "
                f"({self.bind_attempts} attempts)",
            )
        except _Refused as refused:
            self.metrics.binds.labels(refused.result).inc()
            if refused.result == "no-fit":  # the node passed our filter: that answer went stale
                self.metrics.stale_binds.labels(tentative).inc()
            return refused.reason
        finally:
            self.inflight.settle(uid, node)  # whichever way it went, the bind ends it

    async def _admit_bind(self) -> None:
        """Binds wait for the first sync and, with leader election, for the lease."""
        if not self.view.synced.is_set():
            raise _Refused("not-synced", "kubegpu extender has not synced yet")
        if self.leader is not None:
            refusal = await self.leader.refusal()
            if refusal:
                raise _Refused("not-leader", refusal)

    async def _read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            pod = await self.pods.get(namespace, name)
        except PodStoreError as exc:
            why = f"pod {namespace}/{name}: cannot read it: {exc.message}"
            raise _Refused("api-error", why) from None
        self.view.apply_pod(pod)
        return pod

    def _settled(self, claim: PodClaim, uid: str, node: str) -> bool:
        """True when there is nothing to do (already bound to ``node``); refuses a pod that is
        not the one kube-scheduler asked for or is bound elsewhere."""
        if claim.uid != uid:
            raise _Refused(
                "uid-mismatch",
                f"pod {claim.key}: UID is {claim.uid or None}, scheduler asked for {uid}",
            )
        if not claim.node:
            return False
        if claim.node == node:
            self.metrics.binds.labels("already-bound").inc()
            return True
        raise _Refused("bound-elsewhere", f"pod {claim.key} is already bound to {claim.node}")

    def _reserve(self, pod: dict[str, Any], request: GpuRequest, node: str) -> AllocationDecision:
        """Reserve: choose the cards and hold them in the view, synchronously, so that
        concurrent binds see each other (undone by ``view.unreserve``)."""
        try:
            return self.scheduler.decide(pod, request, node)
        except ReservationHeld as exc:  # not while pod_locks serialises a pod's binds
            raise _Refused("in-flight", str(exc)) from None
        except Unschedulable as exc:
            self.metrics.rejections.labels(reason_category(str(exc))).inc()
            log.info("bind of pod %s to %s refused: %s", request.name, node, exc)
            raise _Refused("no-fit", str(exc)) from None

    async def _bind_with_decision(
        self,
        claim: PodClaim,
        pod: Mapping[str, Any],
        decision: AllocationDecision,
        annotations: Mapping[str, str],
        attempt: int,
    ) -> str | None:
        """Pre-bind and bind in one write: the Binding carries the decision's annotations,
        which the API server sets on the pod with ``spec.nodeName``, and the resourceVersion
        the decision was made from as precondition. ``None`` on a 409 (reservation released,
        decide again); "" once bound. One API write and one watch event per bind instead of
        two of each: the extender's bind cost halved on the scale replay (docs/benchmarks.md)."""
        node = decision.node
        try:
            await self.pods.bind(
                claim.namespace,
                claim.name,
                claim.uid,
                node,
                annotations=annotations,
                resource_version=claim.resource_version,
            )
        except PodConflict:
            self._conflict(claim, attempt)
            return None
        except PodStoreError as exc:
            landed = await self._bound_to(claim, node)
            self.view.unreserve(claim.uid)
            if landed is None:
                self.metrics.decisions.labels("bind", "error").inc()
                raise _Refused(
                    "binding-failed", f"pod {claim.key}: binding to {node} failed: {exc.message}"
                ) from None
            # A timeout or lost reply, but the Binding did land, decision and all.
            log.info("pod %s: binding to %s reported %s but landed", claim.key, node, exc)
        else:
            # The pod as the API server now holds it, but for its resourceVersion: it holds the
            # cards as an observed pod until the watch brings the real one.
            self.view.apply_pod(_bound_copy(pod, annotations, node))
            self.view.unreserve(claim.uid)
        self._log_decision(claim, decision)
        self.metrics.binds.labels("bound").inc()
        self.metrics.decisions.labels("bind", "bound").inc()
        return ""

    def _conflict(self, claim: PodClaim, attempt: int) -> None:
        """A 409 on the bind's write: release the reservation; the caller decides again."""
        self.view.unreserve(claim.uid)
        self.metrics.conflicts.inc()
        log.info("pod %s changed while binding (attempt %d)", claim.key, attempt)

    def _log_decision(self, claim: PodClaim, decision: AllocationDecision) -> None:
        log.info(
            "pod %s -> node %s cards %s (%s)",
            claim.key,
            decision.node,
            ",".join(str(i) for i in decision.gpu_indices),
            self.scheduler.policy,
        )

    async def _bound_to(self, claim: PodClaim, node: str) -> dict[str, Any] | None:
        """The pod, read again, when it is bound to ``node`` with a decision recorded (a
        Binding whose reply was lost landed after all); else ``None``."""
        try:
            pod = await self.pods.get(claim.namespace, claim.name)
        except PodStoreError:
            return None
        again = read_claim(pod, self.view.names)
        if again.uid != claim.uid or again.node != node or again.decision is None:
            return None
        self.view.apply_pod(pod)
        return pod

    async def _write_decision(
        self,
        claim: PodClaim,
        decision: AllocationDecision,
        patch: Mapping[str, str | None],
        attempt: int,
    ) -> bool:
        """Pre-bind, when the decision must also remove annotations (a Binding can only set
        them): record ``decision`` on the pod, conditional on the resourceVersion it was made
        from. False on a 409 (reservation released, decide again); the reservation gives way
        to the recorded decision either way."""
        try:
            patched = await self.pods.patch_annotations(
                claim.namespace, claim.name, patch, claim.resource_version
            )
        except PodConflict:
            self._conflict(claim, attempt)
            return False
        except PodStoreError as exc:
            self.view.unreserve(claim.uid)
            raise _Refused(
                "api-error", f"pod {claim.key}: recording the GPU decision failed: {exc.message}"
            ) from None
        # The patched pod now carries the decision: it holds the cards as an observed pod.
        self.view.apply_pod(patched)
        self.view.unreserve(claim.uid)
        self._log_decision(claim, decision)
        return True

    async def _post_binding(self, claim: PodClaim, node: str, *, recorded: bool) -> str:
        """Bind: POST the Binding; a failure unreserves the recorded decision, unless the
        Binding turns out to have landed after all (a lost reply)."""
        try:
            await self.pods.bind(claim.namespace, claim.name, claim.uid, node)
        except PodStoreError as exc:
            if recorded and await self._unreserve(claim.namespace, claim.name, claim.uid, node):
                # A timeout or lost reply, but the Binding did land: the pod is on the node
                # its decision names, so the bind succeeded.
                log.info("pod %s: binding to %s reported %s but landed", claim.key, node, exc)
            else:
                self.metrics.decisions.labels("bind", "error").inc()
                raise _Refused(
                    "binding-failed", f"pod {claim.key}: binding to {node} failed: {exc.message}"
                ) from None
        self.metrics.binds.labels("bound").inc()
        self.metrics.decisions.labels("bind", "bound").inc()
        return ""

    async def _unreserve(self, namespace: str, name: str, uid: str, node: str) -> bool:
        """Unreserve after a failed Binding: clear the decision recorded for it so its cards
        are free again; True (and the decision kept) when the pod turns out bound to ``node``
        after all.

        The pod is read first, and the clearing patch carries that read's resourceVersion: an
        error does not prove the Binding did not land (a timeout), and a pod deleted and
        created again under the same name is not ours to touch."""
        for _ in range(self.bind_attempts):
            try:
                pod = await self.pods.get(namespace, name)
            except PodGone:
                return False  # gone, and its decision with it
            except PodStoreError:
                break
            self.view.apply_pod(pod)
            claim = read_claim(pod, self.view.names)
            if claim.uid != uid:
                return False
            if claim.node == node:
                return True
            if not claim.recorded:
                return False
            try:
                cleared = await self.pods.patch_annotations(
                    namespace, name, annotation_patch(claim, release(claim)), claim.resource_version
                )
            except (PodConflict, PodGone):
                continue  # changed meanwhile: look again
            except PodStoreError:
                break
            self.view.apply_pod(cleared)
            return False
        # The pod keeps a decision it does not use: it holds those cards until it is
        # rescheduled (a new decision replaces it) or deleted. Conservative, never over.
        log.warning(
            "pod %s/%s: could not clear its GPU decision after the failed binding", namespace, name
        )
        return False

    # ------------------------------------------------------------------ probes
    async def handle_healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def handle_readyz(self, request: web.Request) -> web.Response:
        if self.view.synced.is_set():
            return web.Response(text="ok")
        return web.Response(text="not synced", status=503)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _bound_copy(
    pod: Mapping[str, Any], annotations: Mapping[str, str], node: str
) -> dict[str, Any]:
    """``pod`` as a Binding to ``node`` carrying ``annotations`` leaves it."""
    meta = dict(pod.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    return {**pod, "metadata": meta, "spec": {**(pod.get("spec") or {}), "nodeName": node}}
