"""The extender's preemption writes on lightkube: a victim's DisruptionTarget condition and its
deletion, the waiting pod's nominatedNodeName, and the PodDisruptionBudgets read.

Implements :class:`kubegpu.sharing.podstore.Evictions` with kube-scheduler's own requests:
the condition by a strategic-merge patch of pods/status (conditions merge by type), a plain
DELETE (kube-scheduler's preemption sends no preconditions and honours the pod's grace
period), and nominatedNodeName by a merge patch of pods/status. Errors become
:class:`~kubegpu.sharing.podstore.PodStoreError`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import lightkube
from lightkube.resources.core_v1 import Pod, PodStatus
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from kubegpu.kube.binding import translated
from kubegpu.sharing.podstore import PodGone

# kube-scheduler's reason (v1.PodReasonPreemptionByScheduler): its own preemption reads it to
# know a victim is terminating for a preemptor and not preempt again meanwhile.
PREEMPTION_REASON = "PreemptionByScheduler"


class ApiEvictions:
    def __init__(self, client: lightkube.AsyncClient) -> None:
        self.client = client

    async def mark_preempted(self, namespace: str, name: str, message: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": PREEMPTION_REASON,
            "message": message,
            "lastTransitionTime": now,
        }
        async with translated():
            await self.client.patch(
                PodStatus,
                name,
                {"status": {"conditions": [condition]}},
                namespace=namespace,
                patch_type=PatchType.STRATEGIC,
            )

    async def delete(self, namespace: str, name: str) -> None:
        try:
            async with translated():
                await self.client.delete(Pod, name, namespace=namespace)
        except PodGone:
            pass  # gone already: what preemption wanted

    async def nominate(self, namespace: str, name: str, node: str) -> None:
        async with translated():
            await self.client.patch(
                PodStatus,
                name,
                {"status": {"nominatedNodeName": node}},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )

    async def disruption_budgets(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        async with translated():
            async for budget in self.client.list(PodDisruptionBudget, namespace="*"):
                out.append(budget.to_dict())
        return out
