"""Every HTTP listener kubegpu has, started the way its role starts it but with short deadlines
and small connection caps, so the hostile-client cases in test_hostile_clients.py run against
each in seconds. A new listener is covered by adding it here."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.config.extender import ExtenderConfig
from kubegpu.exporter.server import ExporterSettings, start_exporter
from kubegpu.httpd import HttpLimits
from kubegpu.inventory.fake_metrics import FakeMetricsSource
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.kube.list_watch import Backoff
from kubegpu.probes import ProbeResult, start_probe_server
from kubegpu.roles.extender import ExtenderService
from kubegpu.sharing.resources import ResourceNames
from kubegpu.testing.apiserver import FakeApiServer
from kubegpu.webhook.server import serve_webhook
from tests.extender.cluster import filter_args, gpu_node, whole_pod

# Short enough that every case finishes in seconds, long enough that a loaded CI machine
# still sends a whole well-behaved request well inside them.
LIMITS = HttpLimits(
    head_timeout_s=1.0,
    body_timeout_s=1.0,
    max_body_bytes=256 * 1024,
    max_inflight_body_bytes=4 * 1024 * 1024,
    max_connections=40,
    max_connections_per_client=8,
)


@dataclass
class Surface:
    """One listener: where it is, a request it must always answer (status < 400), and the JSON
    bodies its POST routes accept (for the deep-JSON and wrong-type cases)."""

    name: str
    port: int
    limits: HttpLimits
    probe_path: str
    json_posts: dict[str, Any] = field(default_factory=dict)
    status_ok: Callable[[int], bool] = lambda status: status < 400


class LoopThread:
    """An event loop in a daemon thread, for listeners that live on a role's loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout_s: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


@contextlib.contextmanager
def extender_surfaces() -> Iterator[list[Surface]]:
    """The extender's verbs listener and its read-only metrics listener, one service."""
    loop = LoopThread()
    stack = contextlib.AsyncExitStack()

    async def start() -> ExtenderService:
        server = await stack.enter_async_context(FakeApiServer())
        server.store.put("nodes", gpu_node("node-a"))
        # (The fake API server has no resource.k8s.io, so /prioritize-dra answers here before
        # it reads a claim; test_dra_rank gives the ranker every wrong-typed pod.)
        return await stack.enter_async_context(_running_with_limits(server))

    service: ExtenderService = loop.run(start())
    pod = whole_pod("p", 1)
    # A pod asking through a ResourceClaim, with the status the scheduler sees, so that every
    # field /prioritize-dra reads is there to be given the wrong type.
    dra_pod = {
        **pod,
        "spec": {
            **pod["spec"],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu"}]},
    }
    bind = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "node-a"}
    try:
        assert service.metrics_port is not None
        yield [
            Surface(
                "extender",
                service.port,
                service.app.limits,
                "/healthz",
                {
                    "/filter": filter_args(pod, ["node-a"]),
                    "/prioritize": filter_args(pod, ["node-a"]),
                    "/prioritize-dra": filter_args(dra_pod, ["node-a"]),
                    "/bind": bind,
                },
            ),
            Surface(
                "extender-metrics", service.metrics_port, service.app.metrics_limits, "/metrics"
            ),
        ]
    finally:
        loop.run(stack.aclose())
        loop.close()


@contextlib.asynccontextmanager
async def _running_with_limits(server: FakeApiServer) -> AsyncIterator[ExtenderService]:
    """The extender as running_extender starts it, with the suite's deadlines (through its
    config) and connection caps (set on the app before it serves: they are not settings)."""
    config = ExtenderConfig(
        port=0,
        metrics_port=0,
        request_head_timeout_s=LIMITS.head_timeout_s,
        request_body_timeout_s=LIMITS.body_timeout_s,
    )
    client = server.async_client()
    service = ExtenderService(config, client=client, backoff=Backoff(0.01, 0.05))
    # Small caps so the cases reach them; the verbs listener keeps its shape (no per-client
    # cap below the total: kube-scheduler is its one client), the metrics one its own.
    service.app.limits = dataclasses.replace(
        service.app.limits,
        max_connections=LIMITS.max_connections,
        max_connections_per_client=LIMITS.max_connections,
    )
    service.app.metrics_limits = dataclasses.replace(
        service.app.metrics_limits,
        max_connections=LIMITS.max_connections,
        max_connections_per_client=LIMITS.max_connections_per_client,
    )
    try:
        async with service:
            await service.wait_synced()
            yield service
    finally:
        await client.close()


def volcano_review() -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "v", "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"limits": {"volcano.sh/gpu-memory": "2048"}},
                }
            ]
        },
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7f0c",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "default",
            "object": pod,
        },
    }


@contextlib.contextmanager
def webhook_surface() -> Iterator[list[Surface]]:
    server = serve_webhook("127.0.0.1", 0, ResourceNames(), None, limits=LIMITS)
    try:
        yield [
            Surface("peer-webhook", server.port, LIMITS, "/healthz", {"/mutate": volcano_review()})
        ]
    finally:
        server.stop()


class _AlwaysWell:
    async def liveness(self) -> ProbeResult:
        return ProbeResult(True, "ok: alive")

    async def readiness(self) -> ProbeResult:
        return ProbeResult(True, "ok: ready")


@contextlib.contextmanager
def probe_surface() -> Iterator[list[Surface]]:
    """The node agent's and the DRA driver's probe listener (one implementation)."""
    loop = LoopThread()
    server = start_probe_server(("127.0.0.1", 0), _AlwaysWell(), loop.loop, limits=LIMITS)
    try:
        yield [Surface("probes", server.port, LIMITS, "/healthz")]
    finally:
        server.stop()
        loop.close()


@contextlib.contextmanager
def exporter_surface(proc: Path) -> Iterator[list[Surface]]:
    inventory = resolve_fake_spec("4xT4").inventory
    running = start_exporter(
        ExporterSettings(node_name="node-a", listen_port=0, interval_s=0.2, proc=proc),
        inventory=lambda: inventory,
        metrics=FakeMetricsSource(inventory),
        limits=LIMITS,
    )
    try:
        yield [Surface("exporter", running.port, LIMITS, "/metrics")]
    finally:
        running.stop()


SURFACES = ("extender", "extender-metrics", "peer-webhook", "probes", "exporter")
