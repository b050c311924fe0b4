"""AdmissionReview v1 in, AdmissionReview v1 out: the webhook's pure core.

The rules are :func:`kubegpu.sharing.peers.admission_refusal` and
:func:`~kubegpu.sharing.peers.admission_patch`; this module only speaks the admission API's
shapes. A review it cannot read, or whose pod has a field of the wrong JSON type, is a
:class:`ReviewError` (400 at the edge); a pod asking for a peer resource kubegpu does not serve,
or whose peer request cannot be served, is denied with the reason, so ``kubectl apply`` says
what to change instead of the pod running without its card or waiting forever.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from kubegpu.sharing.claim import read_claim
from kubegpu.sharing.peers import admission_patch, admission_refusal
from kubegpu.sharing.resources import ResourceNames

API_VERSION = "admission.k8s.io/v1"


class ReviewError(ValueError):
    """The request is not an AdmissionReview v1 for a pod."""


def admission_request(review: object) -> Mapping[str, Any]:
    """The ``request`` of an AdmissionReview v1, checked for the members every answer needs;
    raises :class:`ReviewError` naming what is wrong."""
    if not isinstance(review, Mapping) or review.get("kind") != "AdmissionReview":
        raise ReviewError("expected an AdmissionReview object")
    if review.get("apiVersion") != API_VERSION:
        raise ReviewError(f"expected apiVersion {API_VERSION}, got {review.get('apiVersion')!r}")
    request = review.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise ReviewError("AdmissionReview.request.uid is missing")
    return request


def review_response(
    review: object,
    names: ResourceNames,
    *,
    scheduler_name: str = "",
) -> dict[str, Any]:
    """The AdmissionReview answering ``review``: allowed, with the JSON patch that adds the
    share slot (and scheduler) to a peer-style pod, or denied with the reason. Raises
    :class:`ReviewError`, and nothing else, for a review or pod of the wrong shape."""
    request = admission_request(review)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    kind = request.get("kind")
    is_pod = isinstance(kind, Mapping) and kind.get("kind") == "Pod" and not kind.get("group")
    if is_pod and request.get("operation", "CREATE") == "CREATE":
        pod = _pod_object(request)
        key = _pod_key(pod, request)
        problem = admission_refusal(pod, names.peers, whole_gpu=names.whole_gpu, key=key)
        ops: list[dict[str, Any]] = []
        if not problem:
            ops = admission_patch(pod, names.peers, names.share_slot, scheduler_name=scheduler_name)
            problem = _refusal(pod, ops, names) if ops else ""
        if problem:
            response["allowed"] = False
            response["status"] = {
                "code": 422,
                "reason": "Invalid",
                "message": f"kubegpu peer compat: {problem}",
            }
        elif ops:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def _pod_key(pod: Mapping[str, Any], request: Mapping[str, Any]) -> str:
    """The pod as messages name it. At creation a controller's pod has only its generateName,
    and its namespace may be only in the request."""
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace") or request.get("namespace")
    name = meta.get("name") or (f"{meta['generateName']}*" if meta.get("generateName") else "")
    return f"{namespace if isinstance(namespace, str) and namespace else 'default'}/{name or '?'}"


# What the webhook and the claim reader look at in a pod, and the JSON type each must have (an
# absent or null field is fine: the API server omits empty ones). A real API server only sends
# pods it has decoded, so a wrong type means the sender is not one: 400, never a traceback.
_OBJECT, _STRING, _LIST = (Mapping, "an object"), (str, "a string"), (list, "a list")
_Fields = tuple[tuple[str, tuple[type, str]], ...]
_POD_FIELDS: _Fields = (("metadata", _OBJECT), ("spec", _OBJECT))
_META_FIELDS: _Fields = (
    ("name", _STRING),
    ("generateName", _STRING),
    ("namespace", _STRING),
    ("annotations", _OBJECT),
)
_SPEC_FIELDS: _Fields = (
    ("containers", _LIST),
    ("initContainers", _LIST),
    ("overhead", _OBJECT),
    ("schedulerName", _STRING),
    ("nodeName", _STRING),
)
_CONTAINER_FIELDS: _Fields = (("name", _STRING), ("restartPolicy", _STRING), ("resources", _OBJECT))
_RESOURCES_FIELDS: _Fields = (("limits", _OBJECT), ("requests", _OBJECT))


def _check_fields(value: Mapping[str, Any], fields: _Fields, at: str) -> None:
    for field, (kind, called) in fields:
        item = value.get(field)
        if item is not None and not isinstance(item, kind):
            raise ReviewError(f"{at}.{field} must be {called}, got {type(item).__name__}")


def _pod_object(request: Mapping[str, Any]) -> Mapping[str, Any]:
    """The request's pod; raises :class:`ReviewError` unless it has a Pod's JSON types
    wherever the webhook reads it."""
    at = "request.object"
    pod = request.get("object")
    if not isinstance(pod, Mapping):
        raise ReviewError(f"{at} must be a Pod object, got {type(pod).__name__}")
    _check_fields(pod, _POD_FIELDS, at)
    _check_fields(pod.get("metadata") or {}, _META_FIELDS, f"{at}.metadata")
    spec = pod.get("spec") or {}
    _check_fields(spec, _SPEC_FIELDS, f"{at}.spec")
    for group in ("containers", "initContainers"):
        for index, container in enumerate(spec.get(group) or ()):
            where = f"{at}.spec.{group}[{index}]"
            if not isinstance(container, Mapping):
                raise ReviewError(f"{where} must be an object, got {type(container).__name__}")
            _check_fields(container, _CONTAINER_FIELDS, where)
            resources = container.get("resources") or {}
            _check_fields(resources, _RESOURCES_FIELDS, f"{where}.resources")
            for part in ("limits", "requests"):
                for resource, amount in (resources.get(part) or {}).items():
                    if isinstance(amount, bool) or not isinstance(amount, str | int | float):
                        raise ReviewError(
                            f"{where}.resources.{part}[{resource!r}] must be a quantity (a "
                            f"string or number), got {type(amount).__name__}"
                        )
    return pod


def _refusal(pod: Mapping[str, Any], ops: Sequence[Mapping[str, Any]], names: ResourceNames) -> str:
    """Why the patched pod could never be served, or ``""``."""
    return read_claim(apply_patch(pod, ops), names).refusal


def apply_patch(doc: Mapping[str, Any], ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``doc`` with the ``add`` operations of :func:`admission_patch` applied (the only
    operation it writes), as the API server will."""
    out: dict[str, Any] = json.loads(json.dumps(doc))
    for op in ops:
        if op.get("op") != "add":
            raise ValueError(f"unsupported JSON patch operation {op.get('op')!r}")
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in str(op["path"]).split("/")[1:]]
        target: Any = out
        for token in tokens[:-1]:
            target = target[int(token)] if isinstance(target, list) else target[token]
        target[tokens[-1]] = op["value"]
    return out
