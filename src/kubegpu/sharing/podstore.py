"""The port through which the scheduler extender reads, annotates and binds pods.

The extender's bind needs three things of the API server: read one pod, merge annotations
onto it with its resourceVersion as precondition, and POST its Binding (which can carry
annotations and that precondition itself: one write instead of two). This protocol names
them with our errors instead of a client library's, so the extender imports no Kubernetes
client (``kubegpu.kube.binding`` is the real implementation; a test may bring its own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class PodStoreError(Exception):
    """The API server refused or could not be reached; ``message`` is what it said, ``code``
    its HTTP status (``None``: no answer)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class PodConflict(PodStoreError):
    """409: the pod moved past the resourceVersion the write was made from."""


class PodGone(PodStoreError):
    """404: no such pod (any more)."""


class PodStore(Protocol):
    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        """The pod's JSON."""
        ...

    async def patch_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str,
    ) -> dict[str, Any]:
        """Merge ``annotations`` (``None`` removes one), conditional on ``resource_version``
        when it is not empty; returns the patched pod's JSON."""
        ...

    async def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        *,
        annotations: Mapping[str, str] | None = None,
        resource_version: str = "",
    ) -> None:
        """POST the pod's Binding to ``node``, with its UID as precondition, and its
        ``resource_version`` too when not empty. The API server sets ``annotations`` on the pod
        in the same write (it copies a Binding's annotations onto the pod it binds)."""
        ...


class Evictions(Protocol):
    """What the extender's own preemption writes and reads besides pods' annotations and
    bindings (:mod:`kubegpu.extender.preemption`): kube-scheduler's steps for a victim and for
    the pod it makes room for."""

    async def mark_preempted(self, namespace: str, name: str, message: str) -> None:
        """Set the victim's ``DisruptionTarget`` condition (reason ``PreemptionByScheduler``),
        as kube-scheduler does before deleting it: its controllers and kube-scheduler's own
        preemption then know why it is terminating."""
        ...

    async def delete(self, namespace: str, name: str) -> None:
        """Delete the victim with its own grace period; a pod already gone is not an error."""
        ...

    async def nominate(self, namespace: str, name: str, node: str) -> None:
        """Set the waiting pod's ``status.nominatedNodeName``: kube-scheduler tries that node
        first and counts the pod there while lower-priority pods are scheduled."""
        ...

    async def disruption_budgets(self) -> list[dict[str, Any]]:
        """Every PodDisruptionBudget (policy/v1) as JSON."""
        ...
