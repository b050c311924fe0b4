"""Whether the kube-scheduler that calls this extender fits the API server's version.

Kubernetes' version skew policy: kube-scheduler must not be newer than kube-apiserver, and may
be at most one minor version older. The second-scheduler overlay pins kube-scheduler's image,
and a cluster upgraded (or older) than that pin runs an unsupported pair that fails in ways far
from the cause (a scheduler asking for API fields the server does not serve). The overlay hands
the image's tag to the extender (``scheduler-version``), which compares it with ``/version`` at
start and refuses to serve an unsupported pair, naming both versions and the knob.
"""

from __future__ import annotations

import re
from typing import Any

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")
_MINOR = re.compile(r"^(\d+)")

# Where the overlay pins kube-scheduler's version (named in the refusal).
KNOB = "images: newTag of registry.k8s.io/kube-scheduler in deploy/overlays/second-scheduler"


def parse_version(text: str) -> tuple[int, int]:
    """``v1.31.4`` (an image tag or gitVersion, suffixes allowed) → ``(1, 31)``."""
    match = _VERSION.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes version such as v1.31.4")
    return int(match.group(1)), int(match.group(2))


def server_minor(version_doc: dict[str, Any]) -> tuple[int, int]:
    """The API server's (major, minor) from its ``/version`` answer (GKE writes ``"30+"``)."""
    try:
        major = _MINOR.match(str(version_doc["major"]))
        minor = _MINOR.match(str(version_doc["minor"]))
        if major and minor:
            return int(major.group(1)), int(minor.group(1))
    except KeyError:
        pass
    return parse_version(str(version_doc.get("gitVersion", "")))


def skew_problem(scheduler: tuple[int, int], server: tuple[int, int]) -> str | None:
    """Why this kube-scheduler and API server are not a supported pair (None: they are)."""
    scheduler_text = f"v{scheduler[0]}.{scheduler[1]}"
    server_text = f"v{server[0]}.{server[1]}"
    if scheduler > server:
        return (
            f"kube-scheduler {scheduler_text} is newer than the API server {server_text}; "
            f"kube-scheduler must not be newer: set {KNOB} to {server_text}.x"
        )
    if scheduler[0] != server[0] or server[1] - scheduler[1] > 1:
        return (
            f"kube-scheduler {scheduler_text} is more than one minor version older than the API "
            f"server {server_text}: set {KNOB} to {server_text}.x"
        )
    return None
