"""``kubegpu extender``: the scheduler extender process (composition root).

Every flag is also ``KUBEGPU_EXTENDER_<FLAG>``; ``--config`` reads a versioned YAML file whose
``settings`` give defaults, so flag > environment > file > built-in default. The resolved
configuration is logged once. Exit codes: 0 stopped by a signal, 2 bad configuration.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

import click

from kubegpu.extender.config import ConfigError, ExtenderConfig, load_config_file
from kubegpu.sharing.resources import (
    DEFAULT_GPU_COMPUTE,
    DEFAULT_GPU_MEMORY,
    DEFAULT_SHARE_SLOT,
    DEFAULT_WHOLE_GPU,
    ResourceNames,
)

log = logging.getLogger(__name__)


def _load_file(ctx: click.Context, _param: click.Parameter, value: Path | None) -> Path | None:
    if value is not None:
        try:
            ctx.default_map = {**(ctx.default_map or {}), **load_config_file(value)}
        except ConfigError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


_path = click.Path(path_type=Path, dir_okay=False)


@click.command("extender")
@click.option(
    "--config",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    callback=_load_file,
    is_eager=True,
    expose_value=False,
    help="YAML file (apiVersion kubegpu.io/v1alpha1, kind ExtenderConfig, settings: {...}).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8888, show_default=True)
@click.option(
    "--policy",
    default="kubegpu",
    show_default=True,
    help="binpack, spread, fgd or kubegpu (or any placement engine policy name).",
)
@click.option("--kubeconfig", type=_path, default=None, help="Default: in-cluster, then ~/.kube.")
@click.option("--tls-cert-file", type=_path, default=None)
@click.option("--tls-key-file", type=_path, default=None)
@click.option(
    "--client-ca-file", type=_path, default=None, help="Require client certificates signed by it."
)
@click.option(
    "--allow-insecure-http", is_flag=True, help="Serve plain HTTP on a non-loopback address."
)
@click.option("--max-body-bytes", type=int, default=16 * 1024 * 1024, show_default=True)
@click.option(
    "--workload-file",
    type=_path,
    default=None,
    help="Target workload for fgd/kubegpu (default: every pod in the cluster, CPU-only "
    "ones included, as the simulator does).",
)
@click.option("--workload-refresh-seconds", type=float, default=300.0, show_default=True)
@click.option("--bind-attempts", type=int, default=5, show_default=True)
@click.option(
    "--leader-lease",
    default=None,
    help=(
        "namespace/name of the leader-election Lease of the kube-scheduler that calls this "
        "extender (kube-system/kube-scheduler for the default scheduler). Set it wherever "
        "kube-scheduler runs replicated: bind then refuses unless that Lease's holder is "
        "leader-identity. Unset: every bind is served."
    ),
)
@click.option(
    "--leader-identity",
    default=None,
    help=(
        "Who this extender binds for: a leader-lease holderIdentity equal to it or starting "
        "with it and '_' (kube-scheduler writes its host name, '_' and a UUID). Unset: this host's "
        "name."
    ),
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="IP address of the metrics listener (0.0.0.0 or :: for every address).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help=(
        "Also serve /metrics, /healthz and /readyz, and nothing else, on this port over plain "
        "HTTP (safe: read-only, no verb), for Prometheus and the kubelet's probes. Unset: off."
    ),
)
@click.option("--whole-gpu-resource", default=DEFAULT_WHOLE_GPU, show_default=True)
@click.option("--gpu-memory-resource", default=DEFAULT_GPU_MEMORY, show_default=True)
@click.option("--gpu-compute-resource", default=DEFAULT_GPU_COMPUTE, show_default=True)
@click.option("--share-slot-resource", default=DEFAULT_SHARE_SLOT, show_default=True)
def extender_command(**options: Any) -> None:
    """Serve kube-scheduler's filter, prioritize and bind verbs for GPU pods."""
    try:
        config = ExtenderConfig(
            host=options["host"],
            port=options["port"],
            policy=options["policy"],
            names=ResourceNames(
                options["whole_gpu_resource"],
                options["gpu_memory_resource"],
                options["gpu_compute_resource"],
                options["share_slot_resource"],
            ),
            tls_cert_file=_opt_path(options["tls_cert_file"]),
            tls_key_file=_opt_path(options["tls_key_file"]),
            client_ca_file=_opt_path(options["client_ca_file"]),
            allow_insecure_http=bool(options["allow_insecure_http"]),
            max_body_bytes=int(options["max_body_bytes"]),
            kubeconfig=_opt_path(options["kubeconfig"]),
            workload_file=_opt_path(options["workload_file"]),
            workload_refresh_s=float(options["workload_refresh_seconds"]),
            bind_attempts=int(options["bind_attempts"]),
            leader_lease=options["leader_lease"] or None,
            leader_identity=options["leader_identity"] or None,
            metrics_host=options["metrics_host"],
            metrics_port=options["metrics_port"],
        )
        config.validate()
    except (ConfigError, ValueError) as exc:
        click.echo(f"kubegpu extender: {exc}", err=True)
        raise SystemExit(2) from None
    log.info("configuration: %s", config)
    try:
        asyncio.run(_serve(config))
    except ConfigError as exc:  # a listener that cannot be opened (service.py)
        click.echo(f"kubegpu extender: {exc}", err=True)
        raise SystemExit(2) from None


def _opt_path(value: object) -> Path | None:
    return Path(str(value)) if value else None


async def _serve(config: ExtenderConfig) -> None:
    from kubegpu.extender.service import ExtenderService

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with ExtenderService(config):
        await stop.wait()
    log.info("kubegpu extender stopped")
