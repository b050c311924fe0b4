"""What the extender's verbs need of the cluster: a port, so the extender edge does not import
the kube edge. The real one is :class:`kubegpu.kube.view.ClusterView` (a watch-fed cache of
nodes and GPU pods); the extender's composition root (:mod:`kubegpu.roles.extender`) passes it
in, and tests may pass any object of this shape."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from kubegpu.sharing.accounting import NodeInfo, PodUsage
from kubegpu.sharing.claim import PodClaim
from kubegpu.sharing.resources import ResourceNames


class ClusterState(Protocol):
    """Nodes, the GPU pods on them and the binds in flight, as the extender last saw them.

    A pod counts once, by the first it has of: its reservation (a bind in flight), what the
    API server says it holds, its tentative reservation (where prioritize expects it to be
    bound, :mod:`kubegpu.extender.inflight`); the pod watch drops a tentative one when the pod
    is deleted, bound or decided."""

    names: ResourceNames
    nodes: dict[str, NodeInfo]
    pod_json: dict[tuple[str, str], dict[str, Any]]  # (namespace, name) -> the pod
    tentative: dict[str, PodUsage]  # uid -> where a scored pod is expected to be bound
    nominated: dict[str, PodUsage]  # uid -> the cards preemption freed for a waiting pod
    dirty_nodes: set[str]  # nodes whose usage changed since the engine last read them
    topology_version: int  # bumps when a node appears, goes or changes shape
    synced: asyncio.Event  # set once the first listing of nodes and pods is in

    def usages_on(self, node: str) -> list[PodUsage]: ...

    def usage_stores(self) -> tuple[Mapping[str, PodUsage], ...]:
        """Copies of the pods' usages by uid, in the order :meth:`usage` consults them (a pod
        counts by the first that holds it): for a reader on another thread."""
        ...

    def usage(self, uid: str) -> PodUsage | None: ...

    def reserve(self, usage: PodUsage) -> None: ...

    def unreserve(self, uid: str) -> None: ...

    def hold_tentative(self, usage: PodUsage) -> None: ...

    def drop_tentative(self, uid: str) -> PodUsage | None: ...

    def hold_nominated(self, usage: PodUsage) -> None: ...

    def drop_nominated(self, uid: str) -> PodUsage | None: ...

    def apply_pod(self, pod: Mapping[str, Any], *, deleted: bool = False) -> None: ...

    def pod_claims(self) -> dict[tuple[str, str], PodClaim]:
        """A copy of each pod's claim in :attr:`pod_json`, by the same key, as parsed when the
        view stored the pod: for a reader on another thread."""
        ...

    def claim_of(self, pod: Mapping[str, Any]) -> PodClaim:
        """``pod``'s claim (:func:`kubegpu.sharing.claim.read_claim`), parsed once per pod
        object the view holds."""
        ...
