"""The exporter end to end: PodResources over a real unix-socket gRPC server (the kubelet
emulator's), ``/metrics`` and ``/healthz`` over real HTTP on 127.0.0.1, parsed with
``prometheus_client.parser``."""

from __future__ import annotations

import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubegpu.core.health import HealthCheckPolicy
from kubegpu.core.health_feed import HealthFeed
from kubegpu.exporter.pods import PodLogDirectory
from kubegpu.exporter.server import (
    ExporterSettings,
    RunningExporter,
    start_exporter,
)
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.kubelet.pod_resources import KubeletPodResources
from kubegpu.roles.exporter import start_node_exporter
from kubegpu.testing.kubelet import Allocation, ContainerResponse, SeenDevice
from kubegpu.testing.podresources import serve_pod_resources
from kubegpu.testing.waiting import wait_until
from tests.exporter.conftest import GIB, INFER_A, INFER_B, TRAINER, UIDS, Node

RESOURCE = "nvidia.com/gpu"


class KubeletAllocations:
    """What the emulated kubelet has handed out (the servicer's source protocol)."""

    def __init__(self, node: Node) -> None:
        u = node.uuids
        empty = ContainerResponse(envs={}, mounts=(), devices=(), annotations={}, cdi_devices=())

        def alloc(pod: object, container: str, ids: tuple[str, ...]) -> Allocation:
            key = pod  # PodKey
            return Allocation(
                pod_uid=UIDS[key],  # type: ignore[index]
                pod_name=key.name,  # type: ignore[attr-defined]
                namespace=key.namespace,  # type: ignore[attr-defined]
                container=container,
                resource_name=RESOURCE,
                device_ids=ids,
                response=empty,
                preferred_device_ids=None,
                pre_start_called=True,
                # Two NUMA entries for one ID: the client must not count it twice.
                numa_nodes={i: (0, 1) for i in ids},
            )

        self._allocations = [
            alloc(TRAINER, "main", (u[0],)),
            alloc(INFER_A, "server", (f"{u[1]}::0",)),
            alloc(INFER_B, "server", (f"{u[1]}::1",)),
        ]
        self._devices = {
            f"{uuid}::{n}": SeenDevice(f"{uuid}::{n}", "Healthy") for uuid in u for n in range(2)
        }

    def allocations(self) -> list[Allocation]:
        return self._allocations

    def resources(self) -> list[str]:
        return [RESOURCE]

    def devices(self, resource: str) -> Mapping[str, SeenDevice]:
        return self._devices


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="kgx-", dir="/tmp") as d:
        yield Path(d)


@pytest.fixture
def exporter(node: Node, socket_dir: Path) -> Iterator[RunningExporter]:
    sock = socket_dir / "kubelet.sock"
    server = serve_pod_resources(KubeletAllocations(node), sock)  # type: ignore[arg-type]
    pod_resources = KubeletPodResources(sock, timeout_s=10)
    running = start_exporter(
        ExporterSettings(node_name="node-a", listen_port=0, interval_s=0.2, proc=node.proc),
        inventory=lambda: node.inventory,
        metrics=node.metrics,
        pod_resources=pod_resources,
        pod_directory=PodLogDirectory(node.pod_logs),
        shares=node.shares,
        health=node.health,
    )
    try:
        wait_for(lambda: running.refresher.latest() is not None)
        yield running
    finally:
        running.stop()
        pod_resources.close()
        server.stop(None)


def wait_for(condition: Callable[[], object], timeout_s: float = 20.0) -> None:
    # The refresher and health threads' state: looked at, as a scrape would.
    wait_until(condition, timeout_s=timeout_s, what="condition", poll_s=0.02)


def fetch(url: str, accept: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_over_http_carry_gpu_and_pod_values(node: Node, exporter: RunningExporter) -> None:
    status, content_type, body = fetch(exporter.url + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    values = samples(body)
    g1 = {"node": "node-a", "gpu": "1", "uuid": node.uuids[1], "model": "Tesla T4"}
    b = frozenset({**g1, "namespace": "web", "pod": "infer-b"}.items())
    a = frozenset({**g1, "namespace": "web", "pod": "infer-a"}.items())
    assert values[("kubegpu_pod_gpu_memory_used_bytes", b)] == 5 * GIB
    assert values[("kubegpu_pod_gpu_over_share", b)] == 1
    assert values[("kubegpu_pod_gpu_over_share", a)] == 0
    held = frozenset({**g1, "namespace": "web", "pod": "infer-a", "container": "server"}.items())
    assert values[("kubegpu_pod_gpu_allocated", held)] == 1  # one ID although two NUMA entries
    g0 = frozenset(
        {"node": "node-a", "gpu": "0", "uuid": node.uuids[0], "model": "Tesla T4"}.items()
    )
    assert values[("kubegpu_gpu_utilization_ratio", g0)] == 0.75


def test_openmetrics_is_served_when_asked_for(exporter: RunningExporter) -> None:
    status, content_type, body = fetch(
        exporter.url + "/metrics", accept="application/openmetrics-text; version=1.0.0"
    )
    assert status == 200
    assert content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")


def test_health_verdicts_fed_by_the_agent_show_up_on_the_next_scrape(
    node: Node, exporter: RunningExporter
) -> None:
    exporter.set_gpu_health(node.uuids[3], False)
    values = samples(fetch(exporter.url + "/metrics")[2])
    g3 = frozenset(
        {"node": "node-a", "gpu": "3", "uuid": node.uuids[3], "model": "Tesla T4"}.items()
    )
    assert values[("kubegpu_gpu_healthy", g3)] == 0


def test_healthz_is_ok_while_fresh_and_unknown_paths_are_404(exporter: RunningExporter) -> None:
    assert fetch(exporter.url + "/healthz")[0] == 200
    assert fetch(exporter.url + "/nope")[0] == 404


def test_healthz_turns_503_when_nvml_stays_stuck(node: Node, socket_dir: Path) -> None:
    clock = node.clock
    running = start_exporter(
        ExporterSettings(
            node_name="node-a",
            listen_port=0,
            interval_s=0.05,
            read_timeout_s=0.05,
            stale_after_s=60,
            proc=node.proc,
        ),
        inventory=lambda: node.inventory,
        metrics=node.metrics,
        clock=clock,
    )
    try:
        wait_for(lambda: running.refresher.latest() is not None)
        node.metrics.hang()
        # Once a read has timed out, every later read is stuck behind it: no snapshot can
        # land after the clock moves.
        wait_for(lambda: running.refresher.failures().get("nvml_timeout", 0) >= 1)
        clock.now += 61
        status, _, body = fetch(running.url + "/healthz")
        assert status == 503, body
        values = samples(fetch(running.url + "/metrics")[2])
        assert values[("kubegpu_exporter_snapshot_age_seconds", frozenset())] >= 61
    finally:
        node.metrics.release()
        running.stop()


def test_node_exporter_counts_xids_from_its_own_watchers_on_the_backend(node: Node) -> None:
    backend = FakeGpuBackend.from_spec("4xT4")
    running = start_node_exporter(
        backend,
        ExporterSettings(node_name="node-a", listen_port=0, interval_s=0.2, proc=node.proc),
        pod_resources_socket=None,
        pod_directory=PodLogDirectory(node.pod_logs),
    )
    try:
        wait_for(lambda: all(s["watchers"] >= 1 for s in backend.status()))
        gpu = backend.inject_xid(1, 48)
        g1 = {"node": "node-a", "gpu": "1", "uuid": gpu.uuid, "model": "Tesla T4"}
        xid = frozenset({**g1, "xid": "48"}.items())
        wait_for(
            lambda: (
                ("kubegpu_gpu_xid_errors_total", xid) in samples(fetch(running.url + "/metrics")[2])
            )
        )
        values = samples(fetch(running.url + "/metrics")[2])
        assert values[("kubegpu_gpu_xid_errors_total", xid)] == 1
        assert values[("kubegpu_gpu_healthy", frozenset(g1.items()))] == 0
    finally:
        running.stop()
        backend.close()
    assert all(s["watchers"] == 0 for s in backend.status())  # stop closed our watchers


def test_a_gpu_the_agents_rule_recovers_is_healthy_again_on_the_standalone_exporter(
    node: Node,
) -> None:
    # kubegpu exporter judges health with the agent's monitor and policy, so a GPU that
    # health.recoverAfterHealthyChecks brings back is healthy again here too.
    backend = FakeGpuBackend.from_spec("4xT4")
    policy = HealthCheckPolicy(recover_after_healthy_checks=3)
    feed = HealthFeed([gpu.uuid for gpu in backend.snapshot().gpus], policy=policy)
    uuid = backend.snapshot().gpus[2].uuid
    seen = [True]  # each change of GPU 2's health, as the exporter's feed tells it
    feed.add_listener(
        lambda: seen.append(not seen[-1]) if feed.tally().healthy(uuid) != seen[-1] else None
    )
    running = start_node_exporter(
        backend,
        ExporterSettings(node_name="node-a", listen_port=0, interval_s=0.2, proc=node.proc),
        pod_resources_socket=None,
        pod_directory=PodLogDirectory(node.pod_logs),
        health=feed,
    )
    g2 = frozenset({"node": "node-a", "gpu": "2", "uuid": uuid, "model": "Tesla T4"}.items())
    try:
        wait_for(lambda: ("kubegpu_gpu_healthy", g2) in samples(fetch(running.url + "/metrics")[2]))
        backend.inject_xid(2, 95)  # a GPU reset clears it (79 would wait for a node reboot)
        wait_for(lambda: seen == [True, False, True])
        values = samples(fetch(running.url + "/metrics")[2])
        assert values[("kubegpu_gpu_healthy", g2)] == 1
        assert values[("kubegpu_gpu_xid_errors_total", frozenset({*g2, ("xid", "95")}))] == 1
    finally:
        running.stop()
        backend.close()
