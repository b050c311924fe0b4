"""The webhooks' HTTPS edge: the peer webhook's ``POST /mutate`` and the claim-budget webhook's
``POST /validate`` (AdmissionReview v1), each with ``GET /healthz``.

The API server calls it only for pods a ``matchConditions`` expression has found asking for a
peer resource (deploy/components/peer-compat), so every other pod is admitted without it and the
``failurePolicy: Fail`` it runs with can never block them. Served from a thread
(:class:`kubegpu.httpd.HttpThread`, under the limits every kubegpu listener has): the webhook
has no loop and answers in microseconds.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from kubegpu.httpd import (
    BadRequest,
    HttpLimits,
    HttpThread,
    hardened_app,
    json_body,
    text_response,
)
from kubegpu.sharing.resources import ResourceNames
from kubegpu.webhook.claim_ledger import ClaimLedger
from kubegpu.webhook.claim_review import claim_review_response
from kubegpu.webhook.review import ReviewError, review_response

log = logging.getLogger(__name__)

# A pod is at most ~1.5 MB in etcd; its AdmissionReview carries it once (no oldObject on
# CREATE). The API server opens several connections at once under a burst of pod creations, so
# its cap is generous; a client dribbling bodies is cut off by the body deadline.
WEBHOOK_LIMITS = HttpLimits(
    max_body_bytes=4 * 1024 * 1024,
    max_inflight_body_bytes=64 * 1024 * 1024,
    max_connections=256,
    max_connections_per_client=64,
)


def webhook_app(
    names: ResourceNames, *, scheduler_name: str = "", limits: HttpLimits = WEBHOOK_LIMITS
) -> web.Application:
    """The peer webhook: ``POST /mutate``."""

    async def mutate(review: object) -> dict[str, Any]:
        answer = review_response(review, names, scheduler_name=scheduler_name)
        assert isinstance(review, Mapping)  # review_response has checked its shape
        _log_decision(review, answer["response"])
        return answer

    return _review_app("/mutate", mutate, limits)


def _review_app(
    path: str,
    answer: Callable[[object], Awaitable[dict[str, Any]]],
    limits: HttpLimits,
    close: Callable[[], Awaitable[None]] | None = None,
) -> web.Application:
    """An admission webhook's app: ``POST path`` answers an AdmissionReview with ``answer``
    (its :class:`ReviewError` is a 400), ``GET /healthz``, 405 and 404 for anything else.
    ``close`` runs on the serving loop when the app stops."""

    async def review(request: web.Request) -> web.Response:
        body = await json_body(request)
        try:
            reply = await answer(body)
        except ReviewError as exc:
            raise BadRequest(f"bad AdmissionReview: {exc}") from None
        return web.Response(body=json.dumps(reply).encode(), content_type="application/json")

    async def healthz(request: web.Request) -> web.Response:
        return text_response(200, "ok")

    async def wrong_method(request: web.Request) -> web.Response:
        return text_response(405, f"POST an AdmissionReview to {path}")

    async def elsewhere(request: web.Request) -> web.Response:
        return text_response(404, f"no route {request.path}")

    app = hardened_app(limits)
    app.router.add_post(path, review)
    app.router.add_route("*", path, wrong_method)
    app.router.add_get("/healthz", healthz)
    app.router.add_route("*", "/{path:.*}", elsewhere)
    if close is not None:

        async def cleanup(app: web.Application) -> None:
            await close()

        app.on_cleanup.append(cleanup)
    return app


def _log_decision(review: Mapping[str, Any], response: Mapping[str, Any]) -> None:
    """One line for every pod the webhook changed or denied (the review has been validated)."""
    if "patch" not in response and response["allowed"]:
        return
    request = review["request"]
    pod = request.get("object")
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    log.info(
        "peer webhook: pod %s/%s %s",
        request.get("namespace") or meta.get("namespace") or "?",
        meta.get("name") or meta.get("generateName") or "?",
        "gets kubegpu's share slot"
        if response["allowed"]
        else f"denied: {response['status']['message']}",
    )


def serve_webhook(
    host: str,
    port: int,
    names: ResourceNames,
    context: ssl.SSLContext | None,
    *,
    scheduler_name: str = "",
    limits: HttpLimits = WEBHOOK_LIMITS,
) -> HttpThread:
    """The webhook on ``host:port`` (HTTPS with ``context``), started in a thread."""
    return HttpThread(
        host,
        port,
        webhook_app(names, scheduler_name=scheduler_name, limits=limits),
        name="peer-webhook",
        ssl_context=context,
    )


def claim_budget_app(
    ledger: ClaimLedger,
    *,
    close: Callable[[], Awaitable[None]] | None = None,
    limits: HttpLimits = WEBHOOK_LIMITS,
) -> web.Application:
    """The claim-budget webhook: ``POST /validate``. ``close`` runs on the serving loop when
    the app stops (the API client made there)."""

    async def validate(review: object) -> dict[str, Any]:
        return await claim_review_response(review, ledger)

    return _review_app("/validate", validate, limits, close)


def serve_claim_budget_webhook(
    host: str,
    port: int,
    ledger: ClaimLedger,
    context: ssl.SSLContext | None,
    *,
    close: Callable[[], Awaitable[None]] | None = None,
    limits: HttpLimits = WEBHOOK_LIMITS,
) -> HttpThread:
    """The claim-budget webhook on ``host:port`` (HTTPS with ``context``), in a thread."""
    return HttpThread(
        host,
        port,
        claim_budget_app(ledger, close=close, limits=limits),
        name="claim-budget-webhook",
        ssl_context=context,
    )
