"""Exporter usage: parsing real exposition text, and fetching from HTTP servers under a deadline."""

from __future__ import annotations

import pytest

from kubegpu.inspect.exporters import exporter_url, fetch_usage
from kubegpu.inspect.usage import UsageParseError, parse_exporter_metrics
from tests.inspect.metrics_server import NodePage, serve_metrics

MIB = 2**20


def page_a() -> NodePage:
    return NodePage(
        "a",
        gpu_used_bytes={(0, "GPU-a-0"): 3000 * MIB, (1, "GPU-a-1"): 0.0},
        gpu_util={(0, "GPU-a-0"): 0.75},
        pod_used_bytes={("ml", "p1", 0, "GPU-a-0"): 2500 * MIB},
        pod_over={("ml", "p1", 0, "GPU-a-0"): 1.0, ("ml", "p2", 0, "GPU-a-0"): 0.0},
    )


def test_parses_card_and_pod_series_by_uuid() -> None:
    usage = parse_exporter_metrics(page_a().render().decode())
    assert usage.gpu_memory_used_mib == {"GPU-a-0": 3000, "GPU-a-1": 0}
    assert usage.gpu_utilization_ratio == {"GPU-a-0": 0.75}
    assert usage.pod_memory_used_mib == {("ml", "p1", "GPU-a-0"): 2500}
    assert usage.pod_over_share == {
        ("ml", "p1", "GPU-a-0"): True,
        ("ml", "p2", "GPU-a-0"): False,
    }


def test_a_page_that_is_not_prometheus_text_is_an_error() -> None:
    with pytest.raises(UsageParseError):
        parse_exporter_metrics('kubegpu_gpu_memory_used_bytes{uuid="x" 12\n')


@pytest.mark.parametrize(
    ("template", "url"),
    [
        ("http://{address}:9400/metrics", "http://10.0.0.1:9400/metrics"),
        ("http://{node}.exporters.svc:9400/metrics", "http://n1.exporters.svc:9400/metrics"),
    ],
)
def test_exporter_urls_fill_node_and_address(template: str, url: str) -> None:
    assert exporter_url(template, "n1", "10.0.0.1") == url


def test_an_unknown_placeholder_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown placeholder"):
        exporter_url("http://{host}/metrics", "n1", "10.0.0.1")


async def test_fetches_every_node_and_reports_failures_per_node() -> None:
    with serve_metrics({"a": page_a(), "slow": page_a()}, delays_s={"slow": 30}) as server:
        urls = {
            "a": f"{server.url}/a/metrics",
            "missing": f"{server.url}/missing/metrics",
            "slow": f"{server.url}/slow/metrics",
            "closed": "http://127.0.0.1:9/metrics",
        }
        results = await fetch_usage(urls, timeout_s=0.5)
    assert results["a"].usage is not None
    assert results["a"].usage.gpu_memory_used_mib["GPU-a-0"] == 3000
    assert results["missing"].usage is None and results["missing"].error == "HTTP 404"
    assert results["slow"].usage is None and results["slow"].error
    assert results["closed"].usage is None and results["closed"].error
    assert {r.node for r in results.values()} == set(urls)
