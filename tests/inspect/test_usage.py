"""Exporter usage: parsing real exposition text, and fetching from HTTP servers under a deadline."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.inspect.exporters import exporter_pod_ips, exporter_url, fetch_usage
from kubegpu.inspect.usage import UsageParseError, parse_exporter_metrics
from kubegpu.testing.apiserver import make_pod
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


def test_reads_escaped_labels_timestamps_and_skips_similar_names() -> None:
    page = "\n".join(
        [
            "# HELP kubegpu_gpu_memory_used_bytes memory in use",
            "# TYPE kubegpu_gpu_memory_used_bytes gauge",
            'kubegpu_gpu_memory_used_bytes{model="A \\"big\\" one\\\\",uuid="GPU-1"} 1.048576e+09',
            'kubegpu_gpu_memory_used_bytes_total{uuid="GPU-1"} 5',
            'kubegpu_pod_gpu_memory_used_bytes{namespace="ml",pod="p",uuid="GPU-1"} 2097152 17e11',
            'kubegpu_gpu_utilization_ratio{uuid="GPU-1"} NaN',
            "kubegpu_gpu_memory_used_bytes 7",
            "",
        ]
    )
    usage = parse_exporter_metrics(page)
    assert usage.gpu_memory_used_mib == {"GPU-1": 1000}
    assert usage.pod_memory_used_mib == {("ml", "p", "GPU-1"): 2}
    assert usage.gpu_utilization_ratio == {}


def test_a_page_that_is_not_prometheus_text_is_an_error() -> None:
    with pytest.raises(UsageParseError):
        parse_exporter_metrics('kubegpu_gpu_memory_used_bytes{uuid="x" 12\n')


@pytest.mark.parametrize(
    ("template", "pod_ip", "url"),
    [
        ("http://{address}:9400/metrics", "", "http://10.0.0.1:9400/metrics"),
        ("http://{node}.ex.svc:9400/metrics", "", "http://n1.ex.svc:9400/metrics"),
        ("http://{pod_ip}:9400/metrics", "10.244.3.7", "http://10.244.3.7:9400/metrics"),
        ("http://{pod_ip}:9400/metrics", "", "http://10.0.0.1:9400/metrics"),
    ],
)
def test_exporter_urls_fill_node_address_and_pod_ip(template: str, pod_ip: str, url: str) -> None:
    assert exporter_url(template, "n1", "10.0.0.1", pod_ip) == url


@pytest.mark.parametrize("template", ["http://{host}/metrics", "http://{0}/metrics", "http://{/"])
def test_a_bad_placeholder_is_refused(template: str) -> None:
    with pytest.raises(ValueError, match="bad placeholder"):
        exporter_url(template, "n1", "10.0.0.1")


def agent_pod(node: str, ip: str, phase: str = "Running", name: str = "agent") -> dict[str, Any]:
    pod = make_pod(f"{name}-{node}", "kube-system", node_name=node, labels={"app": name})
    pod["status"] = {"phase": phase, "podIP": ip}
    return pod


def test_exporter_pods_are_found_by_label_on_each_node() -> None:
    pods = [
        agent_pod("n1", "10.244.1.5"),
        agent_pod("n2", "10.244.2.5", phase="Pending"),
        agent_pod("n3", "10.244.3.5", name="other"),
        make_pod("no-ip", "kube-system", node_name="n4", labels={"app": "agent"}),
    ]
    assert exporter_pod_ips(pods, "app=agent") == {"n1": "10.244.1.5"}


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
