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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from kubegpu.cli.common_options import (
    agent_config_option,
    gpu_backend_options,
    kubeconfig_option,
    node_name_option,
)
from kubegpu.cli.config_options import config_option
from kubegpu.cli.types import Folder
from kubegpu.config.model import AgentConfig

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger(__name__)

DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins"


@dataclass(frozen=True)
class ConfigFlag:
    """A flag that overrides one field of the config file. Its help, type and the default
    that applies without it come from the field (:mod:`kubegpu.cli.config_options`)."""

    flag: str  # "--mig-strategy"; a boolean field gets "--no-mig-strategy" as well
    path: str  # the field's YAML path, "flags.migStrategy"
    nvidia_env: str | None = None  # the variable NVIDIA's plugin reads, accepted too

    @property
    def name(self) -> str:
        """click's parameter name: ``mig_strategy``."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def envvars(self) -> list[str]:
        # Our prefix first, then the name NVIDIA's plugin reads, so its manifests keep working.
        own = f"KUBEGPU_{self.name.upper()}"
        return [own, self.nvidia_env] if self.nvidia_env else [own]


# The flag -> config table: every flag that sets a field of the file, in --help's order. Not
# given, a flag is None and the file's value stays.
CONFIG_FLAGS: tuple[ConfigFlag, ...] = (
    ConfigFlag("--gpu-share", "sharing.gpuShare.enabled"),
    ConfigFlag("--pod-resources-socket", "sharing.gpuShare.podResourcesSocket"),
    ConfigFlag("--mig-strategy", "flags.migStrategy", "MIG_STRATEGY"),
    ConfigFlag("--fail-on-init-error", "flags.failOnInitError", "FAIL_ON_INIT_ERROR"),
    ConfigFlag("--health-listen", "flags.healthListen"),
    ConfigFlag("--pass-device-specs", "flags.plugin.passDeviceSpecs", "PASS_DEVICE_SPECS"),
    ConfigFlag("--device-list-strategy", "flags.plugin.deviceListStrategy", "DEVICE_LIST_STRATEGY"),
    ConfigFlag("--device-id-strategy", "flags.plugin.deviceIDStrategy", "DEVICE_ID_STRATEGY"),
    ConfigFlag("--cdi-dir", "flags.plugin.cdiDir"),
    ConfigFlag("--dev-root", "flags.plugin.devRoot", "NVIDIA_DEV_ROOT"),
    ConfigFlag(
        "--shared-devices-allocation-policy",
        "flags.plugin.sharedDevicesAllocationPolicy",
        "SHARED_DEVICES_ALLOCATION_POLICY",
    ),
    ConfigFlag("--pre-start-container", "flags.plugin.preStartContainer"),
    ConfigFlag("--exporter", "exporter.enabled"),
    ConfigFlag("--exporter-listen", "exporter.listen"),
    ConfigFlag("--exporter-pod-resources-socket", "exporter.podResourcesSocket"),
    ConfigFlag("--exporter-pod-directory", "exporter.podDirectory"),
    ConfigFlag("--exporter-pod-log-dir", "exporter.podLogDir"),
    ConfigFlag("--exporter-proc", "exporter.proc"),
)

# click's parameter name -> the config path it overrides.
FLAG_TO_CONFIG: dict[str, str] = {f.name: f.path for f in CONFIG_FLAGS}


def config_flags(command: F) -> F:
    """Every flag of :data:`CONFIG_FLAGS`, made from its field."""
    for entry in reversed(CONFIG_FLAGS):
        command = config_option(
            AgentConfig, entry.path, entry.flag, from_file=True, envvar=entry.envvars
        )(command)
    return command


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
@gpu_backend_options(env=True)
@click.option(
    "--kubelet-dir",
    type=Folder(purpose="create sockets"),
    default=DEFAULT_KUBELET_DIR,
    show_default=True,
    envvar=["KUBEGPU_KUBELET_DIR"],
    help="Directory holding kubelet.sock; our sockets go here too.",
)
@agent_config_option("Versioned config file (version: v1); SIGHUP re-reads it.")
@node_name_option("This node's name, used in every log line (env NODE_NAME in a DaemonSet).")
@kubeconfig_option(
    "API access for the inventory annotation and GPU sharing; without it (and outside a pod) "
    "the agent serves whole GPUs only."
)
@config_flags
def device_plugin(
    backend: str,
    fake_gpus: str | None,
    fake_control: Path | None,
    kubelet_dir: Path,
    config_path: Path | None,
    node_name: str | None,
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
    from kubegpu.kubelet.resources import MigLayoutError, PlanError
    from kubegpu.kubelet.socketdir import SocketDirError, check_folder, check_socket_dir
    from kubegpu.probes import ProbeServerError
    from kubegpu.roles.node_agent import KubeconfigError, kube_config_for, run_agent

    node_name = node_name or ""
    node = node_name or "-"
    overrides = {FLAG_TO_CONFIG[k]: v for k, v in flags.items() if v is not None}
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
        except MigLayoutError as err:
            # The node's state, not the config: NVIDIA's plugin exits 1 on it (a crash loop
            # until the cards are partitioned as the strategy needs).
            click.echo(f"kubegpu device-plugin: error starting plugins: {err}", err=True)
            sys.exit(1)
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
    from kubegpu.kubelet.mig import LONGEST_MIXED_RESOURCE
    from kubegpu.kubelet.plugin import KUBELET_SOCKET
    from kubegpu.kubelet.resources import socket_name_for

    names = {r.name for r in config.resources.gpus} | {config.sharing.gpu_share.resource_name}
    if config.flags.mig_strategy == "mixed":
        names.add(LONGEST_MIXED_RESOURCE)  # the profiles' names are known only from the GPUs
    for shared in config.sharing.time_slicing.resources:
        names |= {shared.name, shared.rename or f"{shared.name}.shared"}
    return [KUBELET_SOCKET, *(socket_name_for(n) for n in names)]
