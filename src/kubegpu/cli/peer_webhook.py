"""``kubegpu peer-webhook``: the mutating admission webhook of the peer compat modes.

Every flag is also ``KUBEGPU_PEER_WEBHOOK_<FLAG>``. The API server calls webhooks over HTTPS
only, so ``--tls-cert-file``/``--tls-key-file`` are required except on a loopback address
(tests). It listens on loopback unless told otherwise: in a cluster the API server reaches it
through its Service, so the manifests pass ``--host=0.0.0.0``. Exit codes: 0 stopped by a
signal (at any moment, start-up included), 2 bad options or files.
"""

from __future__ import annotations

import logging
from typing import Any

import click

from kubegpu.cli.peer_options import peer_compat_options, peers_from_options
from kubegpu.cli.stop import StopRequest
from kubegpu.cli.webhook_listener import (
    check_listener,
    listener_context,
    webhook_listener_options,
)
from kubegpu.sharing.resources import DEFAULT_SHARE_SLOT, ResourceNames

log = logging.getLogger(__name__)


@click.command("peer-webhook", context_settings={"auto_envvar_prefix": "KUBEGPU_PEER_WEBHOOK"})
@webhook_listener_options
@click.option(
    "--share-slot-resource",
    default=DEFAULT_SHARE_SLOT,
    show_default=True,
    help="The slot resource added to peer containers (sharing.gpuShare.resourceName).",
)
@click.option(
    "--scheduler-name",
    default="",
    help="Send peer pods to this scheduler (e.g. kubegpu-scheduler); empty: leave it.",
)
@peer_compat_options
def peer_webhook_command(**options: Any) -> None:
    """Make Volcano- and Aliyun-style GPU pods kubegpu shares at admission."""
    # First, before the slow imports and the TLS files: a SIGTERM from here on is a clean stop.
    stop = StopRequest()
    peers = peers_from_options(options)
    if not peers:
        raise click.BadParameter("name at least one compat mode", param_hint="--peer-compat")
    try:
        names = ResourceNames(share_slot=options["share_slot_resource"], peers=peers)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--share-slot-resource") from None
    check_listener(options)
    host = options["host"]
    from kubegpu.webhook.server import serve_webhook

    context = listener_context(options, "peer-webhook")
    try:
        server = serve_webhook(
            host, options["port"], names, context, scheduler_name=options["scheduler_name"]
        )
    except OSError as exc:
        click.echo(
            f"kubegpu peer-webhook: cannot listen on {host}:{options['port']}: {exc}", err=True
        )
        raise SystemExit(2) from None
    log.info(
        "peer webhook serving %s/mutate for %s (slot %s%s)",
        server.url,
        ", ".join(f"{p.memory_resource} [{p.name}, {p.unit}]" for p in peers),
        names.share_slot,
        f", scheduler {options['scheduler_name']}" if options["scheduler_name"] else "",
    )
    try:
        stop.wait()  # returns at once when the signal came during start-up
    finally:
        server.stop()
    log.info("kubegpu peer-webhook stopped")
