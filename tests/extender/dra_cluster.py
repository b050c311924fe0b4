"""DRA test objects: ResourceSlices as our driver writes them, ResourceClaims as kube-scheduler's
allocator leaves them, pods that name claims, and a small node/pod view for the ranker."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from kubegpu.core.dra import DEFAULT_DRIVER_NAME
from kubegpu.core.gpu import GpuDevice, GpuUuid, NodeInventory
from kubegpu.dra.slices import build_resource_slices, pool_name
from kubegpu.sharing.accounting import NodeInfo, PodUsage
from kubegpu.sharing.resources import ResourceNames

DRIVER = DEFAULT_DRIVER_NAME
GIB = 2**30


def node_inventory(
    cards: int, memory_mib: int = 81920, model: str = "NVIDIA A100-SXM4-80GB"
) -> NodeInventory:
    return NodeInventory(
        tuple(
            GpuDevice(
                index=i,
                uuid=GpuUuid(f"GPU-{i:02d}"),
                product_name=model,
                memory_total_mib=memory_mib,
                pci_bus_id=f"00000000:{i + 1:02x}:00.0",
                minor_number=i,
            )
            for i in range(cards)
        )
    )


def node_slice(
    node: str,
    cards: int = 4,
    *,
    memory_mib: int = 81920,
    model: str = "NVIDIA A100-SXM4-80GB",
    generation: int = 1,
    unhealthy: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The node's one ResourceSlice, built by the driver's own code (``dra.slices``)."""
    (only,) = build_resource_slices(
        node,
        node_inventory(cards, memory_mib, model),
        generation=generation,
        unhealthy=unhealthy,
    )
    return only


def share_result(
    node: str, index: int, memory: str, compute: str, share: str = "s"
) -> dict[str, Any]:
    return {
        "request": "gpu",
        "driver": DRIVER,
        "pool": pool_name(node),
        "device": f"gpu-{index}",
        "shareID": share,
        "consumedCapacity": {"memory": memory, "compute": compute},
    }


def whole_result(node: str, index: int) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": pool_name(node), "device": f"gpu-{index}"}


def claim(
    name: str,
    requests: Sequence[dict[str, Any]] = (),
    results: Sequence[dict[str, Any]] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    """A ResourceClaim; ``results`` makes it allocated."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": list(requests)}},
    }
    if results is not None:
        obj["status"] = {"allocation": {"devices": {"results": list(results)}}}
    return obj


def share_request(
    memory: str | None = None, compute: str | None = None, *, count: int = 1, name: str = "gpu"
) -> dict[str, Any]:
    wanted = {k: v for k, v in (("memory", memory), ("compute", compute)) if v is not None}
    exactly: dict[str, Any] = {"deviceClassName": "gpu-share.kubegpu.io", "count": count}
    if wanted:
        exactly["capacity"] = {"requests": wanted}
    return {"name": name, "exactly": exactly}


def whole_request(count: int = 1, *, name: str = "gpu") -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "gpu.kubegpu.io", "count": count}}


def dra_pod(
    name: str,
    claims: Mapping[str, str],
    *,
    templates: Mapping[str, str | None] | None = None,
    cpu: str = "1",
    namespace: str = "default",
) -> dict[str, Any]:
    """A pod naming ``claims`` (pod claim name -> ResourceClaim name) directly and
    ``templates`` (pod claim name -> the generated claim's name in its status, None: not yet)."""
    entries: list[dict[str, Any]] = [{"name": k, "resourceClaimName": v} for k, v in claims.items()]
    statuses = []
    for k, generated in (templates or {}).items():
        entries.append({"name": k, "resourceClaimTemplateName": f"{k}-template"})
        if generated is not None:
            statuses.append({"name": k, "resourceClaimName": generated})
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "resources": {
                        "requests": {"cpu": cpu, "memory": "1Gi"},
                        "claims": [{"name": k} for k in [e["name"] for e in entries]],
                    },
                }
            ],
            "resourceClaims": entries,
        },
        "status": {"phase": "Pending"},
    }
    if statuses:
        pod["status"]["resourceClaimStatuses"] = statuses
    return pod


class NodeView:
    """The node and pod view the ranker reads CPU from (the extender's ClusterState shape)."""

    def __init__(
        self, nodes: Mapping[str, int], usages: Mapping[str, Sequence[PodUsage]] = {}
    ) -> None:
        self.names = ResourceNames()
        self.nodes = {n: NodeInfo(n, cpu, 512 * 1024) for n, cpu in nodes.items()}
        self.usages = dict(usages)
        self.pod_json: dict[tuple[str, str], dict[str, Any]] = {}
        self.tentative: dict[str, PodUsage] = {}
        self.nominated: dict[str, PodUsage] = {}
        self.dirty_nodes: set[str] = set()
        self.topology_version = 0
        self.synced = asyncio.Event()
        self.synced.set()

    def usages_on(self, node: str) -> list[PodUsage]:
        return list(self.usages.get(node, ()))

    def usage(self, uid: str) -> PodUsage | None:
        return None

    def usage_stores(self) -> tuple[dict[str, PodUsage], ...]:
        return ({u.uid: u for usages in self.usages.values() for u in usages},)

    def reserve(self, usage: PodUsage) -> None:
        raise AssertionError("ranking reserves nothing")

    def hold_tentative(self, usage: PodUsage) -> None:
        raise AssertionError("ranking reserves nothing")

    def drop_tentative(self, uid: str) -> PodUsage | None:
        raise AssertionError("ranking reserves nothing")

    def unreserve(self, uid: str) -> None:
        raise AssertionError("ranking reserves nothing")

    def hold_nominated(self, usage: PodUsage) -> None:
        raise AssertionError("ranking reserves nothing")

    def drop_nominated(self, uid: str) -> PodUsage | None:
        raise AssertionError("ranking reserves nothing")

    def apply_pod(self, pod: Mapping[str, Any], *, deleted: bool = False) -> None:
        raise AssertionError("ranking applies nothing")
