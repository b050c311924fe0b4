"""How the fake API server encodes answers and decodes request parameters, like kube-apiserver.

The JSON response and watch-event encodings, body and query-parameter decoding, and the
``Status`` errors for paths, methods and bodies it refuses. Separate from the server so that
routing, the collection verbs and the request handler share one spelling of each.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from kubegpu.testing.apiserver.errors import StatusError, bad_request, not_found
from kubegpu.testing.apiserver.resources import ResourceType

JSON = "application/json"
# The values of the ``watch`` and ``allowWatchBookmarks`` query parameters that mean yes.
WATCH_TRUE = ("true", "1")


def json_response(body: Any, status: int = 200) -> web.Response:
    # Exactly "application/json", no charset: lightkube only turns an error response into
    # ApiError when the Content-Type header equals that string.
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        status=status,
        headers={"Content-Type": JSON},
    )


def watch_event_line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def decode_json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise bad_request(f"couldn't get version/kind; json parse error: {error}") from error


def int_param(query: dict[str, str], name: str) -> int | None:
    value = query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError as error:
        raise bad_request(f"{name}: Invalid value: {value!r}: must be an integer") from error


def object_not_found(rtype: ResourceType, name: str) -> StatusError:
    return not_found(rtype.plural, name, rtype.group)


def no_route() -> StatusError:
    return StatusError("NotFound", "the server could not find the requested resource")


def method_not_allowed() -> StatusError:
    return StatusError(
        "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def body_too_large(limit: int) -> StatusError:
    return StatusError(
        "RequestEntityTooLarge", f"the request body is larger than the limit of {limit} bytes"
    )
