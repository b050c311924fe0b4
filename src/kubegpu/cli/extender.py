"""``kubegpu extender``: the scheduler extender process (composition root).

Every flag is also ``KUBEGPU_EXTENDER_<FLAG>``; ``--config`` reads a versioned YAML file whose
``settings`` give defaults, so flag > environment > file > built-in default. The resolved
configuration is logged once. Exit codes: 0 stopped by a signal, 2 bad configuration.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import uvloop

from kubegpu.cli.config_options import config_option, help_text
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
from kubegpu.config.model import AgentConfig
from kubegpu.sharing.resources import ResourceNames

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


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

# click's parameter name -> the ExtenderConfig field it sets (see _setting).
OPTION_FIELDS: dict[str, str] = {}


def _setting(field: str, flag: str, **kwargs: Any) -> Callable[[F], F]:
    """The option for ``ExtenderConfig.<field>``: its help is the field's description and its
    default the field's default, so the model declares both once; the type (with the bounds
    the extender checks) is the option's."""
    info = ExtenderConfig.model_fields[field]
    name = flag.split("/")[0].removeprefix("--").replace("-", "_")
    OPTION_FIELDS[name] = field
    return click.option(flag, default=info.default, help=help_text(info, field), **kwargs)


# The resource-name options and the node agent's setting each must equal (help and default
# from that setting's field).
RESOURCE_OPTIONS: dict[str, str] = {
    "--whole-gpu-resource": "sharing.gpuShare.wholeResourceName",
    "--gpu-memory-resource": "sharing.gpuShare.memoryResourceName",
    "--gpu-compute-resource": "sharing.gpuShare.computeResourceName",
    "--share-slot-resource": "sharing.gpuShare.resourceName",
}


def resource_name_options(command: F) -> F:
    for flag, path in reversed(RESOURCE_OPTIONS.items()):
        command = config_option(AgentConfig, path, flag, from_file=False, cite="agent")(command)
    return command


@click.command("extender")
@click.option(
    "--config",
    type=input_file(),
    callback=_load_file,
    is_eager=True,
    expose_value=False,
    help="YAML file (apiVersion kubegpu.io/v1alpha1, kind ExtenderConfig, settings: {...}).",
)
@_setting("host", "--host", show_default=True)
@_setting("port", "--port", type=click.IntRange(0, 65535), show_default=True)
@_setting("policy", "--policy", show_default=True)
@_setting("kubeconfig", "--kubeconfig", type=_path)
@_setting("tls_cert_file", "--tls-cert-file", type=_path)
@_setting("tls_key_file", "--tls-key-file", type=_path)
@_setting("client_ca_file", "--client-ca-file", type=_path)
@_setting("allow_insecure_http", "--allow-insecure-http", is_flag=True)
@_setting("node_cache_capable", "--node-cache-capable/--no-node-cache-capable", show_default=True)
@_setting("max_body_bytes", "--max-body-bytes", type=click.IntRange(1024, MAX_BODY_BYTES))
@_setting(
    "max_inflight_body_bytes",
    "--max-inflight-body-bytes",
    type=click.IntRange(1024, MAX_INFLIGHT_BODY_BYTES),
)
@_setting(
    "request_head_timeout_s",
    "--request-head-timeout-seconds",
    type=seconds(maximum=MAX_REQUEST_TIMEOUT_S),
    show_default=True,
)
@_setting(
    "request_body_timeout_s",
    "--request-body-timeout-seconds",
    type=seconds(maximum=MAX_REQUEST_TIMEOUT_S),
    show_default=True,
)
@_setting("workload_file", "--workload-file", type=_path)
@_setting(
    "workload_refresh_s",
    "--workload-refresh-seconds",
    type=seconds(maximum=MAX_WORKLOAD_REFRESH_S),
    show_default=True,
)
@_setting(
    "dra_naming",
    "--dra-naming",
    type=click.Choice(["kubegpu", "nvidia"]),
    show_default=True,
)
@_setting("preemption", "--preemption/--no-preemption", show_default=True)
@_setting(
    "bind_attempts",
    "--bind-attempts",
    type=click.IntRange(1, MAX_BIND_ATTEMPTS),
    show_default=True,
)
@_setting("leader_lease", "--leader-lease")
@_setting("leader_identity", "--leader-identity")
@_setting("metrics_host", "--metrics-host", show_default=True)
@_setting("metrics_port", "--metrics-port", type=click.IntRange(0, 65535))
@_setting("scheduler_version", "--scheduler-version")
@resource_name_options
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
            dra_naming=options["dra_naming"],
            preemption=bool(options["preemption"]),
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
        # uvloop's event loop: the verbs are many small HTTP exchanges, and on asyncio's own
        # loop reading and answering them was a third of the extender's CPU per decision.
        # With uvloop a decision at openb took 6-8 % less CPU (medians of five runs each,
        # issue 32, docs/benchmarks.md).
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(config))
    except ExtenderConfigError as exc:  # a file, a listener or a scheduler version (service.py)
        click.echo(f"kubegpu extender: {exc}", err=True)
        raise SystemExit(2) from None


def _opt_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def _opt_path(value: object) -> Path | None:
    return Path(str(value)) if value else None


async def _serve(config: ExtenderConfig) -> None:
    from kubegpu.extender.collector import collect_between_verbs
    from kubegpu.roles.extender import ExtenderService, check_files

    # Every file first (TLS, kubeconfig, workload), before listening or connecting: a bad one
    # ends the process here with one line naming it.
    check_files(config)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with ExtenderService(config) as service:
        synced = asyncio.ensure_future(service.view.synced.wait())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait((synced, stopped), return_when=asyncio.FIRST_COMPLETED)
        if synced.done():
            await collect_between_verbs(service.scheduler.verbs_idle, stopped)
        synced.cancel()
        await stopped
    log.info("kubegpu extender stopped")
