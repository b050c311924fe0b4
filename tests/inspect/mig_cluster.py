"""A cluster with cards in MIG mode as Kubernetes JSON, for the inspect MIG tests.

* ``h100``: the ``4xH100-80GB-MIG`` preset under ``mixed``: cards 0–2 in MIG mode (3g.40gb +
  2g.20gb + 1g.10gb; 7 × 1g.10gb; 2 × 3g.40gb) in ``kubegpu.io/mig-devices``, card 3 whole in
  the inventory. Pods: ``ml/infer`` asks for a 3g.40gb, ``ml/train`` for two 1g.10gb,
  ``web/encode`` for a 2g.20gb, ``ml/whole`` holds card 3 by the extender's decision, and a
  finished ``ml/done`` asked for a 3g.40gb.
* ``single``: one card of 7 × 1g.10gb under ``single`` (its MIG devices go by
  ``nvidia.com/gpu``; the inventory is empty); ``ml/plain`` asks for two ``nvidia.com/gpu``.
* ``broken``: a MIG devices annotation that is not JSON.
"""

from __future__ import annotations

from typing import Any

from kubegpu.core.gpu import GpuDevice, NodeInventory
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.kubelet.cluster import inventory_records, mig_records
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    INVENTORY_ANNOTATION,
    MIG_DEVICES_ANNOTATION,
    AllocationDecision,
    CardShare,
    ContainerAllocation,
    NodeGpuInventory,
    encode_allocation,
    encode_inventory,
    encode_mig_devices,
)
from kubegpu.testing.apiserver import make_node, make_pod

NODE = resolve_fake_spec("4xH100-80GB-MIG").inventory
CARD0, CARD1, CARD2, CARD3 = NODE.gpus
H100 = CARD0.product_name
THREE_G, TWO_G, ONE_G = (f"nvidia.com/mig-{p}" for p in ("3g.40gb", "2g.20gb", "1g.10gb"))
MIXED_RESOURCES = {
    m.uuid: f"nvidia.com/mig-{m.profile}" for g in (CARD0, CARD1, CARD2) for m in g.mig_devices
}


def node_with_mig(
    name: str, whole: tuple[GpuDevice, ...], mig: str, *, address: str = ""
) -> dict[str, Any]:
    node = make_node(
        name,
        annotations={
            INVENTORY_ANNOTATION: encode_inventory(inventory_records(NodeInventory(gpus=whole))),
            MIG_DEVICES_ANNOTATION: mig,
        },
    )
    if address:
        node["status"]["addresses"].insert(0, {"type": "InternalIP", "address": address})
    return node


def running(pod: dict[str, Any]) -> dict[str, Any]:
    pod["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": "main", "ready": True, "state": {"running": {}}}],
    }
    meta = pod["metadata"]
    meta["uid"] = f"uid-{meta['namespace']}-{meta['name']}"
    return pod


def mig_pod(name: str, namespace: str, node: str, resource: str, count: int) -> dict[str, Any]:
    return running(make_pod(name, namespace, limits={resource: str(count)}, node_name=node))


def whole_card_pod() -> dict[str, Any]:
    card = CardShare(CARD3.uuid, CARD3.index, 1000, CARD3.memory_total_mib)
    decision = AllocationDecision(
        "h100",
        (card,),
        (ContainerAllocation("main", False, (card,)),),
        "2026-11-22T00:00:00Z",
        "binpack",
        False,
    )
    return running(
        make_pod(
            "whole",
            "ml",
            limits={"nvidia.com/gpu": "1"},
            node_name="h100",
            annotations={ALLOCATION_ANNOTATION: encode_allocation(decision)},
        )
    )


def nodes() -> list[dict[str, Any]]:
    mixed = mig_records([CARD0, CARD1, CARD2], resources=MIXED_RESOURCES)
    single = mig_records([CARD1], resources={m.uuid: "nvidia.com/gpu" for m in CARD1.mig_devices})
    assert mixed is not None and single is not None
    broken = make_node(
        "broken",
        annotations={
            INVENTORY_ANNOTATION: encode_inventory(NodeGpuInventory(())),
            MIG_DEVICES_ANNOTATION: "{",
        },
    )
    return [
        node_with_mig("h100", (CARD3,), encode_mig_devices(mixed), address="10.0.0.7"),
        node_with_mig("single", (), encode_mig_devices(single)),
        broken,
        make_node("cpu"),
    ]


def pods() -> list[dict[str, Any]]:
    done = mig_pod("done", "ml", "h100", THREE_G, 1)
    done["status"] = {"phase": "Succeeded"}
    return [
        mig_pod("infer", "ml", "h100", THREE_G, 1),
        mig_pod("train", "ml", "h100", ONE_G, 2),
        mig_pod("encode", "web", "h100", TWO_G, 1),
        whole_card_pod(),
        done,
        mig_pod("plain", "ml", "single", "nvidia.com/gpu", 2),
        # Bound to a node without MIG devices: not a MIG holder anywhere.
        mig_pod("stray", "ml", "cpu", THREE_G, 1),
    ]
