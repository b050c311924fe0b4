"""A review or pod of the wrong JSON type is a 400 (:class:`ReviewError`) or a denial, never an
exception: the HTTP layer turns any other exception into a 500 with a traceback (found: a pod
whose ``metadata`` is a string).

Generated, not listed: every value nested anywhere in valid AdmissionReviews for peer pods is
replaced in turn by a value of each JSON type, and :func:`review_response` must either answer
with a well-formed AdmissionReview or raise ReviewError."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from kubegpu.sharing.peers import peer_compat
from kubegpu.sharing.resources import ResourceNames
from kubegpu.webhook.review import ReviewError, review_response
from tests.json_mutants import JsonPath as Path
from tests.json_mutants import paths, replaced

NAMES = ResourceNames(peers=peer_compat(["volcano", "aliyun"]))

# One of each JSON type, empty and not.
REPLACEMENTS: tuple[Any, ...] = ("x", "", 7, 0, 2.5, -1, [], ["x"], {}, {"x": "y"}, None, True)


def review(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "5e0a",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team",
            "operation": "CREATE",
            "userInfo": {"username": "u", "groups": ["g"]},
            "object": pod,
        },
    }


def resources(amounts: dict[str, str]) -> dict[str, Any]:
    return {"limits": dict(amounts), "requests": dict(amounts)}


# Served, refused for an unserved resource, and refused by the claim reader: every branch of
# the webhook, with the fields it reads (names, annotations, sidecars, overhead) present.
SERVED = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "gpu-pod1",
        "namespace": "team",
        "labels": {"app": "a"},
        "annotations": {"kubegpu.io/gpu-models": "H100", "note": "n"},
    },
    "spec": {
        "schedulerName": "volcano",
        "overhead": {"cpu": "100m"},
        "initContainers": [
            {
                "name": "warm",
                "image": "cuda",
                "restartPolicy": "Always",
                "resources": resources({"aliyun.com/gpu-mem": "1"}),
            }
        ],
        "containers": [
            {
                "name": "main",
                "image": "cuda",
                "resources": resources({"volcano.sh/gpu-memory": "1024", "cpu": "1"}),
            },
            {"name": "plain", "image": "busybox", "resources": {}},
        ],
    },
}
UNSERVED = {
    "metadata": {"generateName": "gpu-", "namespace": "team"},
    "spec": {
        "containers": [
            {"name": "c", "resources": resources({"volcano.sh/gpu-number": "1", "cpu": "1"})}
        ]
    },
}
UNSERVABLE = {
    "metadata": {"name": "two", "namespace": "team", "annotations": {}},
    "spec": {
        "containers": [
            {"name": "a", "resources": resources({"volcano.sh/gpu-memory": "99999999"})},
            {"name": "b", "resources": resources({"nvidia.com/gpu": "1"})},
        ]
    },
}
BASES: dict[str, dict[str, Any]] = {
    "served": SERVED,
    "unserved": UNSERVED,
    "unservable": UNSERVABLE,
}


def check_answer(answer: Any) -> None:
    """``answer`` is an AdmissionReview v1 response the API server can read."""
    json.dumps(answer)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert isinstance(response["uid"], str)
    assert isinstance(response["allowed"], bool)
    if "patch" in response:
        assert response["allowed"] and response["patchType"] == "JSONPatch"
        ops = json.loads(base64.b64decode(response["patch"]))
        assert ops and all(op["op"] == "add" and op["path"].startswith("/") for op in ops)
    if not response["allowed"]:
        assert isinstance(response["status"]["message"], str)
        assert response["status"]["code"] == 422


def mutants(base: dict[str, Any]) -> Iterator[tuple[Path, Any, dict[str, Any]]]:
    doc = review(base)
    for path in paths(doc):
        for new in REPLACEMENTS:
            yield path, new, replaced(doc, path, new)


@pytest.mark.parametrize("base", sorted(BASES))
def test_the_valid_reviews_take_the_branch_they_are_meant_to(base: str) -> None:
    # Otherwise the mutants below would explore less than they claim to.
    response = review_response(review(BASES[base]), NAMES)["response"]
    assert ("patch" in response) == (base == "served")
    assert response["allowed"] == (base == "served")


@pytest.mark.parametrize("base", sorted(BASES))
def test_any_value_of_any_json_type_anywhere_gets_an_answer_or_a_review_error(base: str) -> None:
    checked = 0
    for path, new, doc in mutants(BASES[base]):
        try:
            answer = review_response(doc, NAMES, scheduler_name="kubegpu-scheduler")
        except ReviewError:
            continue
        except Exception as exc:  # the point: nothing else may escape
            pytest.fail(f"{'.'.join(map(str, path))} = {new!r}: {type(exc).__name__}: {exc}")
        check_answer(answer)
        checked += 1
    assert checked > 100  # most mutants are still reviews with an answer


@pytest.mark.parametrize(
    ("path", "new", "message"),
    [
        (("request", "object", "metadata"), "gpu-pod1", "request.object.metadata must be an obj"),
        (("request", "object", "spec", "containers"), {}, "spec.containers must be a list"),
        (("request", "object", "spec", "containers", 0, "resources"), [], "resources must be"),
        (("request", "object", "spec", "containers", 0, "resources", "limits"), "1", "limits"),
        (("request", "object", "spec", "initContainers", 0), "warm", "initContainers[0] must"),
        (("request", "object"), "pod", "request.object must be a Pod object"),
    ],
    ids=[
        "metadata-string",
        "containers-dict",
        "resources-list",
        "limits-string",
        "init-str",
        "obj",
    ],
)
def test_wrong_types_where_the_webhook_reads_are_review_errors_naming_the_field(
    path: Path, new: Any, message: str
) -> None:
    with pytest.raises(ReviewError, match=re.escape(message)):
        review_response(replaced(review(SERVED), path, new), NAMES)
