"""What the API-server ports trade in, named without the client library.

The kube edge turns lightkube's objects and ``ApiError`` into these, so the edges that talk to
the API server through a port (kubelet, labels, extender) can use the answers and react to the
errors without importing lightkube or the kube edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class PodListing:
    """A node's pods and the resourceVersion the list was taken at (where a watch starts)."""

    pods: list[dict[str, Any]]
    resource_version: str


class ApiUnavailable(Exception):
    """The API server did not answer, or refused the call; ``str()`` says what it said."""


class ConflictError(Exception):
    """The object changed since it was read (HTTP 409): read it again and redo the decision."""


@dataclass(frozen=True)
class NodePod:
    """One pod on a node, as much of it as the exporter reads (names for its UID, and the
    annotations its share is read from)."""

    uid: str
    namespace: str
    name: str
    annotations: dict[str, str]


@dataclass(frozen=True)
class LeaseState:
    """What a coordination.k8s.io Lease says of its leader ("" and None where it says nothing)."""

    holder: str = ""
    renew_time: datetime | None = None
    duration_s: int | None = None
