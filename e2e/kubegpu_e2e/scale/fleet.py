"""The replay's nodes: KWOK's controller (real, built from its Go module) keeps them alive with no
kubelet, and this module creates them with what kubegpu's node agent would give each one.

For every node: a fake-GPU spec of its cards (model as the trace names it, one UUID per card),
read by the fake backend into the inventory the agent would see; the device counts the agent's
device plugin would advertise for that inventory under the shipped node-agent config
(``kubegpu.kubelet.plans.build_plans``: ``nvidia.com/gpu`` and the share slots), set as the
Node's capacity as the kubelet would; and the ``kubegpu.io/gpu-inventory`` annotation written by
the agent's own publisher (``kubegpu.kube.inventory``). One process serves every node.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightkube
import yaml
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from kubegpu.config.load import load_config
from kubegpu.core.gpu import NodeInventory
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.inventory.spec import parse_fake_spec
from kubegpu.kube.inventory import publish_node_inventory_async
from kubegpu.kubelet.cluster import inventory_records
from kubegpu.kubelet.plans import build_plans
from kubegpu.placement.model import NodeState
from kubegpu_e2e.cluster import Cluster, free_port, http_ok
from kubegpu_e2e.processes import HostProcess

REPO = Path(__file__).resolve().parents[3]
AGENT_CONFIG = REPO / "deploy" / "base" / "node-agent-config.yaml"
KWOK_STAGES = Path(__file__).with_name("kwok-stages.yaml")
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
FLEET_LABEL = "kubegpu.io/replay-node"
# Card memory by the trace's model names. openb's shares name compute only and the replay's
# shares ask 1 MiB (trace.SHARE_MEMORY_MIB), so these figures decide nothing; G2 and G3 are
# models the trace leaves unnamed.
MODEL_MEMORY_MIB = {
    "P100": 16_384,
    "V100M16": 16_384,
    "V100M32": 32_768,
    "T4": 15_360,
    "A10": 24_576,
    "G2": 16_384,
    "G3": 32_768,
}
DEFAULT_MEMORY_MIB = 16_384
# Pods a KWOK node takes: more than any trace puts on one node, so only CPU, memory and GPUs
# limit placement, as in the simulator.
MAX_PODS = 1_000
_UUID_NAMESPACE = uuid.UUID("3f2b9c1e-5a47-4d8e-b0c6-9e1d7a2f4c58")


def gpu_spec(node: NodeState) -> str:
    """The fake-GPU spec of ``node``'s cards (the YAML format `--fake-gpus` reads)."""
    model = node.gpu_model or "GPU"
    gpus = [
        {
            "index": g.index,
            "uuid": f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node.name}/{g.index}')}",
            "product_name": model,
            "memory_total_mib": MODEL_MEMORY_MIB.get(model, DEFAULT_MEMORY_MIB),
            "pci_bus_id": f"00000000:{0x10 + g.index:02X}:00.0",
        }
        for g in node.gpus
    ]
    return yaml.safe_dump({"description": f"replay node {node.name}", "gpus": gpus})


def agent_inventory(node: NodeState) -> NodeInventory:
    spec = parse_fake_spec(gpu_spec(node), name=node.name, source=f"replay node {node.name}")
    return FakeGpuBackend(spec).snapshot()


def advertised(inventory: NodeInventory) -> dict[str, str]:
    """Extended resources the node agent's device plugin would register for ``inventory``."""
    config = load_config(AGENT_CONFIG)
    return {p.resource_name: str(len(p.devices)) for p in build_plans(config, inventory)}


def node_manifest(node: NodeState, inventory: NodeInventory) -> dict[str, Any]:
    capacity = {
        "cpu": f"{node.cpu_capacity_milli}m",
        "memory": f"{node.memory_free_mib}Mi",
        "pods": str(MAX_PODS),
        **advertised(inventory),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "annotations": {KWOK_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                "type": "kwok",
                FLEET_LABEL: "true",
            },
        },
        # The API server keeps a Node's status on create: capacity as the kubelet reports it.
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


async def create_nodes(
    client: lightkube.AsyncClient, nodes: Sequence[NodeState], parallel: int = 16
) -> None:
    """Create every node with its capacity, then publish its inventory like the agent does."""
    gate = asyncio.Semaphore(parallel)

    async def one(node: NodeState) -> None:
        async with gate:
            inventory = agent_inventory(node)
            await client.create(Node.from_dict(node_manifest(node, inventory)))
            # The API server's TaintNodesByCondition admission gives a new Node the not-ready
            # taint, which the node lifecycle controller lifts once the node is Ready; with
            # that controller off (session.NODE_LIFECYCLE_OFF) the replay lifts it itself.
            await client.patch(
                Node, node.name, {"spec": {"taints": None}}, patch_type=PatchType.MERGE
            )
            await publish_node_inventory_async(client, node.name, inventory_records(inventory))

    await asyncio.gather(*(one(n) for n in nodes))


class Kwok:
    """The KWOK controller, managing the nodes annotated ``kwok.x-k8s.io/node: fake``."""

    def __init__(self, cluster: Cluster, binary: Path) -> None:
        self.cluster = cluster
        self.binary = binary
        self.port = free_port()
        self.process: HostProcess | None = None

    def start(self) -> HostProcess:
        c = self.cluster
        self.process = HostProcess(
            "kwok",
            [
                str(self.binary),
                f"--kubeconfig={c.admin}",
                f"--config={KWOK_STAGES}",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                f"--server-address=127.0.0.1:{self.port}",
                # Pod addresses KWOK hands out (never routed): room for every replayed pod.
                "--cidr=10.128.0.0/14",
                "--node-ip=127.0.0.1",
            ],
            c.logs / "kwok.log",
            env=c.env,
        ).start()
        self.process.wait_until(
            lambda: http_ok(f"http://127.0.0.1:{self.port}/healthz"), 60, "kwok /healthz"
        )
        return self.process

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=10)
