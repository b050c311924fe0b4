"""The labeller's composition root: the labels edge on a GPU backend, a health judge and a sink.

The labels edge computes labels and writes them to a :class:`~kubegpu.labels.sinks.LabelSink`;
this module chooses the sink (an NFD feature file, stdout, or the Node through the kube edge)
and judges GPU health with the node agent's monitor and policy, so the labeller's
``kubegpu.io/gpu.healthy-count`` says what the device plugin tells the kubelet.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from kubegpu.core.backend import GpuBackend
from kubegpu.core.health import HealthCheckPolicy
from kubegpu.core.health_feed import HealthFeed
from kubegpu.labels.catalogue import SharingSummary
from kubegpu.labels.host import SYSFS_PCI_DEVICES, read_host_facts
from kubegpu.labels.labeller import Labeller
from kubegpu.labels.sinks import LabelSink, NfdFeatureFileSink, NodeLabelSink, StdoutSink
from kubegpu.roles.health import judge_health

log = logging.getLogger(__name__)


class KubeconfigError(Exception):
    """``--sink node`` without usable API access (the message says where it looked)."""


def label_sink(kind: str, nfd_file: Path, node_name: str) -> LabelSink:
    """Where labels go; the Node sink needs API access now, not at the first write."""
    if kind == "nfd":
        return NfdFeatureFileSink(nfd_file)
    if kind == "node":
        from kubegpu.kube import client
        from kubegpu.kube.node_labels import LightkubeNodeLabels

        try:  # In-cluster service account, else KUBECONFIG / ~/.kube/config.
            kube_config = client.load_kubeconfig()
        except client.KubeconfigError as exc:
            raise KubeconfigError(str(exc)) from exc
        api = LightkubeNodeLabels(client.client_from(kube_config, field_manager="kubegpu-labels"))
        return NodeLabelSink(api, node_name)
    return StdoutSink(sys.stdout)


def run_labeller(
    backend: GpuBackend,
    sink: LabelSink,
    sharing: SharingSummary,
    policy: HealthCheckPolicy,
    *,
    node_name: str,
    sink_name: str,
    once: bool,
    timestamp: bool,
    interval_s: float,
    poll_s: float,
    wait_for_stop: Callable[[], None],
    machine_type_file: Path,
    pci_devices: Path = SYSFS_PCI_DEVICES,
) -> int:
    """Label until ``wait_for_stop`` returns (the command's SIGTERM/SIGINT, whose handler it
    installs before anything slow so that none is lost) or once; the exit code: 2 when
    ``once`` cannot write. Closes ``backend``."""
    inventory = backend.snapshot()
    health = HealthFeed(policy=policy)
    # The GPUs' PCI classes only for real ones: a fake GPU's bus id is some other device's.
    host = read_host_facts(
        inventory,
        machine_type_file=machine_type_file,
        pci_devices=pci_devices if backend.name == "nvml" else None,
    )
    labeller = Labeller(
        inventory=backend.snapshot,
        sink=sink,
        health=health.healthy_map,
        sharing=sharing,
        host=host,
        timestamp=timestamp,
        poll_s=poll_s,
        resync_s=interval_s,
    )
    log.info(
        "labels settings: node=%s backend=%s sink=%s gpus=%d once=%s",
        node_name,
        backend.name,
        sink_name,
        len(inventory.gpus),
        once,
    )
    if once:
        try:
            labeller.refresh_once(force=True)
        except Exception as exc:
            log.error("node %s: writing labels failed: %s", node_name, exc)
            return 2
        finally:
            backend.close()
        return 0
    health.add_listener(labeller.notify)
    judge_health(health, backend, inventory, node_name=node_name)
    thread = threading.Thread(target=labeller.run, name="kubegpu-labeller")
    thread.start()
    try:
        wait_for_stop()
    finally:
        labeller.stop()
        thread.join()
    health.close()
    backend.close()
    return 0
