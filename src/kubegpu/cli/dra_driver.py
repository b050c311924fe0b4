"""``kubegpu dra-driver``: the DRA kubelet plugin's command line (docs/dra.md).

Checks the options and the config (which must say ``gpuAllocation: dra``) before anything
starts, then has the composition root (:mod:`kubegpu.roles.dra_driver`) run the driver until
SIGTERM. Exit codes: 0 on a requested stop; 1 when the GPU backend cannot be opened, the health
endpoints cannot be served, the first ResourceSlice publish fails, the checkpoint cannot be
trusted or the kubelet refuses the driver; 2 for usage errors (a bad option, config, kubeconfig
or fake GPU spec, or a config that gives this node's GPUs to the device plugin).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn, cast

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

log = logging.getLogger(__name__)

PROG = "kubegpu dra-driver"


def _usage(message: str) -> NoReturn:
    click.echo(f"{PROG}: {message}", err=True)
    sys.exit(2)


@click.command("dra-driver")
@gpu_backend_options()
@click.option(
    "--kubelet-dir",
    # Only its plugins_registry/ and plugins/ subfolders are written (a DaemonSet mounts just
    # those, under a read-only root filesystem): the root itself need not be writable.
    type=Folder(writable=False, purpose="create sockets"),
    default="/var/lib/kubelet",
    show_default=True,
    help="The kubelet's root: the registration socket goes in plugins_registry/, the DRA "
    "socket in plugins/<driver>/ (gpu.kubegpu.io, or gpu.nvidia.com with dra.naming: nvidia).",
)
@click.option(
    "--cdi-dir",
    type=Folder(purpose="write CDI specs"),
    default="/var/run/cdi",
    show_default=True,
    help="Where each prepared claim's CDI spec is written (the runtime's CDI spec folder).",
)
@click.option(
    "--state-dir",
    type=Folder(purpose="keep the checkpoint"),
    default="/var/lib/kubegpu/dra",
    show_default=True,
    help="Where the checkpoint of prepared claims is kept (must survive driver restarts).",
)
@click.option(
    "--dev-root",
    default="/",
    show_default=True,
    help="Host root of the /dev nodes named in CDI specs (a containerised driver's root).",
)
@agent_config_option("Versioned config file (version: v1); must say gpuAllocation: dra.")
@config_option(AgentConfig, "dra.naming", "--dra-naming", from_file=True)
@node_name_option("This node's name (env NODE_NAME in a DaemonSet): names its ResourceSlice pool.")
@kubeconfig_option(
    "API access for ResourceClaims and ResourceSlices; default: in-cluster, else $KUBECONFIG "
    "or ~/.kube/config."
)
@click.option(
    "--health-listen",
    default="",
    help="HOST:PORT for /healthz (event loop and gRPC servers answer) and /readyz (registered "
    "with the kubelet, ResourceSlices published), e.g. 0.0.0.0:9403; empty: not served.",
)
def dra_driver(
    backend: str,
    fake_gpus: str | None,
    fake_control: Path | None,
    kubelet_dir: Path,
    cdi_dir: Path,
    state_dir: Path,
    dev_root: str,
    config_path: Path | None,
    dra_naming: str | None,
    node_name: str | None,
    kubeconfig: Path | None,
    health_listen: str,
) -> None:
    """Run the DRA driver (gpu.kubegpu.io, or gpu.nvidia.com) for this node's GPUs."""
    from kubegpu.config.allocation import GpuAllocationError, check_gpu_allocation
    from kubegpu.config.health import health_policy
    from kubegpu.config.load import ConfigError, load_config, render_config
    from kubegpu.config.model import parse_listen_address
    from kubegpu.core.backend import InventoryError
    from kubegpu.core.dra import DRA_NAMINGS
    from kubegpu.inventory.select import BackendKind, open_backend
    from kubegpu.kube.client import KubeconfigError, load_kubeconfig
    from kubegpu.kubelet.socketdir import SocketDirError, check_folder, check_socket_dir
    from kubegpu.probes import ProbeServerError
    from kubegpu.roles.dra_driver import DraDriverSettings, run_dra_driver, socket_paths

    try:
        overrides = {"dra.naming": dra_naming} if dra_naming is not None else {}
        config = load_config(config_path, overrides)
        check_gpu_allocation(config, "dra")
        health_policy(config.health, os.environ)  # a bad DP_*_HEALTHCHECKS token
    except (ConfigError, GpuAllocationError, ValueError) as err:
        _usage(str(err))
    if not node_name:
        _usage("--node-name (or NODE_NAME) is required: it names this node's ResourceSlice pool")
    health_address = None
    if health_listen:
        try:
            health_address = parse_listen_address(health_listen)
        except ValueError as err:
            _usage(f"--health-listen: {err}")
    workload = None
    if config.dra.steering.workload_file is not None:
        from kubegpu.config.extender import ExtenderConfigError, load_workload

        try:
            workload = load_workload(Path(config.dra.steering.workload_file))
        except ExtenderConfigError as err:
            _usage(f"dra.steering.workloadFile: {err}")
    naming = DRA_NAMINGS[config.dra.naming]
    sockets = socket_paths(kubelet_dir, naming.driver)
    try:
        for path in (sockets.registration, sockets.dra):
            check_socket_dir(path.parent, [path.name])
    except SocketDirError as err:
        _usage(f"--kubelet-dir {err}")
    except OSError as err:  # a folder on the way cannot be entered
        _usage(f"--kubelet-dir {err.filename}: cannot look there ({err.strerror or err})")
    for option, folder, purpose in (
        ("--cdi-dir", cdi_dir, "write CDI specs"),
        ("--state-dir", state_dir, "keep the checkpoint"),
    ):
        try:
            check_folder(folder, purpose)
        except SocketDirError as err:
            _usage(f"{option} {err}")
        except OSError as err:
            _usage(f"{option} {err.filename}: cannot look there ({err.strerror or err})")
    try:
        kube_config = load_kubeconfig(kubeconfig)
    except KubeconfigError as err:
        _usage(f"--kubeconfig: {err}")

    try:
        gpu_backend = open_backend(
            cast(BackendKind, backend), fake_gpus=fake_gpus, fake_control=fake_control
        )
    except ValueError as err:  # flags that do not fit together, a bad fake spec
        _usage(str(err))
    except (InventoryError, OSError) as err:
        click.echo(f"{PROG}: {err}", err=True)
        sys.exit(1)
    log.info("node %s: resolved config %s", node_name, render_config(config))
    settings = DraDriverSettings(
        node_name=node_name,
        kubelet_dir=kubelet_dir,
        cdi_dir=cdi_dir,
        state_dir=state_dir,
        dev_root=dev_root,
        naming=naming,
        env=dict(os.environ),
        steering_workload=workload,
        cpu_milli=(os.cpu_count() or 1) * 1000,
        health_listen=health_address,
    )
    try:
        sys.exit(asyncio.run(run_dra_driver(settings, config, gpu_backend, kube_config)))
    except ProbeServerError as err:
        click.echo(f"{PROG}: --health-listen: {err}", err=True)
        sys.exit(1)
    finally:
        gpu_backend.close()
