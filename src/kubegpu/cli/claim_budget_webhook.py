"""``kubegpu claim-budget-webhook``: the validating admission webhook that caps the GPU memory of
a namespace's DRA ResourceClaims (docs/quotas.md, "GPU memory of DRA claims").

Every flag is also ``KUBEGPU_CLAIM_BUDGET_WEBHOOK_<FLAG>``. As the peer webhook: HTTPS only
(``--tls-cert-file``/``--tls-key-file``) except on a loopback address, loopback unless told
otherwise. It reads namespaces, ResourceClaims and ResourceSlices with ``--kubeconfig`` (in a
pod: its service account). Run one replica: the ledger that keeps two concurrent creates from
both slipping under a budget lives in the process (docs/decisions/0011). Exit codes: 0 stopped
by a signal, 2 bad options or files.
"""

from __future__ import annotations

import logging
from typing import Any

import click

from kubegpu.cli.common_options import kubeconfig_option
from kubegpu.cli.stop import StopRequest
from kubegpu.cli.types import FiniteFloatRange
from kubegpu.cli.webhook_listener import (
    check_listener,
    listener_context,
    webhook_listener_options,
)

log = logging.getLogger(__name__)


@click.command(
    "claim-budget-webhook",
    context_settings={"auto_envvar_prefix": "KUBEGPU_CLAIM_BUDGET_WEBHOOK"},
)
@webhook_listener_options
@kubeconfig_option("API access (default: in-cluster service account, then $KUBECONFIG).")
@click.option(
    "--pending-seconds",
    type=FiniteFloatRange(min=1, max=600),
    default=30.0,
    show_default=True,
    help="How long an admitted claim the API server's list does not show yet is still "
    "charged: longer than the webhook's timeoutSeconds plus the time to store a claim.",
)
def claim_budget_webhook_command(**options: Any) -> None:
    """Refuse ResourceClaims that would take a namespace past its GPU-memory budget."""
    stop = StopRequest()
    check_listener(options)
    host = options["host"]
    from kubegpu.kube.client import load_kubeconfig
    from kubegpu.roles.claim_budget import start_claim_budget_webhook
    from kubegpu.sharing.claim_budget import BUDGET_LABEL

    config = load_kubeconfig(options["kubeconfig"])  # KubeconfigError: one line, exit 2
    context = listener_context(options, "claim-budget-webhook")
    try:
        server, classes = start_claim_budget_webhook(
            host, options["port"], config, context, pending_s=options["pending_seconds"]
        )
    except OSError as exc:
        click.echo(
            f"kubegpu claim-budget-webhook: cannot listen on {host}:{options['port']}: {exc}",
            err=True,
        )
        raise SystemExit(2) from None
    log.info(
        "claim-budget webhook serving %s/validate: namespaces labelled %s, classes %s",
        server.url,
        BUDGET_LABEL,
        ", ".join(classes),
    )
    try:
        stop.wait()
    finally:
        server.stop()
    log.info("kubegpu claim-budget-webhook stopped")
