"""The claim-budget webhook's decisions, one namespace at a time.

Two creates in one namespace must not both slip under the budget. The API server stores a claim
only after every webhook has answered, so a claim admitted a moment ago is not yet in the list
the next decision reads. The ledger therefore

* decides one claim at a time per namespace (an ``asyncio.Lock`` per namespace: the webhook's
  handlers all run on one loop), and
* remembers every claim it admitted (by UID) until a list shows it, or for ``pending_s``
  seconds at most (a claim refused after us by another admission step, or stored and deleted
  between two lists, is then no longer charged).

That holds within one process: the shipped Deployment runs one replica (docs/decisions/0011).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kubegpu.sharing.claim_budget import (
    BudgetError,
    ClaimBudgetFacts,
    ClaimBudgetLookupError,
    ClaimDemand,
    ClaimDemandError,
    Unpriced,
    Verdict,
    budget_refusal,
    claim_bytes,
    format_bytes,
    parse_budget,
)

log = logging.getLogger(__name__)

# Longer than the API server waits for the webhook (timeoutSeconds, 10 s in the manifests)
# plus the time to store the claim, so an admitted claim is charged until a list can show it.
DEFAULT_PENDING_S = 30.0


@dataclass
class _Pending:
    name: str
    charged_bytes: int
    expires: float


class ClaimLedger:
    def __init__(
        self,
        facts: ClaimBudgetFacts,
        *,
        pending_s: float = DEFAULT_PENDING_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.facts = facts
        self.pending_s = pending_s
        self.clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._pending: dict[str, dict[str, _Pending]] = {}

    def pending(self, namespace: str) -> dict[str, int]:
        """UID -> bytes of the admitted claims not yet seen in a list (for tests and logs)."""
        return {uid: p.charged_bytes for uid, p in self._pending.get(namespace, {}).items()}

    async def admit(
        self, namespace: str, claim: Mapping[str, object], *, dry_run: bool = False
    ) -> Verdict:
        """Whether ``claim`` (a ResourceClaim's JSON at CREATE) fits ``namespace``'s budget.
        Every failure to read what the decision needs is a refusal naming it: a budget that
        cannot be checked is not enforced by letting claims through."""
        try:
            demand = self.facts.demand(claim)
        except ClaimDemandError as exc:
            return Verdict(f"kubegpu claim budget: {exc}")
        if not demand.asks_for_gpus:
            return Verdict()
        # One lock per namespace that ever asked for GPUs, kept: dropping one while a
        # waiter holds it would let the next arrival decide beside that waiter.
        lock = self._locks.setdefault(namespace, asyncio.Lock())
        try:
            async with lock:
                return await self._decide(namespace, demand, dry_run=dry_run)
        except ClaimBudgetLookupError as exc:
            return Verdict(f"kubegpu claim budget: namespace {namespace}: {exc}")

    async def _decide(self, namespace: str, demand: ClaimDemand, *, dry_run: bool) -> Verdict:
        raw = await self.facts.budget_label(namespace)
        if raw is None:
            return Verdict()
        try:
            budget = parse_budget(raw)
        except BudgetError as exc:
            return Verdict(
                f"kubegpu claim budget: namespace {namespace}: {exc}; no claim for GPUs is "
                "admitted there until an admin corrects it"
            )
        stored = await self.facts.claims(namespace)
        pending = self._unlisted(namespace, {_key(c) for c in stored})
        counted = [c for c in stored if not c.deleting and _key(c) != _key(demand)]
        cards = await self.facts.cards() if any(c.needs_cards for c in (demand, *counted)) else {}
        try:
            asked = claim_bytes(demand, cards)
        except Unpriced as exc:
            return Verdict(f"kubegpu claim budget: namespace {namespace} has a budget: {exc}")
        held = sum(p.charged_bytes for p in pending.values())
        for other in counted:
            try:
                held += claim_bytes(other, cards)
            except Unpriced as exc:
                # Stored before any card was published: it cannot be allocated either.
                log.warning("claim budget: %s; not charged", exc)
        refusal = budget_refusal(namespace, raw, budget, held, asked)
        if refusal:
            log.info(
                "claim budget: resourceclaim %s/%s refused: %s", namespace, demand.name, refusal
            )
            return Verdict(refusal, asked)
        if not dry_run and asked:
            pending[_key(demand)] = _Pending(demand.name, asked, self.clock() + self.pending_s)
            self._pending[namespace] = pending
        log.info(
            "claim budget: resourceclaim %s/%s admitted: %s, the namespace then holds %s of %s",
            namespace,
            demand.name,
            format_bytes(asked),
            format_bytes(held + asked),
            raw,
        )
        return Verdict("", asked)

    def _unlisted(self, namespace: str, listed: set[str]) -> dict[str, _Pending]:
        """The namespace's admitted claims that the list does not show yet and that have not
        expired; the rest are forgotten."""
        now = self.clock()
        kept = {
            uid: p
            for uid, p in self._pending.get(namespace, {}).items()
            if uid not in listed and p.expires > now
        }
        if kept:
            self._pending[namespace] = kept
        else:
            self._pending.pop(namespace, None)
        return kept


def _key(claim: ClaimDemand) -> str:
    """A claim's identity across lists: its UID (set by the API server before validating
    admission), its name should a sender leave the UID out."""
    return claim.uid or f"name:{claim.name}"
