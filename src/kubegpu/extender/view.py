"""What the extender's verbs need of the cluster: a port, so the extender edge does not import
the kube edge. The real one is :class:`kubegpu.kube.view.ClusterView` (a watch-fed cache of
nodes and GPU pods); the extender's composition root (:mod:`kubegpu.roles.extender`) passes it
in, and tests may pass any object of this shape."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from kubegpu.sharing.accounting import NodeInfo, PodUsage
from kubegpu.sharing.resources import ResourceNames


class ClusterState(Protocol):
    """Nodes, the GPU pods on them and the binds in flight, as the extender last saw them."""

    names: ResourceNames
    nodes: dict[str, NodeInfo]
    pod_json: dict[tuple[str, str], dict[str, Any]]  # (namespace, name) -> the pod
    dirty_nodes: set[str]  # nodes whose usage changed since the engine last read them
    topology_version: int  # bumps when a node appears, goes or changes shape
    synced: asyncio.Event  # set once the first listing of nodes and pods is in

    def usages_on(self, node: str) -> list[PodUsage]: ...

    def reserve(self, usage: PodUsage) -> None: ...

    def unreserve(self, uid: str) -> None: ...

    def apply_pod(self, pod: Mapping[str, Any], *, deleted: bool = False) -> None: ...
