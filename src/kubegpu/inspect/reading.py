"""What inspect reads from Node and Pod JSON: metadata, addresses, allocatable, phases.

Tolerant accessors over the objects any Kubernetes client lists (a missing or malformed field
reads as absent, never raises), the node inventory annotation decoded into a
:class:`~kubegpu.sharing.accounting.NodeInfo`, and :func:`gpu_node_names`, the cheap pass that
picks the nodes worth asking for usage. Separate from the model: these know the JSON's shape,
the model knows the rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kubegpu.inspect.report import Filters
from kubegpu.sharing.accounting import NodeInfo
from kubegpu.sharing.annotations import (
    INVENTORY_ANNOTATION,
    MIG_DEVICES_ANNOTATION,
    AnnotationError,
    decode_inventory,
)
from kubegpu.sharing.resources import RequestError, ResourceNames, parse_quantity


def metadata_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def node_address(node: Mapping[str, Any]) -> str:
    """Where the node's exporter is reached: InternalIP, else ExternalIP, else hostname."""
    status = node.get("status")
    addresses = status.get("addresses") if isinstance(status, Mapping) else None
    found: dict[str, str] = {}
    for item in addresses if isinstance(addresses, list) else []:
        if isinstance(item, Mapping) and isinstance(item.get("address"), str):
            found.setdefault(str(item.get("type")), item["address"])
    for kind in ("InternalIP", "ExternalIP", "Hostname"):
        if kind in found:
            return found[kind]
    return str(metadata_of(node).get("name") or "")


def allocatable_count(node: Mapping[str, Any], name: str) -> int:
    status = node.get("status")
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(allocatable, Mapping) or name not in allocatable:
        return 0
    try:
        return int(parse_quantity(allocatable[name]))
    except RequestError:
        return 0


def node_inventory(node: Mapping[str, Any]) -> NodeInfo:
    name = str(metadata_of(node).get("name") or "")
    annotations = metadata_of(node).get("annotations")
    raw = annotations.get(INVENTORY_ANNOTATION) if isinstance(annotations, Mapping) else None
    if raw is None:
        return NodeInfo(name, 0, 0)
    try:
        return NodeInfo(name, 0, 0, decode_inventory(raw))
    except AnnotationError as exc:
        return NodeInfo(name, 0, 0, None, str(exc))


def refused_by_scheduler(pod: Mapping[str, Any]) -> bool:
    """Whether the scheduler has tried the pod and found no node (PodScheduled=False)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") == "False"
        for c in conditions
    )


def pod_phase(pod: Mapping[str, Any]) -> str:
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return phase if isinstance(phase, str) and phase else "Pending"


def pod_started(pod: Mapping[str, Any], phase: str) -> bool:
    """Whether the kubelet has started the pod (so its device Allocate has happened)."""
    if phase != "Pending":
        return True
    status = pod.get("status")
    statuses = status.get("containerStatuses") if isinstance(status, Mapping) else None
    for item in statuses if isinstance(statuses, list) else []:
        state = item.get("state") if isinstance(item, Mapping) else None
        if isinstance(state, Mapping) and ("running" in state or "terminated" in state):
            return True
    return False


def gpu_node_names(
    nodes: Iterable[Mapping[str, Any]],
    filters: Filters = Filters(),
    names: ResourceNames | None = None,
) -> list[str]:
    """Nodes worth asking for usage: they publish an inventory (or MIG devices) or advertise
    GPUs, and pass the node filter. Cheap (no annotation is parsed), so usage can be fetched
    before the report is built."""
    names = names or ResourceNames()
    wanted = set(filters.nodes)
    found: list[str] = []
    for node in nodes:
        meta = metadata_of(node)
        name = meta.get("name")
        if not isinstance(name, str) or not name or (wanted and name not in wanted):
            continue
        annotations = meta.get("annotations")
        published = isinstance(annotations, Mapping) and (
            INVENTORY_ANNOTATION in annotations or MIG_DEVICES_ANNOTATION in annotations
        )
        if (
            published
            or allocatable_count(node, names.whole_gpu)
            or allocatable_count(node, names.share_slot)
        ):
            found.append(name)
    return found


def version_key(obj: Mapping[str, Any], id_field: str) -> tuple[str, str] | None:
    meta = metadata_of(obj)
    ident, version = meta.get(id_field), meta.get("resourceVersion")
    if isinstance(ident, str) and ident and isinstance(version, str) and version:
        return ident, version
    return None
