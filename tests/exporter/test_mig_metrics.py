"""MIG devices in the exporter: each one under its parent card with its memory, and the pods
holding one (the kubelet's PodResources names a MIG device by its UUID under the device
plugin's MIG strategies)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kubegpu.core.gpu import NodeInventory
from kubegpu.core.metrics import DeviceAssignment, PodKey
from kubegpu.exporter.pods import StaticPodResources
from kubegpu.exporter.refresher import Refresher
from kubegpu.inventory.fake_metrics import FakeMetricsSource
from kubegpu.inventory.spec import parse_fake_spec
from tests.exporter.conftest import Node
from tests.exporter.test_collector import registry_for

SPEC = """
gpus:
  - index: 0
    uuid: GPU-00000000-0000-0000-0000-00000000000a
    product_name: NVIDIA H100 80GB HBM3
    memory_total_mib: 81559
    pci_bus_id: "00000000:10:00.0"
    mig_enabled: true
    mig_instances:
      - {profile: 3g.40gb, start: 4}
      - {profile: 1g.10gb, start: 0}
  - index: 1
    uuid: GPU-00000000-0000-0000-0000-00000000000b
    product_name: NVIDIA H100 80GB HBM3
    memory_total_mib: 81559
    pci_bus_id: "00000000:11:00.0"
"""
POD = PodKey("ml", "mig-trainer")


def mig_scrape(node: Node) -> tuple[CollectorRegistry, NodeInventory]:
    """The exporter of a node with a card in MIG mode and a pod holding its 3g.40gb."""
    inventory = parse_fake_spec(SPEC, name="mig", source="mig.yaml").inventory
    three_g = inventory.by_index(0).mig_devices[1]
    refresher = Refresher(
        node="node-a",
        inventory=lambda: inventory,
        metrics=FakeMetricsSource(inventory),
        pod_resources=StaticPodResources(
            [DeviceAssignment(POD, "main", "nvidia.com/mig-3g.40gb", three_g.uuid)]
        ),
        clock=node.clock,
    )
    assert refresher.refresh_once()
    return registry_for(node, refresher), inventory


def test_mig_devices_appear_under_their_card_with_memory_and_holder(node: Node) -> None:
    registry, inventory = mig_scrape(node)
    one_g, three_g = inventory.by_index(0).mig_devices
    card = {
        "node": "node-a",
        "gpu": "0",
        "uuid": "GPU-00000000-0000-0000-0000-00000000000a",
        "model": "NVIDIA H100 80GB HBM3",
    }
    for mig in (one_g, three_g):
        labels = {**card, "mig_uuid": mig.uuid, "profile": mig.profile}
        assert (
            registry.get_sample_value("kubegpu_mig_device_memory_total_bytes", labels)
            == mig.memory_total_mib * 2**20
        )
        info = {
            **labels,
            "gpu_instance_id": str(mig.gpu_instance_id),
            "compute_instance_id": "0",
            "placement_start": str(mig.start),
        }
        assert registry.get_sample_value("kubegpu_mig_device_info", info) == 1
    held = {
        "namespace": "ml",
        "pod": "mig-trainer",
        "container": "main",
        **card,
        "mig_uuid": three_g.uuid,
        "profile": "3g.40gb",
    }
    assert registry.get_sample_value("kubegpu_pod_mig_device_allocated", held) == 1
    one_held = {**held, "mig_uuid": one_g.uuid, "profile": "1g.10gb"}
    assert registry.get_sample_value("kubegpu_pod_mig_device_allocated", one_held) is None
    # The card in MIG mode is not held whole by anyone.
    assert (
        registry.get_sample_value(
            "kubegpu_pod_gpu_allocated", {"namespace": "ml", "pod": "mig-trainer", **card}
        )
        is None
    )


def test_a_node_without_mig_exports_no_mig_series(node: Node) -> None:
    refresher = node.refresher()
    assert refresher.refresh_once()
    names = {m.name for m in registry_for(node, refresher).collect()}
    assert not {n for n in names if "mig" in n}
