"""The claim-budget webhook's composition root: the webhook edge's HTTPS server deciding with a
ledger over the kube edge's reads of namespaces, ResourceClaims and ResourceSlices, for
``kubegpu claim-budget-webhook``."""

from __future__ import annotations

import ssl
from typing import Any

from kubegpu.httpd import HttpThread
from kubegpu.kube.claim_budget_api import LightkubeClaimBudgetFacts
from kubegpu.webhook.claim_ledger import ClaimLedger
from kubegpu.webhook.server import serve_claim_budget_webhook


def start_claim_budget_webhook(
    host: str,
    port: int,
    kube_config: Any,
    context: ssl.SSLContext | None,
    *,
    pending_s: float,
) -> tuple[HttpThread, list[str]]:
    """The webhook serving on ``host:port`` in a thread, and the DeviceClasses it budgets.
    Raises ``OSError`` when it cannot listen."""
    facts = LightkubeClaimBudgetFacts(kube_config)
    ledger = ClaimLedger(facts, pending_s=pending_s)
    server = serve_claim_budget_webhook(host, port, ledger, context, close=facts.close)
    return server, sorted(facts.class_drivers)
