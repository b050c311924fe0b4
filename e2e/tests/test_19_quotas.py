"""A GPU-memory budget for DRA claims, enforced on the real API server (docs/quotas.md, "GPU
memory of DRA claims"; docs/decisions/0011): ResourceQuota counts a claim's devices, never the
memory of a share, so kubegpu's claim-budget webhook does. It runs as
deploy/components/claim-budget's Deployment runs it (its args, its ServiceAccount's rights),
serving HTTPS on loopback with a certificate of the cluster's CA, and the component's
ValidatingWebhookConfiguration is registered pointed at it. On the DRA cluster (the `dra`
fixture: kubegpu's driver publishing 8 fake 80 GiB A100s) a namespace labelled with a budget
admits claims within it, and a pod using one runs; a claim that would pass it is refused with
the webhook's message naming the budget; a whole GPU is charged its card; a claim a pod's
template asks for past the budget leaves the pod Pending with the controller-manager's
FailedResourceClaimCreation event carrying the message; deleting a claim frees its memory."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import ssl
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubegpu_e2e.cluster import Cluster, free_port, http_ok, write_kubeconfig
from kubegpu_e2e.dra import DraDriver
from kubegpu_e2e.images import WORKLOAD_IMAGE
from kubegpu_e2e.kubegpu import DEPLOY
from kubegpu_e2e.processes import HostProcess
from kubegpu_e2e.workloads import ENV_END, wait_running

from kubegpu.sharing.claim_budget import BUDGET_LABEL

pytestmark = pytest.mark.e2e

Dra = tuple[Cluster, DraDriver]
COMPONENT = DEPLOY / "components" / "claim-budget"
ACCOUNT = "kubegpu-claim-budget"
SHARE_CLASS = "gpu-share.kubegpu.io"
WHOLE_CLASS = "gpu.kubegpu.io"
DENIED = 'admission webhook "claims.kubegpu.io" denied the request: '


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((COMPONENT / name).read_text()) if d]


@pytest.fixture(scope="module")
def budget_webhook(dra: Dra) -> Iterator[HostProcess]:
    cluster, _ = dra
    cluster.kubectl("apply", "--server-side", "-f", str(COMPONENT / "claim-budget-rbac.yaml"))
    token = cluster.kubectl(
        "create", "token", ACCOUNT, "-n", "kubegpu", "--duration=2h"
    ).stdout.strip()
    kubeconfig = write_kubeconfig(
        cluster.run_dir / f"{ACCOUNT}.kubeconfig",
        cluster.server,
        cluster.ca.cert,
        user=ACCOUNT,
        token=token,
    )
    pair = cluster.ca.issue(
        "claim-budget", common_name="kubegpu-claim-budget", ips=("127.0.0.1",), server=True
    )
    port = free_port()
    (deployment,) = [d for d in _docs("webhook.yaml") if d["kind"] == "Deployment"]
    args = [
        a
        for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        if not a.startswith(("--port", "--tls-", "--host"))
    ]
    env = dict(cluster.env)
    env.pop("KUBECONFIG", None)
    webhook = HostProcess(
        "kubegpu-claim-budget",
        [
            str(Path(sys.executable).with_name("kubegpu")),
            *args,
            "--host=127.0.0.1",
            f"--port={port}",
            f"--tls-cert-file={pair.cert}",
            f"--tls-key-file={pair.key}",
            f"--kubeconfig={kubeconfig}",
        ],
        cluster.logs / "kubegpu-claim-budget.log",
        env=env,
    ).start()
    context = ssl.create_default_context(cafile=str(cluster.ca.cert))
    webhook.wait_until(
        lambda: http_ok(f"https://127.0.0.1:{port}/healthz", context), 60, "/healthz"
    )
    (registration,) = [
        d for d in _docs("webhook.yaml") if d["kind"] == "ValidatingWebhookConfiguration"
    ]
    registration = copy.deepcopy(registration)
    registration["webhooks"][0]["clientConfig"] = {
        "url": f"https://127.0.0.1:{port}/validate",
        "caBundle": base64.b64encode(cluster.ca.cert.read_bytes()).decode(),
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(registration))
    try:
        yield webhook
    finally:
        cluster.kubectl(
            "delete", "validatingwebhookconfiguration", "kubegpu-claim-budget", check=False
        )
        webhook.stop()


def spec(device_class: str, memory: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory, "compute": "250"}}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def claim(name: str, namespace: str, device_class: str, memory: str | None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec(device_class, memory),
    }


def claim_pod(name: str, namespace: str, source: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": WORKLOAD_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": [
                        "/bin/sh",
                        "-c",
                        f'trap "exit 0" TERM; env | sort; echo {ENV_END}; '
                        "while :; do sleep 1; done",
                    ],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", **source}],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "dnsPolicy": "Default",
        },
    }


def create(cluster: Cluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("create", "-f", "-", input=json.dumps(obj))


def refused(cluster: Cluster, obj: dict[str, Any]) -> str:
    """The API server's answer to creating ``obj``, with kubectl's prefix; fails if created."""
    done = cluster.kubectl("create", "-f", "-", input=json.dumps(obj), check=False)
    assert done.returncode != 0, f"created: {done.stdout}"
    meta = obj["metadata"]
    gone = cluster.kubectl(
        "get", "resourceclaim", "-n", meta["namespace"], meta["name"], check=False
    )
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout
    return done.stderr.strip()


def budgeted(cluster: Cluster, namespace: str, budget: str) -> None:
    """Label the namespace, then wait until the API server sends its claims to the webhook
    (its namespaceSelector reads namespaces from an informer, a moment behind the label): a
    server-side dry run of a claim far past any budget is refused (a dry run is not charged)."""
    cluster.kubectl("label", "namespace", namespace, f"{BUDGET_LABEL}={budget}")
    probe = json.dumps(claim("probe", namespace, SHARE_CLASS, "1000Ti"))

    def judged() -> bool:
        done = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=probe, check=False)
        return done.returncode != 0 and DENIED in done.stderr

    cluster.wait_for(f"the webhook to judge namespace {namespace}'s claims", judged, 30)


def over_budget(namespace: str, budget: str, total: str, asked: str, held: str) -> str:
    return (
        f"namespace {namespace}: resource claims would hold {total} of GPU memory, over the "
        f"budget of {budget} (label {BUDGET_LABEL}): this claim asks for {asked} and the "
        f"namespace's claims hold {held}"
    )


def test_claims_past_the_namespaces_gpu_memory_budget_are_refused_naming_it(
    dra: Dra, budget_webhook: HostProcess, dra_namespace: str
) -> None:
    cluster, _ = dra
    ns = dra_namespace
    budgeted(cluster, ns, "64Gi")
    create(cluster, claim("big", ns, SHARE_CLASS, "40Gi"))
    create(cluster, claim("small", ns, SHARE_CLASS, "16Gi"))
    create(cluster, claim_pod("uses-big", ns, {"resourceClaimName": "big"}))
    wait_running(cluster, ns, "uses-big")

    # 40 + 16 held; 16 more would make 72Gi of a 64Gi budget.
    answer = refused(cluster, claim("third", ns, SHARE_CLASS, "16Gi"))
    assert answer == (
        'Error from server (Forbidden): error when creating "STDIN": '
        + DENIED
        + over_budget(ns, "64Gi", "72Gi", "16Gi", "56Gi")
    )
    # A whole GPU names no memory: it is charged the largest card the driver publishes.
    answer = refused(cluster, claim("whole", ns, WHOLE_CLASS, None))
    assert answer.endswith(DENIED + over_budget(ns, "64Gi", "136Gi", "80Gi", "56Gi")), answer

    # Deleting a claim frees its memory: the refused claim is admitted now.
    cluster.kubectl("delete", "resourceclaim", "-n", ns, "small", "--wait=true")
    create(cluster, claim("third", ns, SHARE_CLASS, "16Gi"))
    # ... and the namespace is full again.
    answer = refused(cluster, claim("fourth", ns, SHARE_CLASS, "16Gi"))
    assert answer.endswith(DENIED + over_budget(ns, "64Gi", "72Gi", "16Gi", "56Gi")), answer


def test_a_template_claim_past_the_budget_leaves_its_pod_pending_with_the_message(
    dra: Dra, budget_webhook: HostProcess, dra_namespace: str
) -> None:
    cluster, _ = dra
    ns = dra_namespace
    budgeted(cluster, ns, "32Gi")
    create(
        cluster,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "share-40", "namespace": ns},
            "spec": {"spec": spec(SHARE_CLASS, "40Gi")},
        },
    )
    create(cluster, claim_pod("templated", ns, {"resourceClaimTemplateName": "share-40"}))

    def refusal_event() -> str:
        events = cluster.get(
            "events",
            "-n",
            ns,
            "--field-selector=involvedObject.name=templated,reason=FailedResourceClaimCreation",
        )["items"]
        return str(events[0]["message"]) if events else ""

    message = cluster.wait_for("the FailedResourceClaimCreation event", refusal_event, 60)
    assert message.startswith("PodResourceClaim gpu: "), message
    assert message.endswith(DENIED + over_budget(ns, "32Gi", "40Gi", "40Gi", "0")), message
    pod = cluster.get("pod", "-n", ns, "templated")
    assert pod["status"].get("phase") == "Pending"
    assert not pod["status"].get("resourceClaimStatuses"), pod["status"]
    assert cluster.get("resourceclaims", "-n", ns)["items"] == []


def create_at_once(cluster: Cluster, objs: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """POST every claim to the API server at the same moment: one connection each, opened
    first, then all requests released together (kubectl processes, started one by one on
    this machine, arrive one after another). The API server's status and body for each."""
    context = ssl.create_default_context(cafile=str(cluster.ca.cert))
    context.load_cert_chain(str(cluster.admin_client.cert), str(cluster.admin_client.key))
    address = urllib.parse.urlsplit(cluster.server)
    start = threading.Barrier(len(objs))

    def post(obj: dict[str, Any]) -> tuple[int, str]:
        connection = http.client.HTTPSConnection(
            address.hostname or "127.0.0.1", address.port, context=context, timeout=60
        )
        try:
            connection.connect()
            start.wait(timeout=30)
            connection.request(
                "POST",
                f"/apis/resource.k8s.io/v1/namespaces/{obj['metadata']['namespace']}"
                "/resourceclaims",
                body=json.dumps(obj),
                headers={"Content-Type": "application/json"},
            )
            answer = connection.getresponse()
            return answer.status, answer.read().decode()
        finally:
            connection.close()

    with ThreadPoolExecutor(len(objs)) as pool:
        return list(pool.map(post, objs))


def test_concurrent_claims_never_take_the_namespace_past_its_budget(
    dra: Dra, budget_webhook: HostProcess, dra_namespace: str
) -> None:
    """Twelve 16Gi claims sent at the same moment under a 64Gi budget: the API server calls
    the webhook for them in parallel, and stores each admitted one only after the answer.
    Exactly four are stored; the others are refused with the budget's message."""
    cluster, _ = dra
    ns = dra_namespace
    budgeted(cluster, ns, "64Gi")
    claims = [claim(f"burst-{i}", ns, SHARE_CLASS, "16Gi") for i in range(12)]
    answers = create_at_once(cluster, claims)
    created = sorted(
        c["metadata"]["name"] for c, (code, _) in zip(claims, answers, strict=True) if code == 201
    )
    stored = sorted(o["metadata"]["name"] for o in cluster.get("resourceclaims", "-n", ns)["items"])
    assert len(created) == 4 and stored == created, (created, stored)
    for code, body in answers:
        if code != 201:
            status = json.loads(body)
            assert (code, status["reason"]) == (403, "Forbidden"), body
            assert status["message"].startswith(DENIED), body
            assert "over the budget of 64Gi" in status["message"], body
