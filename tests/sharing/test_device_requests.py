"""What a pod asks of devices outside the protocol (MIG devices), by kube-scheduler's arithmetic."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.sharing.claim import device_requests

THREE_G = "nvidia.com/mig-3g.40gb"
ONE_G = "nvidia.com/mig-1g.10gb"


def container(name: str, *, limits: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": limits or {}}, **extra}


def pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None) -> Any:
    return {"spec": {"containers": containers, "initContainers": init or []}}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (pod([container("a", limits={THREE_G: "1"})]), {THREE_G: 1}),
        (
            pod([container("a", limits={THREE_G: "1"}), container("b", limits={THREE_G: 2})]),
            {THREE_G: 3},
        ),
        # An init container runs alone: the larger of it and the app containers counts.
        (
            pod([container("a", limits={ONE_G: "1"})], [container("i", limits={ONE_G: "3"})]),
            {ONE_G: 3},
        ),
        # A sidecar keeps running beside the app containers and the later init containers.
        (
            pod(
                [container("a", limits={ONE_G: "1"})],
                [
                    container("side", limits={ONE_G: "1"}, restartPolicy="Always"),
                    container("i", limits={ONE_G: "2"}),
                ],
            ),
            {ONE_G: 3},
        ),
        # requests default to limits, and win when both are given (the API server makes
        # them equal for extended resources).
        (
            pod([{"name": "a", "resources": {"requests": {THREE_G: "2"}}}]),
            {THREE_G: 2},
        ),
        (pod([container("a", limits={"nvidia.com/gpu": "1"})]), {}),
        (pod([container("a", limits={THREE_G: "lots"})]), {}),
        ({"spec": "nonsense"}, {}),
        ({}, {}),
    ],
    ids=[
        "one",
        "containers-add-up",
        "init-alone",
        "sidecar-adds",
        "requests",
        "other-resource",
        "unparsable",
        "bad-spec",
        "no-spec",
    ],
)
def test_effective_requests_of_the_named_resources(raw: Any, expected: dict[str, int]) -> None:
    assert device_requests(raw, {THREE_G, ONE_G}) == expected


def test_no_resources_asks_nothing() -> None:
    assert device_requests(pod([container("a", limits={THREE_G: "1"})]), ()) == {}
