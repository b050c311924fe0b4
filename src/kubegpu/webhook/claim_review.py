"""AdmissionReview v1 for ResourceClaims in, the budget's verdict out (the claim-budget
webhook; the decision is :class:`~kubegpu.webhook.claim_ledger.ClaimLedger`'s).

Only a CREATE of a ``resource.k8s.io`` ``resourceclaims`` object is judged: a claim's spec is
immutable, so an UPDATE cannot change what it holds, and anything else the API server might send
is allowed. A review that is not one is a :class:`~kubegpu.webhook.review.ReviewError` (400).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubegpu.webhook.claim_ledger import ClaimLedger
from kubegpu.webhook.review import API_VERSION, ReviewError, admission_request

CLAIM_GROUP = "resource.k8s.io"


def _is_claim_create(request: Mapping[str, Any]) -> bool:
    resource = request.get("resource")
    return (
        isinstance(resource, Mapping)
        and resource.get("group") == CLAIM_GROUP
        and resource.get("resource") == "resourceclaims"
        and not request.get("subResource")
        and request.get("operation") == "CREATE"
    )


def _claim_object(request: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """The claim and its namespace (the request's, which the API server always sets for a
    namespaced object; the object's own may be empty at creation)."""
    claim = request.get("object")
    if not isinstance(claim, Mapping):
        raise ReviewError(f"request.object must be a ResourceClaim, got {type(claim).__name__}")
    meta = claim.get("metadata")
    if meta is not None and not isinstance(meta, Mapping):
        raise ReviewError("request.object.metadata must be an object")
    namespace = request.get("namespace") or (meta or {}).get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise ReviewError("request.namespace is missing")
    spec = claim.get("spec")
    if spec is not None and not isinstance(spec, Mapping):
        raise ReviewError("request.object.spec must be an object")
    return namespace, claim


async def claim_review_response(review: object, ledger: ClaimLedger) -> dict[str, Any]:
    """The AdmissionReview answering ``review``: allowed, or denied (403, as the API server's
    own quota refusal) with the budget's message. Raises :class:`ReviewError` for a review of
    the wrong shape."""
    request = admission_request(review)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    if _is_claim_create(request):
        namespace, claim = _claim_object(request)
        verdict = await ledger.admit(namespace, claim, dry_run=request.get("dryRun") is True)
        if not verdict.allowed:
            response["allowed"] = False
            response["status"] = {
                "code": 403,
                "reason": "Forbidden",
                "message": verdict.refusal,
            }
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
