"""A stand-in node exporter for inspect tests: real HTTP on 127.0.0.1, pages per node.

The pages are produced by prometheus_client's own exposition code with the exporter's metric
names and labels, so the parser reads what a real scrape returns.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

GPU_LABELS = ["node", "gpu", "uuid", "model"]
POD_LABELS = ["namespace", "pod", *GPU_LABELS]


@dataclass
class NodePage:
    node: str
    gpu_used_bytes: Mapping[tuple[int, str], float] = field(default_factory=dict)  # (idx, uuid)
    gpu_util: Mapping[tuple[int, str], float] = field(default_factory=dict)
    pod_used_bytes: Mapping[tuple[str, str, int, str], float] = field(default_factory=dict)
    pod_over: Mapping[tuple[str, str, int, str], float] = field(default_factory=dict)
    # (namespace, pod, container, index, uuid) -> device IDs (kubegpu_pod_gpu_allocated)
    pod_allocated: Mapping[tuple[str, str, str, int, str], float] = field(default_factory=dict)
    # (namespace, pod, container, index, uuid, mig_uuid, profile) -> 1
    # (kubegpu_pod_mig_device_allocated)
    mig_allocated: Mapping[tuple[str, str, str, int, str, str, str], float] = field(
        default_factory=dict
    )

    def render(self) -> bytes:
        page = self

        class _Collector(Collector):
            def collect(self) -> Iterator[GaugeMetricFamily]:
                used = GaugeMetricFamily("kubegpu_gpu_memory_used_bytes", "used", labels=GPU_LABELS)
                util = GaugeMetricFamily("kubegpu_gpu_utilization_ratio", "util", labels=GPU_LABELS)
                for (index, uuid), value in page.gpu_used_bytes.items():
                    used.add_metric([page.node, str(index), uuid, "m"], value)
                for (index, uuid), value in page.gpu_util.items():
                    util.add_metric([page.node, str(index), uuid, "m"], value)
                pod_used = GaugeMetricFamily(
                    "kubegpu_pod_gpu_memory_used_bytes", "pod used", labels=POD_LABELS
                )
                over = GaugeMetricFamily("kubegpu_pod_gpu_over_share", "over", labels=POD_LABELS)
                for (ns, pod, index, uuid), value in page.pod_used_bytes.items():
                    pod_used.add_metric([ns, pod, page.node, str(index), uuid, "m"], value)
                for (ns, pod, index, uuid), value in page.pod_over.items():
                    over.add_metric([ns, pod, page.node, str(index), uuid, "m"], value)
                allocated = GaugeMetricFamily(
                    "kubegpu_pod_gpu_allocated",
                    "device IDs",
                    labels=["namespace", "pod", "container", *GPU_LABELS],
                )
                for (ns, pod, container, index, uuid), value in page.pod_allocated.items():
                    allocated.add_metric(
                        [ns, pod, container, page.node, str(index), uuid, "m"], value
                    )
                mig = GaugeMetricFamily(
                    "kubegpu_pod_mig_device_allocated",
                    "MIG devices",
                    labels=["namespace", "pod", "container", *GPU_LABELS, "mig_uuid", "profile"],
                )
                for key, value in page.mig_allocated.items():
                    ns, pod, container, index, uuid, mig_uuid, profile = key
                    mig.add_metric(
                        [ns, pod, container, page.node, str(index), uuid, "m", mig_uuid, profile],
                        value,
                    )
                yield from (used, util, pod_used, over, allocated, mig)

        registry = CollectorRegistry()
        registry.register(_Collector())
        return generate_latest(registry)


@dataclass
class MetricsServer:
    url: str
    pages: dict[str, NodePage]
    delays_s: dict[str, float]
    requests: list[str]


@contextmanager
def serve_metrics(
    pages: Mapping[str, NodePage], delays_s: Mapping[str, float] | None = None
) -> Iterator[MetricsServer]:
    """Serve ``/<node>/metrics`` for each page; other nodes get 404; ``delays_s`` stalls a
    node's answer (to exercise the deadline)."""
    state = MetricsServer("", dict(pages), dict(delays_s or {}), [])
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.requests.append(self.path)
            node = self.path.strip("/").split("/")[0]
            page = state.pages.get(node)
            if page is None or not self.path.endswith("/metrics"):
                self.send_error(404)
                return
            stop.wait(state.delays_s.get(node, 0.0))
            body = page.render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            # The client may have given up (deadline); nothing to do then.
            with contextlib.suppress(OSError):
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
