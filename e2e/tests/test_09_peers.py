"""Peer compat on the real API server, scheduler and kubelet: the Volcano GPU-share walk-through's
pods (seed 001) and Alibaba gpushare's sample run with their resources exactly as written (the
peer webhook, a real mutating admission webhook over HTTPS, gives them kubegpu's share slot and
scheduler), each container prints the peer's environment, `kubectl describe node` shows the
peer's capacity and allocated figures, and a mixed set of peer-style and kubegpu-style pods
fills the cards without over-committing one.

The session's node agent and extender run without compat modes; this module restarts them with
deploy/components/peer-compat's settings, serves the webhook and registers the component's
MutatingWebhookConfiguration (pointed at the webhook on loopback, caBundle the cluster's CA),
and puts everything back afterwards."""

from __future__ import annotations

import base64
import copy
import json
import re
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubegpu_e2e.cluster import NODE_NAME, Cluster, free_port, http_ok
from kubegpu_e2e.kubegpu import DEPLOY, KubegpuRoles, tool_path
from kubegpu_e2e.workloads import (
    CARD_MEMORY_MIB,
    SCHEDULER,
    SHARED,
    card_totals,
    container,
    container_env,
    create,
    pending_reason,
    phase,
    pod,
    share,
    wait_running,
)

pytestmark = pytest.mark.e2e

COMPONENT = DEPLOY / "components" / "peer-compat"
CARDS = 8
VOLCANO_MEMORY, VOLCANO_NUMBER = "volcano.sh/gpu-memory", "volcano.sh/gpu-number"
ALIYUN_MEMORY, ALIYUN_COUNT = "aliyun.com/gpu-mem", "aliyun.com/gpu-count"


def _component_docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((COMPONENT / name).read_text()) if d]


@pytest.fixture(scope="module")
def peers(cluster: Cluster, roles: KubegpuRoles) -> Iterator[KubegpuRoles]:
    # The node agent's extra right (nodes/status) exactly as the component grants it.
    cluster.kubectl("apply", "-f", str(COMPONENT / "node-agent-peer-rbac.yaml"))
    roles.stop_agent()
    roles.start_agent(config=COMPONENT / "node-agent-config.yaml")
    roles.wait_advertised()
    roles.stop_role("kubegpu-extender")
    roles.start_extender("--peer-compat=volcano,aliyun")

    # The webhook as the component's Deployment runs it, serving on loopback with a
    # certificate of the cluster's CA; the component's registration pointed at it.
    pair = cluster.ca.issue(
        "peer-webhook", common_name="kubegpu-peer-webhook", ips=("127.0.0.1",), server=True
    )
    port = free_port()
    (deployment,) = [d for d in _component_docs("webhook.yaml") if d["kind"] == "Deployment"]
    args = [
        a
        for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        if not a.startswith(("--port", "--tls-"))
    ]
    webhook = roles.start_role(
        "kubegpu-peer-webhook",
        [
            str(Path(sys.executable).with_name("kubegpu")),
            *args,
            "--host=127.0.0.1",
            f"--port={port}",
            f"--tls-cert-file={pair.cert}",
            f"--tls-key-file={pair.key}",
        ],
    )
    context = ssl.create_default_context(cafile=str(cluster.ca.cert))
    webhook.wait_until(
        lambda: http_ok(f"https://127.0.0.1:{port}/healthz", context), 60, "peer webhook /healthz"
    )
    (registration,) = [
        d for d in _component_docs("webhook.yaml") if d["kind"] == "MutatingWebhookConfiguration"
    ]
    registration = copy.deepcopy(registration)
    registration["webhooks"][0]["clientConfig"] = {
        "url": f"https://127.0.0.1:{port}/mutate",
        "caBundle": base64.b64encode(cluster.ca.cert.read_bytes()).decode(),
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(registration))
    cluster.wait_for(
        "the Node to show the peers' figures",
        lambda: (
            node_figures(cluster, "capacity").get(VOLCANO_MEMORY) == str(CARDS * CARD_MEMORY_MIB)
        ),
        timeout=60,
    )
    try:
        yield roles
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", "kubegpu-peer-compat")
        roles.stop_role("kubegpu-peer-webhook")
        roles.stop_role("kubegpu-extender")
        roles.start_extender()
        roles.stop_agent()
        roles.start_agent()
        roles.wait_advertised()


def node_figures(cluster: Cluster, part: str) -> dict[str, str]:
    status = cluster.get("node", NODE_NAME)["status"]
    keys = (VOLCANO_MEMORY, VOLCANO_NUMBER, ALIYUN_MEMORY, ALIYUN_COUNT)
    return {k: v for k, v in status.get(part, {}).items() if k in keys}


def described_allocated(cluster: Cluster, resource: str) -> tuple[str, str]:
    """(requests, limits) of ``resource`` under "Allocated resources" in kubectl describe node."""
    text = cluster.kubectl("describe", "node", NODE_NAME).stdout
    section = text.split("Allocated resources:", 1)[1]
    found = re.search(rf"^\s*{re.escape(resource)}\s+(\S+)\s+(?:\(\S+\)\s+)?(\S+)", section, re.M)
    assert found, section
    return found.group(1), found.group(2)


def walkthrough_pod(name: str, namespace: str, container_name: str) -> dict[str, Any]:
    """Seed 001's pod: `schedulerName: volcano` and `volcano.sh/gpu-memory: 1024` in the limits
    as written; only image and command are this cluster's (no registry is reachable)."""
    manifest = pod(name, namespace, [container(container_name, {VOLCANO_MEMORY: "1024"})])
    manifest["spec"]["schedulerName"] = "volcano"
    return manifest


def test_the_volcano_walkthrough_runs_unchanged(
    cluster: Cluster, peers: KubegpuRoles, namespace: str
) -> None:
    # What `kubectl edit node` shows in the walk-through: memory of every card. The card count
    # is 0: nothing hands cards out under it, so no pod asking for it can be placed.
    expected = {VOLCANO_MEMORY: str(CARDS * CARD_MEMORY_MIB), VOLCANO_NUMBER: "0"}
    for part in ("capacity", "allocatable"):
        figures = node_figures(cluster, part)
        assert {k: figures.get(k) for k in expected} == expected, (part, figures)
    before = int(described_allocated(cluster, VOLCANO_MEMORY)[0])

    create(
        cluster,
        walkthrough_pod("gpu-pod1", namespace, "cuda-container-1"),
        walkthrough_pod("gpu-pod2", namespace, "cuda-container-2"),
    )
    wait_running(cluster, namespace, "gpu-pod1", "gpu-pod2")
    for name, container_name in (
        ("gpu-pod1", "cuda-container-1"),
        ("gpu-pod2", "cuda-container-2"),
    ):
        obj = cluster.get("pod", "-n", namespace, name)
        assert obj["spec"]["schedulerName"] == SCHEDULER  # set by the webhook
        limits = obj["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {VOLCANO_MEMORY: "1024", SHARED: "1"}
        env = container_env(cluster, namespace, name, container_name)
        assert env["VOLCANO_GPU_ALLOCATED"] == "1024"
        assert env["VOLCANO_GPU_TOTAL"] == str(CARD_MEMORY_MIB)
        assert env["VOLCANO_GPU_MEMORY_TOTAL"] == str(CARD_MEMORY_MIB)
        assert env["NVIDIA_VISIBLE_DEVICES"] == env["KUBEGPU_GPU_UUID"]
        assert env["KUBEGPU_GPU_MEMORY_LIMIT_MIB"] == "1024"
    # The walk-through reads the allocated memory here: 2048 more than before, requests and
    # limits alike; the card count is never asked for.
    requests, limits = described_allocated(cluster, VOLCANO_MEMORY)
    assert (int(requests), int(limits)) == (before + 2048, before + 2048)
    assert described_allocated(cluster, VOLCANO_NUMBER)[0] == "0"


def aliyun_sample(namespace: str) -> dict[str, Any]:
    """gpushare's sample (binpack-1): a workload whose container asks `aliyun.com/gpu-mem: 2`
    (GiB) in its limits, nothing else about GPUs, and no scheduler name."""
    template = pod("binpack-1", namespace, [container("binpack-1", {ALIYUN_MEMORY: "2"})])
    template["spec"]["restartPolicy"] = "Always"
    template = {"metadata": {"labels": {"app": "binpack-1"}}, "spec": template["spec"]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "binpack-1", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "binpack-1"}},
            "template": template,
        },
    }


def test_the_aliyun_gpushare_sample_runs_unchanged(
    cluster: Cluster, peers: KubegpuRoles, namespace: str
) -> None:
    expected = {ALIYUN_MEMORY: str(CARDS * CARD_MEMORY_MIB // 1024), ALIYUN_COUNT: "0"}
    assert {k: node_figures(cluster, "allocatable").get(k) for k in expected} == expected
    before = int(described_allocated(cluster, ALIYUN_MEMORY)[0])
    create(cluster, aliyun_sample(namespace))
    name = cluster.wait_for(
        "the Deployment's pod",
        lambda: next(
            (p["metadata"]["name"] for p in cluster.get("pods", "-n", namespace)["items"]), None
        ),
        timeout=60,
    )
    wait_running(cluster, namespace, name)
    obj = cluster.get("pod", "-n", namespace, name)
    assert obj["spec"]["schedulerName"] == SCHEDULER
    env = container_env(cluster, namespace, name, "binpack-1")
    card_index = int(env["ALIYUN_COM_GPU_MEM_IDX"])
    assert 0 <= card_index < CARDS
    assert env["ALIYUN_COM_GPU_MEM_POD"] == "2"
    assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2"
    assert env["ALIYUN_COM_GPU_MEM_DEV"] == str(CARD_MEMORY_MIB // 1024)
    assert env["KUBEGPU_GPU_MEMORY_LIMIT_MIB"] == "2048"
    assert int(described_allocated(cluster, ALIYUN_MEMORY)[0]) == before + 2

    # `kubectl inspect gpushare -d` through the real kubectl's plugin lookup: the pod, with its
    # 2 GiB on the card its container was told.
    env = {**cluster.env, "PATH": tool_path(cluster), "KUBECONFIG": str(cluster.admin)}
    done = subprocess.run(
        [str(cluster.bin_dir / "kubectl"), "inspect", "gpushare", "-d"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    header = next(line.split() for line in done.stdout.splitlines() if line.startswith("NAME "))
    (row,) = [line.split() for line in done.stdout.splitlines() if line.startswith(name + " ")]
    column = header.index(f"GPU{card_index}(Allocated)")
    assert row[1] == namespace and row[column] == "2", done.stdout


# Two 40 GiB shares fill one 80 GiB card: 16 fill the 8 cards, the rest must wait.
MIXED = 19


def mixed_pod(i: int, namespace: str) -> dict[str, Any]:
    kind = ("volcano", "aliyun", "ours")[i % 3]
    name = f"{kind}-{i:02d}"
    if kind == "volcano":
        limits = {VOLCANO_MEMORY: str(40 * 1024)}
    elif kind == "aliyun":
        limits = {ALIYUN_MEMORY: "40"}
    else:
        limits = share(40 * 1024, 300)
    manifest = pod(name, namespace, [container("main", limits)], scheduler=SCHEDULER)
    return manifest


def test_peer_and_kubegpu_pods_fill_the_cards_without_overcommit(
    cluster: Cluster, peers: KubegpuRoles, namespace: str
) -> None:
    pods = [mixed_pod(i, namespace) for i in range(MIXED)]
    create(cluster, *pods)
    names = [p["metadata"]["name"] for p in pods]

    def settled() -> bool:
        phases = [phase(cluster, namespace, n) for n in names]
        running = phases.count("Running")
        waiting = [n for n, ph in zip(names, phases, strict=True) if ph == "Pending"]
        return running == 2 * CARDS and all(pending_reason(cluster, namespace, n) for n in waiting)

    cluster.wait_for("16 pods Running and the rest refused", settled, timeout=300)
    running = [n for n in names if phase(cluster, namespace, n) == "Running"]
    assert {n.split("-")[0] for n in running} == {"volcano", "aliyun", "ours"}
    wait_running(cluster, namespace, *running)
    totals = card_totals(cluster, [namespace])
    assert len(totals) == CARDS
    for card, (memory, _compute) in totals.items():
        assert memory == CARD_MEMORY_MIB, (card, memory)
    for name in names:
        if name not in running:
            assert phase(cluster, namespace, name) == "Pending"
            assert "MiB" in pending_reason(cluster, namespace, name)


# --------------------------------------------------------------------------- refused at creation
NOT_SERVED = "is not served by kubegpu; ask for nvidia.com/gpu for whole cards, or for"


def volcano_example(
    name: str, namespace: str, container_name: str, limits: dict[str, str]
) -> dict[str, Any]:
    """A pod of Volcano's user guides (gpu-number, vGPU): `schedulerName: volcano` and the
    resources in its limits as written; image and command are this cluster's."""
    manifest = pod(name, namespace, [container(container_name, limits)])
    manifest["spec"]["schedulerName"] = "volcano"
    return manifest


def refused(cluster: Cluster, manifest: dict[str, Any]) -> str:
    """What `kubectl apply` says when the API server refuses ``manifest``; fails if it was
    created."""
    done = cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
    assert done.returncode != 0, f"created: {done.stdout}"
    meta = manifest["metadata"]
    gone = cluster.kubectl("get", "pod", "-n", meta["namespace"], meta["name"], check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout
    return done.stderr


def test_pods_asking_for_what_kubegpu_does_not_serve_are_refused_at_apply_naming_the_fix(
    cluster: Cluster, peers: KubegpuRoles, namespace: str
) -> None:
    denied = 'admission webhook "peers.kubegpu.io" denied the request: kubegpu peer compat: '
    at = f"pod {namespace}/"
    # Volcano's gpu-number pod, alone, as its GPU-number guide writes it: it used to run with no
    # GPU at all while the Node showed one volcano.sh/gpu-number allocated.
    said = refused(
        cluster,
        volcano_example("gpu-pod1", namespace, "cuda-container", {VOLCANO_NUMBER: "1"}),
    )
    assert (
        f"{denied}{at}gpu-pod1 container cuda-container: {VOLCANO_NUMBER} (Volcano's whole-card "
        f"count) {NOT_SERVED} {VOLCANO_MEMORY} alone for a share of one card"
    ) in said, said
    # Volcano's vGPU pod, as its vGPU guide writes it: it used to wait Pending without a word.
    vgpu = {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": "3000"}
    said = refused(
        cluster,
        volcano_example(
            "gpu-pod12", namespace, "ubuntu-container", {**vgpu, "volcano.sh/vgpu-cores": "50"}
        ),
    )
    assert (
        f"{denied}{at}gpu-pod12 container ubuntu-container: volcano.sh/vgpu-number (Volcano "
        f"vGPU) {NOT_SERVED} {VOLCANO_MEMORY} alone for a share of one card"
    ) in said, said
    # gpushare's count asked for alone, by an init container: the same answer (the rule: served,
    # or refused at creation naming the resource and the alternative).
    count = pod("count", namespace, [container("main", {})])
    count["spec"]["initContainers"] = [container("warm", {ALIYUN_COUNT: "1"}, idle=False)]
    said = refused(cluster, count)
    assert (
        f"{denied}{at}count init container warm: {ALIYUN_COUNT} (gpushare's whole-card count) "
        f"{NOT_SERVED} {ALIYUN_MEMORY} alone for a share of one card"
    ) in said, said
    # The peer's memory in requests only reaches the webhook too (the API server's own check
    # would come after it, naming neither the resource nor the fix).
    requests_only = walkthrough_pod("requests-only", namespace, "main")
    resources = requests_only["spec"]["containers"][0]["resources"]
    resources["requests"] = resources.pop("limits")
    said = refused(cluster, requests_only)
    assert (
        f"{denied}{at}requests-only container main: {VOLCANO_MEMORY} is in requests but not in "
        "limits; set it in limits"
    ) in said, said


def test_a_gpu_number_pod_that_never_passed_the_webhook_waits_instead_of_running_without_a_card(
    cluster: Cluster, peers: KubegpuRoles, namespace: str
) -> None:
    # Past the webhook (its registration removed for the moment), the Node's count of 0 still
    # keeps the pod off the node: kube-scheduler says why. Counted as the cards, it ran.
    (registration,) = [
        r
        for r in cluster.get("mutatingwebhookconfigurations")["items"]
        if r["metadata"]["name"] == "kubegpu-peer-compat"
    ]
    cluster.kubectl("delete", "mutatingwebhookconfiguration", "kubegpu-peer-compat")
    try:
        create(cluster, pod("past-webhook", namespace, [container("main", {VOLCANO_NUMBER: "1"})]))
        reason = cluster.wait_for(
            "kube-scheduler's reason",
            lambda: pending_reason(cluster, namespace, "past-webhook"),
            timeout=60,
        )
        assert f"Insufficient {VOLCANO_NUMBER}" in reason, reason
        assert phase(cluster, namespace, "past-webhook") == "Pending"
        assert not cluster.get("pod", "-n", namespace, "past-webhook")["spec"].get("nodeName")
    finally:
        kept = {
            k: v
            for k, v in registration["metadata"].items()
            if k in ("name", "labels", "annotations")
        }
        registration["metadata"] = kept
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(registration))
