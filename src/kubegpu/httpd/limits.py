"""What one listener allows a client (:class:`HttpLimits`), how an answer or a refusal is
written, and JSON read within a depth limit: the values every other part of the foundation
uses."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

BODY_KEY = web.RequestKey("kubegpu_body", bytes)


@dataclass(frozen=True)
class HttpLimits:
    """What one listener allows a client (see the module for why each exists)."""

    # A scrape, probe or review sends its whole head at once; one that has not within this
    # long is broken or hostile.
    head_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    max_body_bytes: int = 64 * 1024
    max_inflight_body_bytes: int = 16 * 1024 * 1024
    max_connections: int = 64
    max_connections_per_client: int = 16
    # Kubernetes objects nest about 15 levels (an AdmissionReview 17); far more is an attack,
    # and code that walks the decoded value recursively must not meet Python's limit.
    max_json_depth: int = 64

    def __post_init__(self) -> None:
        for name in ("head_timeout_s", "body_timeout_s"):
            if not 0 < getattr(self, name) <= 3600:
                raise ValueError(f"{name} must be in (0, 3600] seconds, got {getattr(self, name)}")
        for name in (
            "max_body_bytes",
            "max_inflight_body_bytes",
            "max_connections",
            "max_connections_per_client",
            "max_json_depth",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


DEFAULT_LIMITS = HttpLimits()


class Refusals(Protocol):
    """Where a listener counts what it refused (a labelled prometheus Counter fits): reasons
    ``too-large`` (413), ``busy`` (503), ``timeout`` (408), ``bad-request`` (400) and
    ``connections`` (closed on arrival, over a connection cap)."""

    def labels(self, reason: str) -> Any: ...


class BodyBytes(Protocol):
    """A gauge of the body bytes held right now (a prometheus Gauge fits)."""

    def set(self, value: float) -> None: ...


class BadRequest(Exception):
    """The request cannot be answered as sent: a 400 whose body is the message. Raise it from a
    handler or a parser; the foundation renders it."""


ErrorBody = Callable[[int, str], web.Response]


def text_response(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    """A plain-text answer: ``text`` plus a newline."""
    return web.Response(status=status, text=f"{text}\n", headers=headers)


def text_error(status: int, message: str) -> web.Response:
    return text_response(status, message)


def json_error(status: int, message: str) -> web.Response:
    """An error as kube-scheduler's extender client reads one: ``{"Error": message}``."""
    return web.json_response({"Error": message}, status=status)


# --- JSON -----------------------------------------------------------------------------------

_DECODER = msgspec.json.Decoder()


def decode_json(raw: bytes, *, max_depth: int = HttpLimits.max_json_depth) -> Any:
    """``raw`` decoded, or :class:`BadRequest` naming why not (malformed, not UTF-8, deeper
    than ``max_depth``)."""
    try:
        value = _DECODER.decode(raw)
    except msgspec.DecodeError as exc:
        raise BadRequest(f"request body is not JSON: {exc}") from None
    except UnicodeDecodeError as exc:  # msgspec's word for bad UTF-8 inside a string
        raise BadRequest(f"request body is not JSON: not UTF-8 ({exc.reason})") from None
    except RecursionError:
        raise BadRequest(f"request body is JSON nested deeper than {max_depth} levels") from None
    check_depth(value, max_depth)
    return value


def check_depth(value: Any, max_depth: int) -> None:
    """Raise :class:`BadRequest` when ``value`` nests lists and objects deeper than
    ``max_depth``. Iterative: the point is not to meet the recursion limit."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > max_depth:
                    raise BadRequest(f"request body is JSON nested deeper than {max_depth} levels")
                stack.append((child, depth + 1))


LIMITS_KEY = web.AppKey("kubegpu_http_limits", HttpLimits)


async def json_body(request: web.Request) -> Any:
    """The request's body (read by the foundation, within its limits) decoded as JSON."""
    return decode_json(request[BODY_KEY], max_depth=request.app[LIMITS_KEY].max_json_depth)
