"""The kube-scheduler / API server version check (Kubernetes' version skew policy)."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.version_skew import parse_version, server_minor, skew_problem


@pytest.mark.parametrize(
    ("scheduler", "server", "problem"),
    [
        ("v1.31.4", "v1.31.0", None),
        ("v1.30.9", "v1.31.0", None),  # one minor older: allowed during upgrades
        ("v1.34.2", "v1.28.3", "is newer than the API server v1.28"),
        ("v1.32.0", "v1.31.0", "is newer than the API server v1.31"),
        ("v1.29.0", "v1.31.0", "more than one minor version older"),
        ("v2.0.0", "v1.31.0", "is newer"),
    ],
)
def test_skew_problem(scheduler: str, server: str, problem: str | None) -> None:
    found = skew_problem(parse_version(scheduler), parse_version(server))
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
        assert "images: newTag of registry.k8s.io/kube-scheduler" in found


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"major": "1", "minor": "31", "gitVersion": "v1.31.0"}, (1, 31)),
        ({"major": "1", "minor": "30+", "gitVersion": "v1.30.5-gke.1014001"}, (1, 30)),
        ({"gitVersion": "v1.29.2+k3s1"}, (1, 29)),
    ],
)
def test_server_minor_reads_what_api_servers_answer(
    doc: dict[str, Any], expected: tuple[int, int]
) -> None:
    assert server_minor(doc) == expected


@pytest.mark.parametrize("text", ["latest", "1", "v1.x", ""])
def test_a_version_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes version"):
        parse_version(text)
