"""kubegpu's monitoring with the real Prometheus tools (Debian's prometheus package, from
e2e/install-deps): promtool accepts deploy/monitoring's rules and passes their tests (no
cluster needed), and a real Prometheus, run as a host process on a free loopback port, scrapes
the node agent's exporter and the extender beside the real cluster: every metric that
docs/metrics.md names is there with its documented labels (node, GPU, pod where it applies),
and the rules file loads with every rule healthy."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubegpu_e2e.cluster import NODE_NAME, Cluster
from kubegpu_e2e.kubegpu import DEPLOY, KubegpuRoles
from kubegpu_e2e.prometheus import Prometheus
from kubegpu_e2e.workloads import (
    CARD_MEMORY_MIB,
    SCHEDULER,
    container,
    create,
    pending_reason,
    pod,
    share,
    wait_running,
)

from kubegpu.config.extender import DEFAULT_MAX_BODY_BYTES
from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION

pytestmark = pytest.mark.e2e

MONITORING = DEPLOY / "monitoring"
RULES = MONITORING / "kubegpu-rules.yaml"
METRICS_DOC = DEPLOY.parent / "docs" / "metrics.md"
GPU_LABELS = {"node", "gpu", "uuid", "model"}
TARGET_LABELS = {"job", "instance"}  # what Prometheus adds to every scraped series
# Job names the rules' "up" alerts recognise (deploy/monitoring/kubegpu-rules.yaml).
AGENT_JOB = "kubegpu-node-agent"
EXTENDER_JOB = "kubegpu-extender-metrics"
# Counted only when a refresh fails, which nothing here provokes: absent by design.
ONLY_ON_FAILURE = {"kubegpu_exporter_refresh_failures_total"}
# Exported only by a node with cards in MIG mode, which the default cluster's fake node has
# none of: absent here by design (tests/exporter/test_mig_metrics.py scrapes them).
ONLY_WITH_MIG = {
    "kubegpu_mig_device_info",
    "kubegpu_mig_device_memory_total_bytes",
    "kubegpu_pod_mig_device_allocated",
}
_ROW = re.compile(r"^\| `(kubegpu_[a-z_]+)` \| (\w+) \| [^|]* \| ([^|]*) \|", re.M)


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool not found: run e2e/install-deps (Debian's prometheus package)"
    return found


def documented_metrics() -> dict[str, tuple[str, set[str]]]:
    """name -> (type, label names), from docs/metrics.md's tables."""
    rows = {}
    for name, kind, labels in _ROW.findall(METRICS_DOC.read_text(encoding="utf-8")):
        names: set[str] = set()
        for part in re.sub(r"\([^)]*\)", "", labels).split(","):
            part = part.strip()
            if part == "GPU labels":
                names |= GPU_LABELS
            elif part.startswith("`"):
                names.add(part.split("`")[1])
        rows[name] = (kind, names)
    assert len(rows) > 20, "docs/metrics.md's tables were not found"
    return rows


# ------------------------------------------------------------------ promtool (no cluster)


def test_promtool_accepts_the_rules_file() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_rule_tests_make_every_alert_fire_and_stay_quiet() -> None:
    tests = sorted((MONITORING / "tests").glob("*.test.yaml"))
    assert tests
    done = subprocess.run(
        [promtool(), "test", "rules", *map(str, tests)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(tests), done.stdout


@pytest.fixture
def prometheus(cluster: Cluster, roles: KubegpuRoles) -> Iterator[Prometheus]:
    server = Prometheus(
        cluster,
        RULES,
        {
            AGENT_JOB: f"127.0.0.1:{roles.exporter_port}",
            EXTENDER_JOB: f"127.0.0.1:{roles.extender_metrics_port}",
        },
    )
    try:
        yield server.start()
    finally:
        server.stop()
        # Nothing left behind: the process, its port and its storage are gone.
        assert not server.process.running
        assert not server.home.exists()
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", server.port)) != 0


def inject_xid(roles: KubegpuRoles, gpu: int, xid: int) -> None:
    with socket.socket(socket.AF_UNIX) as control:
        control.connect(str(roles.fake_control))
        control.sendall(json.dumps({"op": "xid", "gpu": gpu, "xid": xid}).encode() + b"\n")
        reply = json.loads(control.makefile().readline())
    assert reply["ok"], reply


def provoke_extender_refusals(roles: KubegpuRoles) -> None:
    """One malformed filter call (400: bad_requests) and one body over max-body-bytes (413:
    requests_refused), so that those counters have series to check."""
    connection = http.client.HTTPConnection("127.0.0.1", roles.extender_port, timeout=10)
    try:
        connection.request("POST", "/filter", body=b"not json", headers={"Content-Type": "x"})
        assert connection.getresponse().status == 400
    finally:
        connection.close()
    connection = http.client.HTTPConnection("127.0.0.1", roles.extender_port, timeout=10)
    try:
        connection.putrequest("POST", "/filter")
        connection.putheader("Content-Length", str(DEFAULT_MAX_BODY_BYTES + 1))
        connection.endheaders()
        assert connection.getresponse().status == 413
    finally:
        connection.close()


def test_prometheus_scrapes_every_documented_metric_with_its_labels_and_loads_the_rules(
    cluster: Cluster, roles: KubegpuRoles, namespace: str, prometheus: Prometheus
) -> None:
    # Per-pod series need a pod holding a share; a share no card holds stays pending (the
    # extender's rejections and the pending-pods gauge).
    create(
        cluster,
        pod("shared", namespace, [container("main", share(8192, 250))], scheduler=SCHEDULER),
        pod(
            "too-big",
            namespace,
            [container("main", share(CARD_MEMORY_MIB + 1024, 500))],
            scheduler=SCHEDULER,
        ),
    )
    wait_running(cluster, namespace, "shared")
    cluster.wait_for(
        "the extender's refusal of too-big",
        lambda: pending_reason(cluster, namespace, "too-big"),
        timeout=60,
    )
    inject_xid(roles, 7, 13)  # an application Xid: counted, the GPU stays healthy
    provoke_extender_refusals(roles)

    documented = documented_metrics()
    expected = {name for name in documented if name not in ONLY_ON_FAILURE | ONLY_WITH_MIG}

    def stored(name: str, kind: str) -> list[dict[str, str]]:
        return prometheus.series(f"{name}_bucket" if kind == "histogram" else name)

    def shared_pod_seen() -> bool:
        found = prometheus.series(f'kubegpu_pod_gpu_memory_share_bytes{{namespace="{namespace}"}}')
        return bool(found)

    cluster.wait_for(
        "Prometheus to have every documented metric and the shared pod's series",
        lambda: all(stored(name, documented[name][0]) for name in expected) and shared_pod_seen(),
        timeout=90,
    )

    gpus = {s["uuid"]: s for s in prometheus.series("kubegpu_gpu_info")}
    assert len(gpus) == 8, gpus
    for name in sorted(expected):
        kind, labels = documented[name]
        for series in stored(name, kind):
            got = (
                set(series)
                - {"__name__"}
                - TARGET_LABELS
                - ({"le"} if kind == "histogram" else set())
            )
            assert got == labels, (name, series)
            job = (
                AGENT_JOB
                if name.startswith(("kubegpu_gpu_", "kubegpu_pod_", "kubegpu_exporter_"))
                else EXTENDER_JOB
            )
            assert series["job"] == job, (name, series)
            if "node" in labels:
                assert series["node"] == NODE_NAME, (name, series)
            if "uuid" in labels:
                gpu = gpus[series["uuid"]]  # a GPU the node really has, with the same index
                assert (series["gpu"], series["model"]) == (gpu["gpu"], gpu["model"]), series

    # The shared pod's own series name it, on the card the extender decided.
    annotations = cluster.get("pod", "-n", namespace, "shared")["metadata"]["annotations"]
    decision = json.loads(annotations[ALLOCATION_ANNOTATION])
    card = decision["gpus"][0]["uuid"]
    mine = f'{{namespace="{namespace}", pod="shared"}}'
    assert prometheus.value(f"kubegpu_pod_gpu_memory_share_bytes{mine}") == [
        (
            {
                "__name__": "kubegpu_pod_gpu_memory_share_bytes",
                "job": AGENT_JOB,
                "instance": f"127.0.0.1:{roles.exporter_port}",
                "namespace": namespace,
                "pod": "shared",
                "node": NODE_NAME,
                "gpu": gpus[card]["gpu"],
                "uuid": card,
                "model": gpus[card]["model"],
            },
            8192 * 1024 * 1024,
        )
    ]
    assert [v for _, v in prometheus.value(f"kubegpu_pod_gpu_share_mismatch{mine}")] == [0]
    allocated = prometheus.value(f"kubegpu_pod_gpu_allocated{mine}")
    assert [(m["container"], m["uuid"]) for m, _ in allocated] == [("main", card)]
    xids = prometheus.value('kubegpu_gpu_xid_errors_total{gpu="7", xid="13"}')
    assert len(xids) == 1 and xids[0][1] >= 1, xids

    # The rules file loads: every group of it, every rule evaluated without error.
    groups = {g["name"]: g for g in yaml.safe_load(RULES.read_text())["groups"]}

    def loaded_rules() -> dict[str, Any]:
        return {g["name"]: g for g in prometheus.api("rules")["groups"]}

    def all_evaluated() -> bool:
        return all(r["health"] == "ok" for g in loaded_rules().values() for r in g["rules"])

    cluster.wait_for("every rule evaluated", all_evaluated, timeout=60)
    loaded = loaded_rules()
    assert set(loaded) == set(groups)
    for name, group in groups.items():
        assert [r["name"] for r in loaded[name]["rules"]] == [
            r.get("alert") or r["record"] for r in group["rules"]
        ]
        for rule in loaded[name]["rules"]:
            assert rule["health"] == "ok" and not rule.get("lastError"), rule

    # The recording rules compute from the real series. Waited for, not read once: one late
    # scrape marks the series stale, so a single evaluation can come out empty (a CI run did).
    def recorded(query: str) -> dict[str, float]:
        return {m.get("kind", ""): v for m, v in prometheus.value(query)}

    cluster.wait_for(
        "kubegpu:gpus:count to record the node's 8 GPUs",
        lambda: recorded("kubegpu:gpus:count") == {"": 8},
        timeout=30,
    )
    cluster.wait_for(
        "kubegpu:pending_gpu_pods:max to record too-big as a pending shared pod",
        lambda: recorded("kubegpu:pending_gpu_pods:max").get("shared", 0) >= 1,
        timeout=30,
    )

    # The chain works on real series: too-big waits while cards have room, so the
    # fragmentation alert is pending (it fires after 15 minutes).
    def active() -> dict[str, dict[str, str]]:
        return {a["labels"]["alertname"]: a["labels"] for a in prometheus.api("alerts")["alerts"]}

    cluster.wait_for(
        "KubegpuPodsPendingWhileGpusFree pending for the shared pod",
        lambda: active().get("KubegpuPodsPendingWhileGpusFree", {}).get("kind") == "shared",
        timeout=30,
    )
    # The scrape jobs are the ones the rules know (no "no node agent scraped" alert), both up,
    # and no GPU unhealthy: none of these is even pending. Waited for, not read once: a CI run
    # once read KubegpuNodeAgentDown pending from its absent(up) branch (no instance label)
    # with the agent's target scraped, and a rerun passed.
    up = {m["job"]: v for m, v in prometheus.value("up")}
    assert up == {AGENT_JOB: 1.0, EXTENDER_JOB: 1.0}, up
    quiet = {"KubegpuNodeAgentDown", "KubegpuExtenderDown", "KubegpuGpuUnhealthy"}
    try:
        cluster.wait_for("no quiet alert pending", lambda: not set(active()) & quiet, timeout=20)
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}; active: {active()}") from None
