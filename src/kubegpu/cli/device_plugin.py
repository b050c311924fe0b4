"""``kubegpu device-plugin``: the node agent's command line.

Reads settings (flag > ``KUBEGPU_*`` / NVIDIA's env names > config file > defaults), checks
them, and has the node agent's composition root (:mod:`kubegpu.roles.node_agent`) open the GPU
backend and run the :class:`~kubegpu.kubelet.agent.Agent` until SIGTERM. Exit codes: 0 on
a requested stop, 1 when the GPU backend cannot be opened or the health endpoints or the
exporter cannot be served, 2 for an invalid config, flag combination, fake GPU spec or
kubeconfig (usage errors exit 2 whatever ``failOnInitError`` says: that setting is about a
node whose GPUs cannot be opened, not about a typo in the invocation).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from kubegpu.cli.types import Folder, SocketPath, input_file

if TYPE_CHECKING:
    from kubegpu.config.model import AgentConfig

log = logging.getLogger(__name__)

DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins"

# option name -> config path it overrides; None means "not given", so the file's value stays.
_OVERRIDES: dict[str, str] = {
    "mig_strategy": "flags.migStrategy",
    "fail_on_init_error": "flags.failOnInitError",
    "health_listen": "flags.healthListen",
    "pass_device_specs": "flags.plugin.passDeviceSpecs",
    "device_list_strategy": "flags.plugin.deviceListStrategy",
    "device_id_strategy": "flags.plugin.deviceIDStrategy",
    "cdi_dir": "flags.plugin.cdiDir",
    "dev_root": "flags.plugin.devRoot",
    "shared_devices_allocation_policy": "flags.plugin.sharedDevicesAllocationPolicy",
    "pre_start_container": "flags.plugin.preStartContainer",
    "gpu_share": "sharing.gpuShare.enabled",
    "pod_resources_socket": "sharing.gpuShare.podResourcesSocket",
    "exporter": "exporter.enabled",
    "exporter_listen": "exporter.listen",
    "exporter_pod_resources_socket": "exporter.podResourcesSocket",
    "exporter_pod_directory": "exporter.podDirectory",
    "exporter_pod_log_dir": "exporter.podLogDir",
    "exporter_proc": "exporter.proc",
}


def _env(name: str, *nvidia: str) -> list[str]:
    # Our prefix first, then the name NVIDIA's plugin reads, so its manifests keep working.
    return [f"KUBEGPU_{name}", *nvidia]


async def _idle(config: AgentConfig, node: str, reason: str, error: Exception) -> None:
    """Wait for SIGTERM/SIGINT, answering the probes as alive and ready meanwhile. Says it is
    idling only once the signal handlers are in: a SIGTERM sent on that line exits 0."""
    from kubegpu.config.model import parse_listen_address
    from kubegpu.kubelet.probes import IdleTarget
    from kubegpu.probes import start_probe_server

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    probes = None
    if config.flags.health_listen:
        address = parse_listen_address(config.flags.health_listen)
        probes = start_probe_server(address, IdleTarget(reason), loop, node=node)
    log.error("node %s: %s; failOnInitError=false, idling until stopped", node, error)
    try:
        await stop.wait()
    finally:
        if probes is not None:
            await loop.run_in_executor(None, probes.stop)


@click.command("device-plugin")
@click.option(
    "--backend",
    type=click.Choice(["auto", "nvml", "fake"]),
    default="auto",
    show_default=True,
    envvar=_env("BACKEND"),
    help="GPU backend; auto uses NVML and fails clearly when it cannot load.",
)
@click.option(
    "--fake-gpus",
    envvar=_env("FAKE_GPUS"),
    help="Fake backend: a preset name (e.g. 8xA100-80GB-NVLink) or a YAML spec path.",
)
@click.option(
    "--fake-control",
    type=SocketPath(),
    envvar=_env("FAKE_CONTROL"),
    help="Fake backend: unix socket for injecting Xids / losing GPUs from outside.",
)
@click.option(
    "--kubelet-dir",
    type=Folder(purpose="create sockets"),
    default=DEFAULT_KUBELET_DIR,
    show_default=True,
    envvar=_env("KUBELET_DIR"),
    help="Directory holding kubelet.sock; our sockets go here too.",
)
@click.option(
    "--config",
    "config_path",
    type=input_file(),
    envvar=_env("CONFIG", "CONFIG_FILE"),
    help="Versioned config file (version: v1); SIGHUP re-reads it.",
)
@click.option(
    "--node-name",
    envvar=_env("NODE_NAME", "NODE_NAME"),
    default="",
    help="This node's name, used in every log line (env NODE_NAME in a DaemonSet).",
)
@click.option(
    "--kubeconfig",
    # exists=True: a mistyped path is a usage error naming the option, not a traceback.
    type=input_file(),
    envvar=_env("KUBECONFIG"),
    help="API access for the inventory annotation and GPU sharing; without it (and outside a "
    "pod) the agent serves whole GPUs only.",
)
@click.option(
    "--gpu-share/--no-gpu-share",
    default=None,
    envvar=_env("GPU_SHARE"),
    help="sharing.gpuShare.enabled: advertise card-level share slots (needs API access).",
)
@click.option(
    "--pod-resources-socket",
    envvar=_env("POD_RESOURCES_SOCKET"),
    help="sharing.gpuShare.podResourcesSocket: the kubelet's PodResources API.",
)
@click.option(
    "--mig-strategy",
    type=click.Choice(["none"]),
    envvar=_env("MIG_STRATEGY", "MIG_STRATEGY"),
    help="flags.migStrategy; only none (MIG GPUs are advertised whole).",
)
@click.option(
    "--fail-on-init-error/--no-fail-on-init-error",
    default=None,
    envvar=_env("FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR"),
    help="If off, a backend that cannot start is logged and the agent idles (non-GPU nodes).",
)
@click.option(
    "--health-listen",
    envvar=_env("HEALTH_LISTEN"),
    help="flags.healthListen: HOST:PORT for /healthz and /readyz (e.g. 0.0.0.0:9401).",
)
@click.option(
    "--pass-device-specs/--no-pass-device-specs",
    default=None,
    envvar=_env("PASS_DEVICE_SPECS", "PASS_DEVICE_SPECS"),
    help="flags.plugin.passDeviceSpecs: also return /dev/nvidia* device specs.",
)
@click.option(
    "--device-list-strategy",
    envvar=_env("DEVICE_LIST_STRATEGY", "DEVICE_LIST_STRATEGY"),
    help="Comma list of envvar, volume-mounts, cdi-annotations, cdi-cri.",
)
@click.option(
    "--device-id-strategy",
    type=click.Choice(["uuid", "index"]),
    envvar=_env("DEVICE_ID_STRATEGY", "DEVICE_ID_STRATEGY"),
    help="flags.plugin.deviceIDStrategy: containers see GPU UUIDs or indices.",
)
@click.option(
    "--cdi-dir", envvar=_env("CDI_DIR"), help="flags.plugin.cdiDir: where the CDI spec goes."
)
@click.option(
    "--dev-root",
    envvar=_env("DEV_ROOT", "NVIDIA_DEV_ROOT"),
    help="flags.plugin.devRoot: host root of the /dev nodes in device specs and CDI.",
)
@click.option(
    "--shared-devices-allocation-policy",
    type=click.Choice(["distributed", "packed"]),
    envvar=_env("SHARED_DEVICES_ALLOCATION_POLICY", "SHARED_DEVICES_ALLOCATION_POLICY"),
    help="Where preferred allocations put time-slicing replicas.",
)
@click.option(
    "--pre-start-container/--no-pre-start-container",
    default=None,
    envvar=_env("PRE_START_CONTAINER"),
    help="Ask the kubelet to call PreStartContainer (a logged no-op).",
)
@click.option(
    "--exporter/--no-exporter",
    default=None,
    envvar=_env("EXPORTER"),
    help="exporter.enabled: also serve the Prometheus exporter's /metrics from this process.",
)
@click.option(
    "--exporter-listen",
    envvar=_env("EXPORTER_LISTEN"),
    help="exporter.listen: HOST:PORT for /metrics and /healthz (e.g. 0.0.0.0:9400).",
)
@click.option(
    "--exporter-pod-resources-socket",
    envvar=_env("EXPORTER_POD_RESOURCES_SOCKET"),
    help='exporter.podResourcesSocket: the kubelet\'s PodResources API ("" = do not ask).',
)
@click.option(
    "--exporter-pod-directory",
    type=click.Choice(["logs", "api"]),
    envvar=_env("EXPORTER_POD_DIRECTORY"),
    help="exporter.podDirectory: name pods from the kubelet's log directory or the API server.",
)
@click.option(
    "--exporter-pod-log-dir",
    envvar=_env("EXPORTER_POD_LOG_DIR"),
    help="exporter.podLogDir: the kubelet's pod log root (pod names by UID).",
)
@click.option(
    "--exporter-proc",
    envvar=_env("EXPORTER_PROC"),
    help="exporter.proc: procfs root holding GPU processes' cgroups (the host's).",
)
def device_plugin(
    backend: str,
    fake_gpus: str | None,
    fake_control: Path | None,
    kubelet_dir: Path,
    config_path: Path | None,
    node_name: str,
    kubeconfig: Path | None,
    **flags: Any,
) -> None:
    """Run the kubelet device plugin (node agent) for this node's GPUs."""
    from kubegpu.config.allocation import GpuAllocationError, check_gpu_allocation
    from kubegpu.config.health import health_policy
    from kubegpu.config.load import ConfigError, load_config, render_config
    from kubegpu.core.backend import InventoryError
    from kubegpu.inventory.select import BackendKind, open_backend
    from kubegpu.kubelet.agent import AgentSettings
    from kubegpu.kubelet.exporter_slot import ExporterServerError
    from kubegpu.kubelet.reload import check_api_access
    from kubegpu.kubelet.resources import PlanError
    from kubegpu.kubelet.socketdir import SocketDirError, check_folder, check_socket_dir
    from kubegpu.probes import ProbeServerError
    from kubegpu.roles.node_agent import KubeconfigError, kube_config_for, run_agent

    node = node_name or "-"
    overrides = {_OVERRIDES[k]: v for k, v in flags.items() if v is not None}
    try:
        config = load_config(config_path, overrides)
        check_gpu_allocation(config, "devicePlugin")
    except (ConfigError, GpuAllocationError) as err:
        click.echo(f"kubegpu device-plugin: {err}", err=True)
        sys.exit(2)
    log.info("node %s: resolved config %s", node, render_config(config))
    try:
        check_socket_dir(kubelet_dir, _socket_names(config))
    except (SocketDirError, OSError) as err:  # OSError: a folder on the way cannot be entered
        click.echo(f"kubegpu device-plugin: --kubelet-dir {_folder_error(err)}", err=True)
        sys.exit(2)
    if config.uses_cdi:
        try:  # the CDI spec is written there at start
            check_folder(Path(config.flags.plugin.cdi_dir), "write the CDI spec")
        except (SocketDirError, OSError) as err:
            click.echo(
                f"kubegpu device-plugin: flags.plugin.cdiDir (--cdi-dir) {_folder_error(err)}",
                err=True,
            )
            sys.exit(2)
    if config.exporter.enabled:
        for where, folder in _exporter_folders(config):
            problem = folder_problem(folder)
            if problem:
                click.echo(f"kubegpu device-plugin: {where} {problem}", err=True)
                sys.exit(2)

    try:
        gpu_backend = open_backend(
            cast(BackendKind, backend), fake_gpus=fake_gpus, fake_control=fake_control
        )
    except ValueError as err:
        # Flags that do not fit together, or a bad fake spec (FakeSpecError): usage, so exit 2
        # and never idle, as `kubegpu discover` does for the same errors.
        click.echo(f"kubegpu device-plugin: {err}", err=True)
        sys.exit(2)
    except (InventoryError, OSError) as err:
        if config.flags.fail_on_init_error:
            click.echo(f"kubegpu device-plugin: {err}", err=True)
            sys.exit(1)
        try:
            reason = f"GPU backend unavailable: {str(err).splitlines()[0] if str(err) else err!r}"
            asyncio.run(_idle(config, node, reason, err))
        except ProbeServerError as probe_err:
            click.echo(f"kubegpu device-plugin: {probe_err}", err=True)
            sys.exit(1)
        sys.exit(0)

    settings = AgentSettings(
        kubelet_dir=kubelet_dir,
        node_name=node_name,
        config_path=config_path,
        overrides=overrides,
        env=dict(os.environ),
    )
    try:
        try:
            health_policy(config.health, settings.env)  # a bad DP_*_HEALTHCHECKS token
            kube_config = kube_config_for(kubeconfig)
            check_api_access(config, api=kube_config is not None, node_name=node_name)
            sys.exit(asyncio.run(run_agent(settings, config, gpu_backend, kube_config)))
        except (PlanError, ValueError) as err:
            click.echo(f"kubegpu device-plugin: invalid config: {err}", err=True)
            sys.exit(2)
        except KubeconfigError as err:
            click.echo(f"kubegpu device-plugin: {err}", err=True)
            sys.exit(2)
        except (ProbeServerError, ExporterServerError) as err:
            click.echo(f"kubegpu device-plugin: {err}", err=True)
            sys.exit(1)
    finally:
        gpu_backend.close()


def _folder_error(err: Exception) -> str:
    if isinstance(err, OSError) and not isinstance(err, ValueError):
        return f"{err.filename}: cannot look there ({err.strerror or err})"
    return str(err)


def _exporter_folders(config: AgentConfig) -> list[tuple[str, Path]]:
    """The folders the in-process exporter reads: the procfs root always; the pod log root
    when pods are named from it and it is not the default (which a machine that is no
    Kubernetes node lacks, as ``kubegpu exporter`` allows)."""
    from kubegpu.config.model import Exporter

    exporter = config.exporter
    found = [("exporter.proc (--exporter-proc)", Path(exporter.proc))]
    default_logs = Exporter.model_fields["pod_log_dir"].default
    if exporter.pod_directory == "logs" and exporter.pod_log_dir != default_logs:
        found.append(("exporter.podLogDir (--exporter-pod-log-dir)", Path(exporter.pod_log_dir)))
    return found


def folder_problem(folder: Path) -> str:
    """Why ``folder`` cannot be read as a folder, or ``""``."""
    try:
        if not folder.exists():
            return f"{folder} does not exist"
        if not folder.is_dir():
            return f"{folder} is not a folder"
    except OSError as err:
        return f"{folder}: cannot look there ({err.strerror or err})"
    if not os.access(folder, os.R_OK | os.X_OK):
        return f"{folder}: no permission to read it"
    return ""


def _socket_names(config: AgentConfig) -> list[str]:
    """kubelet.sock and every socket the agent may make for the configured resources."""
    from kubegpu.kubelet.plugin import KUBELET_SOCKET
    from kubegpu.kubelet.resources import socket_name_for

    names = {r.name for r in config.resources.gpus} | {config.sharing.gpu_share.resource_name}
    for shared in config.sharing.time_slicing.resources:
        names |= {shared.name, shared.rename or f"{shared.name}.shared"}
    return [KUBELET_SOCKET, *(socket_name_for(n) for n in names)]
