"""The extender's composition root: client, cluster view, scheduler and HTTP server, started
and stopped together (one owner for every task, so none is orphaned).

The extender edge (verbs, scheduler, leader gate) gets the kube edge's pieces here: the
lightkube client, the :class:`~kubegpu.kube.view.ClusterView`, the Lease reader. The files the
settings name (TLS, kubeconfig, workload) are checked here before anything starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from types import TracebackType

from prometheus_client import CollectorRegistry

from kubegpu.config.extender import ExtenderConfig, ExtenderConfigError, load_workload
from kubegpu.core.dra import DRA_NAMINGS
from kubegpu.core.version_skew import parse_version, server_minor, skew_problem
from kubegpu.extender.dra_rank import DraRanker
from kubegpu.extender.leader import LeaderGate, default_identity
from kubegpu.extender.scheduler import GpuScheduler
from kubegpu.extender.server import ExtenderApp
from kubegpu.httpd import HttpListener
from kubegpu.kube.binding import ApiPodStore
from kubegpu.kube.client import (
    AsyncKubeClient,
    KubeconfigError,
    async_client,
    load_kubeconfig,
    server_version,
)
from kubegpu.kube.dra_view import DraClusterView
from kubegpu.kube.evictions import ApiEvictions
from kubegpu.kube.leases import LightkubeLeases, unavailable_as_core
from kubegpu.kube.list_watch import Backoff
from kubegpu.kube.view import ClusterView
from kubegpu.tls import TlsFileError, server_context

log = logging.getLogger(__name__)


def server_ssl_context(config: ExtenderConfig) -> ssl.SSLContext | None:
    """The listener's TLS context; :class:`ExtenderConfigError` naming the file when one is
    unusable."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    try:
        return server_context(config.tls_cert_file, config.tls_key_file, config.client_ca_file)
    except TlsFileError as exc:
        raise ExtenderConfigError(str(exc)) from None


def check_files(config: ExtenderConfig) -> None:
    """Every file the settings name can be used: TLS files, kubeconfig, workload file.

    Run before any I/O (listening, connecting to the API), so a bad file ends the process at
    start with one line naming it, not with a traceback once serving has begun."""
    server_ssl_context(config)
    try:
        load_kubeconfig(config.kubeconfig)
    except KubeconfigError as exc:
        raise ExtenderConfigError(str(exc)) from None
    if config.workload_file is not None:
        load_workload(config.workload_file)


class ExtenderService:
    """``async with ExtenderService(config) as service:`` serves until the block ends."""

    def __init__(
        self,
        config: ExtenderConfig,
        *,
        client: AsyncKubeClient | None = None,
        backoff: Backoff | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.client = client or async_client(config.kubeconfig)
        self.view = ClusterView(self.client, config.names, backoff=backoff)
        workload = load_workload(config.workload_file) if config.workload_file else None
        self.scheduler = GpuScheduler(
            self.view,
            config.policy,
            workload=workload,
            workload_refresh_s=config.workload_refresh_s,
        )
        # Watches slices and claims only once kube-scheduler first calls /prioritize-dra.
        naming = DRA_NAMINGS[config.dra_naming]
        self.dra_view = DraClusterView(self.client, naming, backoff=backoff)
        leader = None
        if config.leader_lease:
            leader = LeaderGate(
                LightkubeLeases(self.client),
                config.leader_lease,
                config.leader_identity or default_identity(),
                catch_up=unavailable_as_core(self.view.resync_pods),
            )
        self.app = ExtenderApp(
            self.scheduler,
            ApiPodStore(self.client),
            registry=registry,
            max_body_bytes=config.body_limit_bytes,
            max_inflight_body_bytes=config.inflight_limit_bytes,
            body_timeout_s=config.request_body_timeout_s,
            head_timeout_s=config.request_head_timeout_s,
            bind_attempts=config.bind_attempts,
            leader=leader,
            dra=DraRanker(self.scheduler, self.dra_view, naming),
            evictions=ApiEvictions(self.client),
            preempt=config.preemption,
        )
        self._listener: HttpListener | None = None
        self._metrics_listener: HttpListener | None = None
        self._view_task: asyncio.Task[None] | None = None
        self.port = config.port
        self.metrics_port = config.metrics_port  # the bound one once started (port 0)

    @property
    def url(self) -> str:
        scheme = "https" if self.config.tls else "http"
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        return f"{scheme}://{host}:{self.port}"

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port`` of the metrics listener, or None when it is off."""
        if self.metrics_port is None:
            return None
        host = self.config.metrics_host
        return f"http://{host if ':' not in host else f'[{host}]'}:{self.metrics_port}"

    async def start(self) -> None:
        if self.config.scheduler_version is not None:
            await self._check_scheduler_version(self.config.scheduler_version)
        self._view_task = asyncio.create_task(self.view.run(), name="kubegpu-cluster-view")
        listener = HttpListener(
            self.app.application(),
            self.config.host,
            self.config.port,
            name="kubegpu extender",
            ssl_context=server_ssl_context(self.config),
            backlog=2048,
        )
        try:
            await listener.start()
        except OSError as exc:
            await self.stop()
            raise ExtenderConfigError(
                f"host/port {self.config.host}:{self.config.port}: cannot listen there "
                f"({exc.strerror or exc})"
            ) from None
        self._listener = listener
        self.port = listener.port
        if self.config.metrics_port is not None:
            try:
                await self._start_metrics(self.config.metrics_host, self.config.metrics_port)
            except ExtenderConfigError:
                await self.stop()
                raise
        log.info(
            "kubegpu extender on %s, policy %s, resources %s, %s",
            self.url,
            self.config.policy,
            ",".join(self.config.names.all),
            f"binds while lease {self.app.leader.lease} names {self.app.leader.identity}"
            if self.app.leader
            else "binds whenever asked (no leader-lease)",
        )

    async def _check_scheduler_version(self, scheduler_version: str) -> None:
        """Refuse (ExtenderConfigError, exit 2) a kube-scheduler the skew policy does not allow with
        this API server; an API that does not answer is only a warning (the view retries)."""
        try:
            server = server_minor(await server_version(self.client))
        except Exception as exc:
            log.warning(
                "cannot read the API server's version to check kube-scheduler %s against it: %s",
                scheduler_version,
                exc,
            )
            return
        problem = skew_problem(parse_version(scheduler_version), server)
        if problem is not None:
            raise ExtenderConfigError(f"scheduler-version: {problem}")
        log.info("kube-scheduler %s fits the API server v%d.%d", scheduler_version, *server)

    async def _start_metrics(self, host: str, port: int) -> None:
        # Plain HTTP on purpose, whatever the address: read-only endpoints, no verb.
        listener = HttpListener(
            self.app.metrics_application(), host, port, name="kubegpu extender metrics"
        )
        try:
            await listener.start()
        except OSError as exc:
            raise ExtenderConfigError(
                f"metrics-host/metrics-port {host}:{port}: cannot listen there "
                f"({exc.strerror or exc})"
            ) from None
        self._metrics_listener = listener
        self.metrics_port = listener.port
        log.info("metrics, /healthz and /readyz (read-only, plain HTTP) on %s", self.metrics_url)

    async def stop(self) -> None:
        for listener in (self._metrics_listener, self._listener):
            if listener is not None:
                await listener.stop()
        self._metrics_listener = self._listener = None
        await self.app.preemption.close()
        await self.dra_view.close()
        if self._view_task is not None:
            self._view_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._view_task
            self._view_task = None

    async def wait_synced(self, timeout_s: float = 30.0) -> None:
        async with asyncio.timeout(timeout_s):
            await self.view.synced.wait()

    async def __aenter__(self) -> ExtenderService:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
