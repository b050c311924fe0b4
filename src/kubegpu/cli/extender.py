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

from kubegpu.cli.peer_options import peer_compat_options, peers_from_options
from kubegpu.cli.types import input_file, seconds
from kubegpu.config.extender import (
    MAX_BIND_ATTEMPTS,
    MAX_BODY_BYTES,
    MAX_INFLIGHT_BODY_BYTES,
    MAX_REQUEST_TIMEOUT_S,
    MAX_WORKLOAD_REFRESH_S,
    ExtenderConfig,
    ExtenderConfigError,
    load_config_file,
    resolve_leader_lease,
)
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
        known = [p.name for p in ctx.command.params if p.name and p.name != "config"]
        try:
            ctx.default_map = {**(ctx.default_map or {}), **load_config_file(value, known)}
        except ExtenderConfigError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


def settings_keys() -> list[str]:
    """The keys a ``--config`` file's ``settings`` may have: the long option names."""
    return [
        p.name.replace("_", "-") for p in extender_command.params if p.name not in (None, "config")
    ]


# Checked when the extender starts (check_files), after flags, environment and file merge.
_path = input_file(exists=False)


@click.command("extender")
@click.option(
    "--config",
    type=input_file(),
    callback=_load_file,
    is_eager=True,
    expose_value=False,
    help="YAML file (apiVersion kubegpu.io/v1alpha1, kind ExtenderConfig, settings: {...}).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8888,
    show_default=True,
    help="Port of the verbs' listener (0 picks a free one, logged at start).",
)
@click.option(
    "--policy",
    default="kubegpu",
    show_default=True,
    help="binpack, spread, fgd or kubegpu (or any placement engine policy name).",
)
@click.option("--kubeconfig", type=_path, default=None, help="Default: in-cluster, then ~/.kube.")
@click.option(
    "--tls-cert-file",
    type=_path,
    default=None,
    help="Serve HTTPS with this PEM certificate (chain); needs --tls-key-file.",
)
@click.option(
    "--tls-key-file",
    type=_path,
    default=None,
    help="The unencrypted PEM private key of --tls-cert-file.",
)
@click.option(
    "--client-ca-file", type=_path, default=None, help="Require client certificates signed by it."
)
@click.option(
    "--allow-insecure-http", is_flag=True, help="Serve plain HTTP on a non-loopback address."
)
@click.option(
    "--node-cache-capable/--no-node-cache-capable",
    default=True,
    show_default=True,
    help=(
        "Must match nodeCacheCapable in kube-scheduler's extender config. Off, every filter "
        "carries full Node objects (about 15 KiB each: 75 MiB for 5,000 nodes), so the body "
        "limits default larger (max-body-bytes 128 MiB)."
    ),
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(1024, MAX_BODY_BYTES),
    default=None,
    help=(
        "Largest request body accepted; a bigger one is answered 413. Unset: 16 MiB, or "
        "128 MiB with --no-node-cache-capable."
    ),
)
@click.option(
    "--max-inflight-body-bytes",
    type=click.IntRange(1024, MAX_INFLIGHT_BODY_BYTES),
    default=None,
    help=(
        "Bytes of request bodies held at once across all requests; a request that would pass "
        "it is answered 503 at once (kube-scheduler retries the pod). Unset: 64 MiB or "
        "max-body-bytes, whichever is larger."
    ),
)
@click.option(
    "--request-head-timeout-seconds",
    type=seconds(maximum=MAX_REQUEST_TIMEOUT_S),
    default=30.0,
    show_default=True,
    help=(
        "Close a connection that has not sent a whole request head this long after it opened "
        "or was last answered (idle keep-alive connections too)."
    ),
)
@click.option(
    "--request-body-timeout-seconds",
    type=seconds(maximum=MAX_REQUEST_TIMEOUT_S),
    default=30.0,
    show_default=True,
    help="Answer 408 and close when a request body is not complete this long after its head.",
)
@click.option(
    "--workload-file",
    type=_path,
    default=None,
    help="Target workload for fgd/kubegpu (default: every pod in the cluster, CPU-only "
    "ones included, as the simulator does).",
)
@click.option(
    "--workload-refresh-seconds",
    type=seconds(maximum=MAX_WORKLOAD_REFRESH_S),
    default=300.0,
    show_default=True,
    help="How often fgd/kubegpu re-read the cluster's GPU pods as their target workload.",
)
@click.option(
    "--bind-attempts",
    type=click.IntRange(1, MAX_BIND_ATTEMPTS),
    default=5,
    show_default=True,
    help="Tries per bind when the API answers a conflict (409) or is briefly unavailable.",
)
@click.option(
    "--leader-lease",
    default=None,
    help=(
        "Required. namespace/name of the leader-election Lease of the kube-scheduler that "
        "calls this extender (kube-system/kube-scheduler for the default scheduler): bind "
        "refuses unless that Lease's holder is leader-identity. 'none' when exactly one "
        "extender can ever run (two unguarded extenders both bind and over-commit cards)."
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
@click.option(
    "--scheduler-version",
    default=None,
    help=(
        "Version of the kube-scheduler that calls this extender (its image tag, e.g. v1.31.4). "
        "Set, the extender refuses to start when it is newer than the API server or more than "
        "one minor version older (Kubernetes' version skew policy). The second-scheduler "
        "overlay sets it from the kube-scheduler image. Unset: not checked."
    ),
)
@click.option(
    "--whole-gpu-resource",
    default=DEFAULT_WHOLE_GPU,
    show_default=True,
    help="Resource of whole GPUs (the node agent's sharing.gpuShare.wholeResourceName).",
)
@click.option(
    "--gpu-memory-resource",
    default=DEFAULT_GPU_MEMORY,
    show_default=True,
    help="Resource of GPU memory in MiB per card (sharing.gpuShare.memoryResourceName).",
)
@click.option(
    "--gpu-compute-resource",
    default=DEFAULT_GPU_COMPUTE,
    show_default=True,
    help="Resource of GPU compute in thousandths of a card (sharing.gpuShare.computeResourceName).",
)
@click.option(
    "--share-slot-resource",
    default=DEFAULT_SHARE_SLOT,
    show_default=True,
    help="Resource of share slots the node agent advertises (sharing.gpuShare.resourceName).",
)
@peer_compat_options
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
                peers_from_options(options),
            ),
            tls_cert_file=_opt_path(options["tls_cert_file"]),
            tls_key_file=_opt_path(options["tls_key_file"]),
            client_ca_file=_opt_path(options["client_ca_file"]),
            allow_insecure_http=bool(options["allow_insecure_http"]),
            node_cache_capable=bool(options["node_cache_capable"]),
            max_body_bytes=_opt_int(options["max_body_bytes"]),
            max_inflight_body_bytes=_opt_int(options["max_inflight_body_bytes"]),
            request_head_timeout_s=float(options["request_head_timeout_seconds"]),
            request_body_timeout_s=float(options["request_body_timeout_seconds"]),
            kubeconfig=_opt_path(options["kubeconfig"]),
            workload_file=_opt_path(options["workload_file"]),
            workload_refresh_s=float(options["workload_refresh_seconds"]),
            bind_attempts=int(options["bind_attempts"]),
            leader_lease=None,  # resolved below, once the rest is known to be right
            leader_identity=options["leader_identity"] or None,
            metrics_host=options["metrics_host"],
            metrics_port=options["metrics_port"],
            scheduler_version=options["scheduler_version"] or None,
        )
        config.validate()
        lease = resolve_leader_lease(options["leader_lease"])
        config = config.model_copy(update={"leader_lease": lease})
        config.validate()
    except (ExtenderConfigError, ValueError) as exc:
        click.echo(f"kubegpu extender: {exc}", err=True)
        raise SystemExit(2) from None
    log.info("configuration: %r", config)
    try:
        asyncio.run(_serve(config))
    except ExtenderConfigError as exc:  # a file, a listener or a scheduler version (service.py)
        click.echo(f"kubegpu extender: {exc}", err=True)
        raise SystemExit(2) from None


def _opt_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def _opt_path(value: object) -> Path | None:
    return Path(str(value)) if value else None


async def _serve(config: ExtenderConfig) -> None:
    from kubegpu.roles.extender import ExtenderService, check_files

    # Every file first (TLS, kubeconfig, workload), before listening or connecting: a bad one
    # ends the process here with one line naming it.
    check_files(config)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with ExtenderService(config):
        await stop.wait()
    log.info("kubegpu extender stopped")
