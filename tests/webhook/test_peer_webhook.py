"""``kubegpu peer-webhook`` as a process over real HTTPS on loopback: AdmissionReview v1 in,
the JSON patch that makes a peer pod a kubegpu share out."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.extender.test_security import pki  # noqa: F401  (the fixture)
from tests.webhook.serving import serving_webhook

PEER_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "gpu-pod1", "namespace": "volcano-pod"},
    "spec": {
        "schedulerName": "volcano",
        "containers": [
            {
                "name": "cuda-container-1",
                "image": "nvidia/cuda:10.1-base-ubuntu18.04",
                "resources": {
                    "limits": {"volcano.sh/gpu-memory": "1024"},
                    "requests": {"volcano.sh/gpu-memory": "1024"},
                },
            }
        ],
    },
}


def review(pod: dict[str, Any], uid: str = "7f0c") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "object": pod,
        },
    }


@pytest.fixture
def webhook(pki: Path) -> Iterator[tuple[str, ssl.SSLContext]]:  # noqa: F811
    with serving_webhook(
        "peer-webhook",
        "/mutate",
        pki,
        "--peer-compat=volcano,aliyun",
        "--scheduler-name=kubegpu-scheduler",
    ) as served:
        yield served


def post(url: str, context: ssl.SSLContext, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"{url}/mutate", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_a_volcano_pod_gets_the_share_slot_and_the_scheduler(
    webhook: tuple[str, ssl.SSLContext],
) -> None:
    url, context = webhook
    status, body = post(url, context, json.dumps(review(PEER_POD)).encode())
    assert status == 200
    answer = json.loads(body)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    response = answer["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == (
        "7f0c",
        True,
        "JSONPatch",
    )
    resources = "/spec/containers/0/resources"
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": f"{resources}/limits/kubegpu.io~1gpu-shared", "value": "1"},
        {"op": "add", "path": f"{resources}/requests/kubegpu.io~1gpu-shared", "value": "1"},
        {"op": "add", "path": "/spec/schedulerName", "value": "kubegpu-scheduler"},
    ]


def test_other_pods_pass_untouched_and_unservable_peer_pods_are_denied_with_the_reason(
    webhook: tuple[str, ssl.SSLContext],
) -> None:
    url, context = webhook
    cpu_pod = json.loads(json.dumps(PEER_POD))
    cpu_pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    status, body = post(url, context, json.dumps(review(cpu_pod)).encode())
    assert status == 200
    assert json.loads(body)["response"] == {"uid": "7f0c", "allowed": True}

    # Volcano's gpu-number pod, alone as its examples write it: refused, not admitted untouched
    # (it ran with no card at all).
    bad = json.loads(json.dumps(PEER_POD))
    bad["spec"]["containers"][0]["resources"] = {
        "limits": {"volcano.sh/gpu-number": "1"},
        "requests": {"volcano.sh/gpu-number": "1"},
    }
    status, body = post(url, context, json.dumps(review(bad)).encode())
    response = json.loads(body)["response"]
    assert (status, response["allowed"], response["status"]["code"]) == (200, False, 422)
    assert response["status"]["message"] == (
        "kubegpu peer compat: pod volcano-pod/gpu-pod1 container cuda-container-1: "
        "volcano.sh/gpu-number (Volcano's whole-card count) is not served by kubegpu; ask for "
        "nvidia.com/gpu for whole cards, or for volcano.sh/gpu-memory alone for a share of one card"
    )


def test_garbage_and_failed_handshakes_do_not_stop_it(webhook: tuple[str, ssl.SSLContext]) -> None:
    url, context = webhook
    status, body = post(url, context, b"{not json")
    assert status == 400
    status, body = post(url, context, json.dumps({"kind": "Pod"}).encode())
    assert (status, b"AdmissionReview" in body) == (400, True)
    # A pod whose metadata is a string: 400 naming the field, not a 500 with a traceback (the
    # fixture checks the log for one).
    odd = review(PEER_POD)
    odd["request"]["object"] = {**PEER_POD, "metadata": "gpu-pod1"}
    status, body = post(url, context, json.dumps(odd).encode())
    assert (status, b"request.object.metadata must be an object" in body) == (400, True)
    # A client speaking plain HTTP to the TLS port gets nothing, and the next one is served.
    host, port = url.removeprefix("https://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as plain:
        plain.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        plain.recv(100)
    status, _ = post(url, context, json.dumps(review(PEER_POD)).encode())
    assert status == 200


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host=127.0.0.1"], "name at least one compat mode"),
        (["--peer-compat=hami"], "unknown peer compat mode 'hami'"),
        (["--peer-compat=volcano", "--host=0.0.0.0"], "over HTTPS only"),
        (["--peer-compat=volcano", "--tls-cert-file=a.crt"], "go together"),
    ],
)
def test_usage_errors_exit_2_naming_the_option(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kubegpu", "peer-webhook", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
