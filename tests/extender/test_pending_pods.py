"""``kubegpu_extender_pending_gpu_pods``: which pods count as waiting for a GPU (a table), and
the count served on the extender's real /metrics from the pods its view watched."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubegpu.extender.pending import count_waiting, waiting_for
from kubegpu.sharing.resources import ResourceNames
from kubegpu.testing.apiserver import FakeApiServer, make_pod
from tests.extender.cluster import (
    COMPUTE,
    MEMORY,
    gpu_node,
    http_session,
    running_extender,
    shared_pod,
    whole_pod,
)

NAMES = ResourceNames()


def with_(pod: dict[str, Any], **changes: Any) -> dict[str, Any]:
    for path, value in changes.items():
        section, field = path.split("__")
        pod.setdefault(section, {})[field] = value
    return pod


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(shared_pod("s", 1024, 100), "shared", id="unbound-share"),
        pytest.param(whole_pod("w", 2), "whole", id="unbound-whole-gpus"),
        pytest.param(
            make_pod("m", limits={MEMORY: "1024"}), "shared", id="memory-only-share-counts"
        ),
        pytest.param(with_(shared_pod("b", 1024, 100), spec__nodeName="n1"), None, id="bound"),
        pytest.param(make_pod("cpu", requests={"cpu": "1"}), None, id="no-gpu-asked"),
        pytest.param(
            with_(whole_pod("d", 1), metadata__deletionTimestamp="2026-01-01T00:00:00Z"),
            None,
            id="being-deleted",
        ),
        pytest.param(with_(whole_pod("f", 1), status__phase="Failed"), None, id="finished"),
        pytest.param(
            make_pod("bad", limits={COMPUTE: "lots"}), None, id="unreadable-request-not-counted"
        ),
    ],
)
def test_which_pods_wait_for_a_gpu(pod: dict[str, Any], expected: str | None) -> None:
    assert waiting_for(pod, NAMES) == expected


def test_waiting_pods_are_counted_by_kind_with_zeros_kept() -> None:
    pods = [shared_pod("a", 1024, 100), shared_pod("b", 2048, 100), make_pod("c")]
    assert count_waiting(pods, NAMES) == {"whole": 0, "shared": 2}


async def test_the_extender_serves_the_pending_gpu_pods_it_watched() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a"))
        server.store.put("pods", shared_pod("waits-shared", 1024, 100))
        server.store.put("pods", whole_pod("waits-whole-1", 1))
        server.store.put("pods", whole_pod("waits-whole-2", 2))
        server.store.put("pods", with_(shared_pod("bound", 1024, 100), spec__nodeName="node-a"))
        server.store.put("pods", make_pod("plain", requests={"cpu": "1"}))
        async with (
            running_extender(server, metrics_host="127.0.0.1", metrics_port=0) as ext,
            http_session() as http,
            http.get(f"{ext.metrics_url}/metrics") as r,
        ):
            text = await r.text()
    samples = {
        s.labels["kind"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "kubegpu_extender_pending_gpu_pods"
    }
    assert samples == {"whole": 2.0, "shared": 1.0}
