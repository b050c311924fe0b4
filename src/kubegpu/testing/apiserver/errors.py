"""Kubernetes API errors as the real server reports them: a ``Status`` body and an HTTP code.

Handlers raise :class:`StatusError`; the HTTP layer turns it into the JSON ``Status`` that
client libraries (lightkube's ``ApiError``) decode. Messages copy the real server's wording so
that code which logs or matches them behaves the same against a real cluster.
"""

from __future__ import annotations

from typing import Any

# reason -> HTTP code, as in k8s.io/apimachinery/pkg/apis/meta/v1 StatusReason.
CODES: dict[str, int] = {
    "BadRequest": 400,
    "Unauthorized": 401,
    "Forbidden": 403,
    "NotFound": 404,
    "MethodNotAllowed": 405,
    "NotAcceptable": 406,
    "AlreadyExists": 409,
    "Conflict": 409,
    "Gone": 410,
    "Expired": 410,
    "RequestEntityTooLarge": 413,
    "UnsupportedMediaType": 415,
    "Invalid": 422,
    "TooManyRequests": 429,
    "InternalError": 500,
    "ServiceUnavailable": 503,
    "Timeout": 504,
}


class StatusError(Exception):
    """A failed API call, carrying everything needed to render a ``v1.Status``."""

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        code: int | None = None,
        resource: str | None = None,
        name: str | None = None,
        group: str = "",
        causes: list[dict[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.code = code if code is not None else CODES.get(reason, 500)
        self.resource = resource
        self.name = name
        self.group = group
        self.causes = causes

    def to_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        details: dict[str, Any] = {}
        if self.name is not None:
            details["name"] = self.name
        if self.resource is not None:
            details["group"] = self.group
            details["kind"] = self.resource
        if self.causes:
            details["causes"] = self.causes
        if details:
            status["details"] = details
        return status


def not_found(resource: str, name: str, group: str = "") -> StatusError:
    return StatusError(
        "NotFound",
        f'{qualified(resource, group)} "{name}" not found',
        resource=resource,
        name=name,
        group=group,
    )


def already_exists(resource: str, name: str, group: str = "") -> StatusError:
    return StatusError(
        "AlreadyExists",
        f'{qualified(resource, group)} "{name}" already exists',
        resource=resource,
        name=name,
        group=group,
    )


def conflict(resource: str, name: str, detail: str, group: str = "") -> StatusError:
    return StatusError(
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": {detail}',
        resource=resource,
        name=name,
        group=group,
    )


STALE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def stale(resource: str, name: str, group: str = "") -> StatusError:
    return conflict(resource, name, STALE, group)


def invalid(kind: str, name: str, field: str, detail: str, group: str = "") -> StatusError:
    return StatusError(
        "Invalid",
        f'{kind} "{name}" is invalid: {field}: {detail}',
        resource=kind,
        name=name,
        group=group,
        causes=[{"reason": "FieldValueInvalid", "message": detail, "field": field}],
    )


def bad_request(message: str) -> StatusError:
    return StatusError("BadRequest", message)


def expired(message: str) -> StatusError:
    return StatusError("Expired", message)


def qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource
