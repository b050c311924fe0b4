"""The listener options every admission webhook command has (``--host``, ``--port``,
``--tls-cert-file``, ``--tls-key-file``) and their one check: the API server calls webhooks over
HTTPS only, so the certificate pair is required except on a loopback address (tests)."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from kubegpu.cli.types import input_file
from kubegpu.config.extender import is_loopback

F = TypeVar("F", bound=Callable[..., Any])

_path = input_file(exists=False)  # read with the TLS files' own error (TlsFileError)


def webhook_listener_options(command: F) -> F:
    options = (
        click.option(
            "--host",
            default="127.0.0.1",
            show_default=True,
            help="Address to listen on. In a cluster the API server calls the webhook through "
            "its Service, so there it must be 0.0.0.0 (the chart and deploy/ pass it).",
        ),
        click.option(
            "--port",
            type=click.IntRange(0, 65535),
            default=9443,
            show_default=True,
            help="HTTPS port.",
        ),
        click.option(
            "--tls-cert-file", type=_path, default=None, help="Serving certificate (PEM)."
        ),
        click.option("--tls-key-file", type=_path, default=None, help="Its private key (PEM)."),
    )
    for option in reversed(options):
        command = option(command)
    return command


def check_listener(options: Mapping[str, Any]) -> None:
    """Refuse (usage error, exit 2) half a certificate pair, and plain HTTP off loopback."""
    cert, key = options["tls_cert_file"], options["tls_key_file"]
    if (cert is None) != (key is None):
        raise click.UsageError("--tls-cert-file and --tls-key-file go together")
    host = options["host"]
    if cert is None and not is_loopback(host):
        raise click.UsageError(
            f"--host {host}: the API server calls webhooks over HTTPS only; give "
            "--tls-cert-file and --tls-key-file (plain HTTP is for loopback tests)"
        )


def listener_context(options: Mapping[str, Any], role: str) -> ssl.SSLContext | None:
    """The serving TLS context (None: plain HTTP on loopback); a file that cannot be used
    ends the process with one line naming it, exit code 2."""
    from kubegpu.tls import TlsFileError, server_context

    cert, key = options["tls_cert_file"], options["tls_key_file"]
    if cert is None:
        return None
    try:
        return server_context(cert, key)
    except TlsFileError as exc:
        click.echo(f"kubegpu {role}: {exc}", err=True)
        raise SystemExit(2) from None
