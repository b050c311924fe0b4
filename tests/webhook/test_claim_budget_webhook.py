"""``kubegpu claim-budget-webhook`` as a process over real HTTPS on loopback, reading the
namespace, its ResourceClaims and the ResourceSlices from the fake API server: AdmissionReview v1
for a claim in, allowed or denied with the budget's message out."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.sharing.claim_budget import BUDGET_LABEL
from kubegpu.testing.apiserver import FakeApiServer
from kubegpu.testing.apiserver.objects import make_namespace
from kubegpu.testing.apiserver.server_thread import ServerThread
from tests.extender.test_security import pki  # noqa: F401  (the fixture)
from tests.webhook.serving import serving_webhook

NS = "team-a"


def claim(name: str, memory: str | None, cls: str = "gpu-share.kubegpu.io") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory, "compute": "250"}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def review(obj: dict[str, Any], operation: str = "CREATE", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "r-1",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "namespace": obj["metadata"]["namespace"],
            "name": obj["metadata"]["name"],
            "operation": operation,
            "object": obj,
            **extra,
        },
    }


def a100_slice() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu.kubegpu.io"},
        "spec": {
            "driver": "gpu.kubegpu.io",
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "capacity": {"memory": {"value": "80Gi"}}} for i in range(8)
            ],
        },
    }


@pytest.fixture
def cluster() -> Iterator[ServerThread]:
    with FakeApiServer().run_in_thread() as api:
        api.store.put("namespaces", make_namespace(NS, labels={BUDGET_LABEL: "100Gi"}))
        api.store.put("namespaces", make_namespace("free"))
        api.store.put("resourceslices", a100_slice())
        api.store.put("resourceclaims", claim("held", "40Gi"))
        yield api


@pytest.fixture
def webhook(
    cluster: ServerThread,
    pki: Path,  # noqa: F811
) -> Iterator[tuple[str, ssl.SSLContext]]:
    kubeconfig = cluster.write_kubeconfig(pki / "kubeconfig")
    with serving_webhook(
        "claim-budget-webhook", "/validate", pki, f"--kubeconfig={kubeconfig}"
    ) as served:
        yield served


def post(url: str, context: ssl.SSLContext, body: bytes) -> tuple[int, dict[str, Any] | str]:
    request = urllib.request.Request(
        f"{url}/validate", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_a_claim_within_the_budget_is_allowed_and_one_past_it_denied_with_the_figures(
    webhook: tuple[str, ssl.SSLContext], cluster: ServerThread
) -> None:
    url, context = webhook
    status, answer = post(url, context, json.dumps(review(claim("fits", "60Gi"))).encode())
    assert status == 200 and isinstance(answer, dict)
    assert answer == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "r-1", "allowed": True},
    }
    # "fits" is not stored yet (the API server stores it after every webhook answered): the
    # webhook still counts it, so 40 + 60 held and 8 more is past 100Gi.
    status, answer = post(url, context, json.dumps(review(claim("over", "8Gi"))).encode())
    assert status == 200 and isinstance(answer, dict)
    assert answer["response"] == {
        "uid": "r-1",
        "allowed": False,
        "status": {
            "code": 403,
            "reason": "Forbidden",
            "message": (
                "namespace team-a: resource claims would hold 108Gi of GPU memory, over the "
                f"budget of 100Gi (label {BUDGET_LABEL}): this claim asks for 8Gi and the "
                "namespace's claims hold 100Gi"
            ),
        },
    }


def test_a_whole_gpu_is_charged_the_published_card_and_a_free_namespace_is_not_budgeted(
    webhook: tuple[str, ssl.SSLContext],
) -> None:
    url, context = webhook
    whole = claim("whole", None, cls="gpu.kubegpu.io")
    status, answer = post(url, context, json.dumps(review(whole)).encode())
    assert status == 200 and isinstance(answer, dict)
    assert "would hold 120Gi" in answer["response"]["status"]["message"]
    whole["metadata"]["namespace"] = "free"
    status, answer = post(url, context, json.dumps(review(whole)).encode())
    assert status == 200 and isinstance(answer, dict) and answer["response"]["allowed"] is True


def test_a_malformed_budget_label_is_refused_naming_it(
    webhook: tuple[str, ssl.SSLContext], cluster: ServerThread
) -> None:
    url, context = webhook
    cluster.store.put("namespaces", make_namespace("typo", labels={BUDGET_LABEL: "80GB"}))
    typo = claim("a", "1Gi")
    typo["metadata"]["namespace"] = "typo"
    status, answer = post(url, context, json.dumps(review(typo)).encode())
    assert status == 200 and isinstance(answer, dict) and answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"].startswith(
        f"kubegpu claim budget: namespace typo: label {BUDGET_LABEL}='80GB' is not a quantity"
    )


def test_updates_and_other_resources_are_allowed_and_bad_reviews_are_400(
    webhook: tuple[str, ssl.SSLContext],
) -> None:
    url, context = webhook
    big = claim("big", "500Gi")
    status, answer = post(url, context, json.dumps(review(big, "UPDATE")).encode())
    assert status == 200 and isinstance(answer, dict) and answer["response"]["allowed"] is True
    status, answer = post(url, context, json.dumps(review(big, dryRun=True)).encode())
    assert status == 200 and isinstance(answer, dict) and answer["response"]["allowed"] is False
    status, text = post(url, context, b'{"kind": "Pod"}')
    assert (status, text) == (400, "bad AdmissionReview: expected an AdmissionReview object\n")
    broken = review(big)
    broken["request"]["object"] = ["not", "a", "claim"]
    status, text = post(url, context, json.dumps(broken).encode())
    assert status == 400 and "request.object must be a ResourceClaim, got list" in str(text)
