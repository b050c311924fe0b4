"""The exporter inside the node agent: a real ``kubegpu device-plugin --exporter`` process
against the kubelet emulator (which also serves PodResources), scraped over HTTP.

Samples are read with prometheus_client's own parser, never by matching the text.
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubegpu.core.gpu import GpuUuid
from kubegpu.inventory.fake import send_fake_gpu_command
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.testing.kubelet import KubeletEmulator
from kubegpu.testing.waiting import wait_until
from tests.kubelet.conftest import RESOURCE, PluginProcess, short_tempdir

T4 = resolve_fake_spec("4xT4").inventory
UUIDS = [g.uuid for g in T4.gpus]
NODE = "test-node"  # PluginProcess passes --node-name test-node
SERVING = re.compile(r"exporter serving (http://\S+)/metrics")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(base: str) -> Samples:
    """Every sample of ``/metrics``: (sample name, labels) -> value."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` whose labels include ``labels`` (None when there is none)."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"{name} {labels}: {len(found)} samples"
    return found[0] if found else None


def scrape_until(
    base: str, predicate: Callable[[Samples], bool], timeout_s: float = 20.0
) -> Samples:
    """Scrape until ``predicate`` holds (the exporter refreshes in the background)."""
    last: list[Samples] = []

    def holds() -> Samples | None:
        last[:] = [scrape(base)]
        return last[0] if predicate(last[0]) else None

    return wait_until(holds, timeout_s=timeout_s, what=lambda: f"condition; last scrape: {last}")


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


EXPORTER_CONFIG = """\
version: v1
exporter:
  enabled: true
  listen: "{listen}"
  intervalS: {interval}
  podResourcesSocket: {pod_resources}
"""


@dataclass
class ExporterNode:
    root: Path
    kubelet: KubeletEmulator
    plugin: PluginProcess
    config: Path
    pod_resources: Path

    def write_config(self, listen: str, interval_s: float = 0.1) -> None:
        self.config.write_text(
            EXPORTER_CONFIG.format(
                listen=listen, interval=interval_s, pod_resources=self.pod_resources
            )
        )

    def url(self, after: int = 0, timeout_s: float = 20.0) -> str:
        """The address of the ``after``-th (0-based) exporter start, from the agent's log."""
        found = wait_until(
            lambda: (starts := SERVING.findall(self.plugin.log()))[after:] and starts,
            timeout_s=timeout_s,
            what=lambda: f"exporter start {after} logged:\n{self.plugin.log()}",
        )
        return str(found[after])


@pytest.fixture
def node() -> Iterator[ExporterNode]:
    root = short_tempdir()
    kubelet_dir = root / "dp"
    pod_resources = root / "pr.sock"
    kubelet = KubeletEmulator(kubelet_dir, pod_resources_socket=pod_resources, node_name=NODE)
    kubelet.start()
    config = root / "config.yaml"
    config.write_text(
        EXPORTER_CONFIG.format(listen="127.0.0.1:0", interval=0.1, pod_resources=pod_resources)
    )
    plugin = PluginProcess(kubelet_dir, preset="4xT4", config=config)
    try:
        kubelet.wait_for_registration(RESOURCE, timeout_s=30)
        kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 4, timeout_s=30)
        yield ExporterNode(root, kubelet, plugin, config, pod_resources)
    finally:
        plugin.stop()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def every_gpu(samples: Samples) -> bool:
    return all(value(samples, "kubegpu_gpu_memory_total_bytes", uuid=u) is not None for u in UUIDS)


def test_serves_gpu_metrics_from_the_agents_backend(node: ExporterNode) -> None:
    samples = scrape_until(node.url(), every_gpu)
    for gpu in T4.gpus:
        labels = {"node": NODE, "gpu": str(gpu.index), "uuid": gpu.uuid, "model": gpu.product_name}
        assert value(samples, "kubegpu_gpu_info", **labels) == 1.0
        assert (
            value(samples, "kubegpu_gpu_memory_total_bytes", **labels)
            == gpu.memory_total_mib * 1024 * 1024
        )
        # The fake backend's idle readings.
        assert value(samples, "kubegpu_gpu_memory_used_bytes", **labels) == 0.0
        assert value(samples, "kubegpu_gpu_temperature_celsius", **labels) == 35.0
        assert value(samples, "kubegpu_gpu_healthy", **labels) == 1.0
    assert value(samples, "kubegpu_gpu_xid_errors_total") is None


def test_the_agents_health_monitor_feeds_health_and_xid_counts(node: ExporterNode) -> None:
    base = node.url()
    scrape_until(base, every_gpu)
    seq = node.kubelet.update_count(RESOURCE)
    # An application Xid is counted but judged harmless; a critical one makes the GPU unhealthy.
    assert send_fake_gpu_command(node.plugin.control, "xid", gpu=1, xid=13)["ok"]
    assert send_fake_gpu_command(node.plugin.control, "xid", gpu=2, xid=79)["ok"]
    samples = scrape_until(
        base,
        lambda s: (
            value(s, "kubegpu_gpu_healthy", uuid=UUIDS[2]) == 0.0
            and value(s, "kubegpu_gpu_xid_errors_total", uuid=UUIDS[1], xid="13") is not None
        ),
    )
    assert value(samples, "kubegpu_gpu_xid_errors_total", uuid=UUIDS[2], xid="79") == 1.0
    assert value(samples, "kubegpu_gpu_xid_errors_total", uuid=UUIDS[1], xid="13") == 1.0
    assert value(samples, "kubegpu_gpu_healthy", uuid=UUIDS[1]) == 1.0
    assert value(samples, "kubegpu_gpu_healthy", uuid=UUIDS[0]) == 1.0
    # The same verdict the kubelet got on the ListAndWatch stream: one health source.
    update = node.kubelet.wait_for_devices(
        RESOURCE, lambda d: not d[UUIDS[2]].healthy, timeout_s=10, after_sequence=seq
    )
    assert update.devices[UUIDS[1]].healthy

    assert send_fake_gpu_command(node.plugin.control, "xid", gpu=2, xid=79)["ok"]
    samples = scrape_until(
        base, lambda s: value(s, "kubegpu_gpu_xid_errors_total", uuid=UUIDS[2], xid="79") == 2.0
    )
    assert value(samples, "kubegpu_gpu_healthy", uuid=UUIDS[2]) == 0.0


def test_each_class_of_nvidias_xid_catalog_on_the_stream_and_the_metrics(
    node: ExporterNode,
) -> None:
    """One Xid of each class (docs/xid-policy.md) on its own GPU: the kubelet's ListAndWatch
    stream and the exporter say the same, before and after the fake resets the GPUs."""
    base = node.url()
    scrape_until(base, every_gpu)
    control, kubelet = node.plugin.control, node.kubelet
    seq = kubelet.update_count(RESOURCE)
    # application only (94), no action (63), GPU reset (95), node reboot (79)
    for gpu, xid in ((0, 94), (1, 63), (2, 95), (3, 79)):
        assert send_fake_gpu_command(control, "xid", gpu=gpu, xid=xid)["ok"]
    update = kubelet.wait_for_devices(
        RESOURCE,
        lambda d: not d[UUIDS[2]].healthy and not d[UUIDS[3]].healthy,
        timeout_s=10,
        after_sequence=seq,
    )
    for index, xid in ((0, 94), (1, 63)):
        node.plugin.wait_for_log(f"GPU {index} ({UUIDS[index]}): ignoring Xid {xid} ")
    assert {u for u, d in update.devices.items() if not d.healthy} == set(UUIDS[2:])
    samples = scrape_until(
        base,
        lambda s: all(
            value(s, "kubegpu_gpu_xid_errors_total", uuid=UUIDS[i], xid=str(x)) == 1.0
            for i, x in ((0, 94), (1, 63), (2, 95), (3, 79))
        ),
    )
    # Every Xid counted; only the GPU-reset and node-reboot ones cost the GPU its verdict.
    assert [value(samples, "kubegpu_gpu_healthy", uuid=u) for u in UUIDS] == [1, 1, 0, 0]
    assert kubelet.devices(RESOURCE)[UUIDS[0]].healthy
    assert kubelet.devices(RESOURCE)[UUIDS[1]].healthy

    # The fake's restore: the GPUs were reset and answer again.
    for gpu in (2, 3):
        assert send_fake_gpu_command(control, "restore", gpu=gpu)["ok"]
    kubelet.wait_for_devices(RESOURCE, lambda d: d[UUIDS[2]].healthy, timeout_s=10)
    node.plugin.wait_for_log(f"GPU 3 ({UUIDS[3]}) answers again but stays unhealthy")
    assert not kubelet.devices(RESOURCE)[UUIDS[3]].healthy
    samples = scrape_until(base, lambda s: value(s, "kubegpu_gpu_healthy", uuid=UUIDS[2]) == 1)
    assert [value(samples, "kubegpu_gpu_healthy", uuid=u) for u in UUIDS] == [1, 1, 1, 0]
    assert kubelet.allocatable(RESOURCE) == 3


def test_per_pod_metrics_come_from_the_kubelets_pod_resources(node: ExporterNode) -> None:
    base = node.url()
    alloc = node.kubelet.allocate(
        RESOURCE, 1, pod_name="trainer", namespace="ml", container="main", pod_uid="uid-trainer"
    )
    (held,) = alloc.device_ids
    gpu = T4.by_uuid(GpuUuid(held))
    samples = scrape_until(
        base,
        lambda s: value(s, "kubegpu_pod_gpu_allocated", pod="trainer", uuid=held) is not None,
    )
    assert (
        value(
            samples,
            "kubegpu_pod_gpu_allocated",
            namespace="ml",
            pod="trainer",
            container="main",
            uuid=held,
            node=NODE,
        )
        == 1.0
    )
    assert (
        value(samples, "kubegpu_gpu_allocated_memory_bytes", uuid=held)
        == gpu.memory_total_mib * 1024 * 1024
    )
    others = [u for u in UUIDS if u != held]
    assert [value(samples, "kubegpu_gpu_allocated_memory_bytes", uuid=u) for u in others] == [
        0.0
    ] * len(others)
    node.kubelet.release("uid-trainer")
    scrape_until(
        base, lambda s: value(s, "kubegpu_pod_gpu_allocated", pod="trainer", uuid=held) is None
    )


def test_sigterm_stops_the_exporter_too_and_exits_zero(node: ExporterNode) -> None:
    base = node.url()
    scrape_until(base, every_gpu)
    node.plugin.send(signal.SIGTERM)
    assert node.plugin.proc.wait(20) == 0
    assert not answers(f"{base}/metrics")


def test_a_reload_moves_the_exporter_and_a_taken_port_turns_it_off_until_the_next(
    node: ExporterNode,
) -> None:
    first = node.url(0)
    scrape_until(first, every_gpu)
    assert send_fake_gpu_command(node.plugin.control, "xid", gpu=0, xid=79)["ok"]
    scrape_until(first, lambda s: value(s, "kubegpu_gpu_healthy", uuid=UUIDS[0]) == 0.0)

    node.write_config("127.0.0.1:0", interval_s=0.2)  # a new port: 0 picks a free one
    node.plugin.send(signal.SIGHUP)
    second = node.url(1)
    assert second != first
    # Health and the Xid count carry over: the agent's monitor is still the source.
    samples = scrape_until(second, every_gpu)
    assert value(samples, "kubegpu_gpu_healthy", uuid=UUIDS[0]) == 0.0
    assert value(samples, "kubegpu_gpu_xid_errors_total", uuid=UUIDS[0], xid="79") == 1.0
    assert not answers(f"{first}/metrics")
    # The reload re-registered the device plugin. Wait for it before the next reload: one that
    # removes the socket while the kubelet is still dialing back makes it reject that
    # registration (as the real kubelet does), and only the next one counts.
    node.kubelet.wait_for_registration(RESOURCE, timeout_s=20, count=2)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node.write_config(f"127.0.0.1:{port}")
        node.plugin.send(signal.SIGHUP)
        node.plugin.wait_for_log("the exporter is off until the next config change or restart")
    assert f"cannot serve the exporter's /metrics on 127.0.0.1:{port}" in node.plugin.log()
    assert not answers(f"{second}/metrics")
    # The device plugin itself is unaffected: it re-registered with each reload.
    node.kubelet.wait_for_registration(RESOURCE, timeout_s=20, count=3)
    node.kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 4, timeout_s=10)

    # Once the port is free, a reload serves there again.
    node.write_config(f"127.0.0.1:{port}", interval_s=0.3)  # a change, so it is applied
    node.plugin.send(signal.SIGHUP)
    third = node.url(2)
    assert third == f"http://127.0.0.1:{port}"
    scrape_until(third, every_gpu)
    node.kubelet.wait_for_registration(RESOURCE, timeout_s=20, count=4)
    assert node.plugin.stop() == 0


def test_a_taken_port_at_start_exits_one_naming_it() -> None:
    root = short_tempdir()
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            plugin = PluginProcess(
                root / "dp",
                preset="4xT4",
                extra=("--exporter", "--exporter-listen", f"127.0.0.1:{port}"),
            )
            assert plugin.proc.wait(30) == 1
        plugin.stop()
        assert f"cannot serve the exporter's /metrics on 127.0.0.1:{port}" in plugin.log()
        # It closed the backend it had opened (the fake's control socket is gone).
        assert not plugin.control.exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)
