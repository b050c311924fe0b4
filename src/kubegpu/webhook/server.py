"""The peer webhook's HTTPS edge: ``POST /mutate`` (AdmissionReview v1) and ``GET /healthz``.

The API server calls it only for pods a ``matchConditions`` expression has found asking for a
peer resource (deploy/components/peer-compat), so every other pod is admitted without it and the
``failurePolicy: Fail`` it runs with can never block them. Served from a thread
(:class:`kubegpu.httpd.HttpThread`): the webhook has no loop and answers in microseconds.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Iterable
from typing import Any

from kubegpu.httpd import HttpThread, StartResponse, WsgiApp, text_reply
from kubegpu.sharing.resources import ResourceNames
from kubegpu.webhook.review import ReviewError, review_response

log = logging.getLogger(__name__)

# A pod is at most ~1.5 MB in etcd; its AdmissionReview carries it once (no oldObject on CREATE).
MAX_BODY_BYTES = 4 * 1024 * 1024


def webhook_app(names: ResourceNames, *, scheduler_name: str = "") -> WsgiApp:
    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method, path = environ.get("REQUEST_METHOD"), environ.get("PATH_INFO")
        if path == "/healthz" and method == "GET":
            return text_reply(start_response, 200, "ok")
        if path != "/mutate":
            return text_reply(start_response, 404, f"no route {path}")
        if method != "POST":
            return text_reply(start_response, 405, "POST an AdmissionReview to /mutate")
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return text_reply(start_response, 400, "bad Content-Length")
        if length > MAX_BODY_BYTES:
            return text_reply(start_response, 413, f"body over {MAX_BODY_BYTES} bytes")
        body = environ["wsgi.input"].read(length)
        try:
            answer = review_response(json.loads(body), names, scheduler_name=scheduler_name)
        except (ValueError, ReviewError) as exc:
            log.warning("peer webhook: bad AdmissionReview: %s", exc)
            return text_reply(start_response, 400, str(exc))
        response = answer["response"]
        if "patch" in response or not response["allowed"]:
            request = json.loads(body)["request"]
            meta = (request.get("object") or {}).get("metadata") or {}
            log.info(
                "peer webhook: pod %s/%s %s",
                request.get("namespace") or meta.get("namespace") or "?",
                meta.get("name") or meta.get("generateName") or "?",
                "gets kubegpu's share slot"
                if response["allowed"]
                else f"denied: {response['status']['message']}",
            )
        data = json.dumps(answer).encode()
        start_response(
            "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        )
        return [data]

    return app


def serve_webhook(
    host: str,
    port: int,
    names: ResourceNames,
    context: ssl.SSLContext | None,
    *,
    scheduler_name: str = "",
) -> HttpThread:
    """The webhook on ``host:port`` (HTTPS with ``context``), started in a thread."""
    return HttpThread(
        host,
        port,
        webhook_app(names, scheduler_name=scheduler_name),
        name="peer-webhook",
        ssl_context=context,
    )
