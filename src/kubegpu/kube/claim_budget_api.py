"""The claim-budget webhook's API server access: a namespace's budget label, its
ResourceClaims and the cluster's ResourceSlices, read through lightkube
(:class:`kubegpu.sharing.claim_budget.ClaimBudgetFacts`).

The claims are listed at every decision, without a resourceVersion: the API server answers
such a list consistently (from its watch cache once that has caught up with etcd), so a claim
stored before the list is in it. The webhook serves from a loop of its own (an
:class:`~kubegpu.httpd.HttpThread`), so the client is made on first use, on that loop, and
closed there by :meth:`close`.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx2 as httpx
import lightkube
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Namespace

from kubegpu.kube.resource_claims import ResourceClaim, claim_demand
from kubegpu.kube.resource_slices import ResourceSlice, card_memory
from kubegpu.sharing.claim_budget import (
    BUDGET_LABEL,
    CardMemory,
    ClaimBudgetLookupError,
    ClaimDemand,
    ClaimDemandError,
    default_class_drivers,
)

FIELD_MANAGER = "kubegpu-claim-budget"


def _failure(what: str, exc: Exception) -> ClaimBudgetLookupError:
    if isinstance(exc, lightkube.ApiError):
        status = exc.status
        reason = f" {status.reason}" if status.reason else ""
        return ClaimBudgetLookupError(
            f"cannot read {what}: the API server answered {status.code}{reason}: "
            f"{status.message or 'no message'}"
        )
    return ClaimBudgetLookupError(
        f"cannot read {what} from the API server: {type(exc).__name__}: {str(exc) or 'no detail'}"
    )


class LightkubeClaimBudgetFacts:
    def __init__(self, config: KubeConfig, class_drivers: Mapping[str, str] | None = None) -> None:
        self._config = config
        self._client: lightkube.AsyncClient | None = None
        self.class_drivers = dict(class_drivers or default_class_drivers())

    def _api(self) -> lightkube.AsyncClient:
        if self._client is None:
            self._client = lightkube.AsyncClient(self._config, field_manager=FIELD_MANAGER)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def budget_label(self, namespace: str) -> str | None:
        try:
            found = await self._api().get(Namespace, namespace)
        except lightkube.ApiError as exc:
            if exc.status.code == 404:
                return None
            raise _failure(f"namespace {namespace}", exc) from None
        except httpx.HTTPError as exc:
            raise _failure(f"namespace {namespace}", exc) from None
        labels = (found.metadata.labels if found.metadata else None) or {}
        return labels.get(BUDGET_LABEL)

    async def claims(self, namespace: str) -> list[ClaimDemand]:
        try:
            objs = [dict(o) async for o in self._api().list(ResourceClaim, namespace=namespace)]
        except (lightkube.ApiError, httpx.HTTPError) as exc:
            raise _failure(f"the resourceclaims of namespace {namespace}", exc) from None
        try:
            return [claim_demand(obj, self.class_drivers) for obj in objs]
        except ClaimDemandError as exc:
            # The API server validated every stored claim, so only a sender that is not one
            # gets here; the namespace's usage is then unknown.
            raise ClaimBudgetLookupError(f"a stored claim cannot be read: {exc}") from None

    async def cards(self) -> CardMemory:
        try:
            objs = [dict(o) async for o in self._api().list(ResourceSlice)]
        except (lightkube.ApiError, httpx.HTTPError) as exc:
            raise _failure("the resourceslices", exc) from None
        return card_memory(objs)

    def demand(self, claim: Mapping[str, object]) -> ClaimDemand:
        return claim_demand(claim, self.class_drivers)
