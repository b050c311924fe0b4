"""``kubegpu exporter``: the exporter as its own process (command line; the wiring is in
:mod:`kubegpu.roles.exporter`).

Opens the GPU backend (NVML or fake), the metrics source that goes with it, the kubelet's
PodResources socket and the pod log directory, starts :func:`start_exporter` and serves until
SIGTERM/SIGINT. Exit codes: 0 on a requested stop, 1 when the GPU backend cannot be opened,
2 for an invalid config.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import cast

import click

from kubegpu.cli.common_options import agent_config_option, gpu_backend_options, node_name_option
from kubegpu.cli.stop import StopRequest
from kubegpu.cli.types import Folder, SocketPath, seconds
from kubegpu.config.model import MAX_EXPORTER_INTERVAL_S, MAX_READ_TIMEOUT_S, parse_listen_address
from kubegpu.core.backend import GpuBackend

log = logging.getLogger(__name__)


def open_gpu_backend_or_exit(
    kind: str, fake_gpus: str | None, fake_control: Path | None
) -> GpuBackend:
    """The backend, or exit: 2 for settings that are wrong (a fake spec that does not load),
    1 when the node's GPUs cannot be read (NVML missing or failing)."""
    from kubegpu.core.backend import InventoryError

    try:
        from kubegpu.inventory.select import BackendKind, open_backend

        gpu_backend = open_backend(
            cast(BackendKind, kind), fake_gpus=fake_gpus, fake_control=fake_control
        )
        gpu_backend.snapshot()
    except InventoryError as exc:
        log.error("cannot open the GPU backend: %s", exc)
        sys.exit(1)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    return gpu_backend


def parse_listen(value: str) -> tuple[str, int]:
    try:
        return parse_listen_address(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from err


@click.command("exporter")
@click.option(
    "--listen",
    default="127.0.0.1:9400",
    show_default=True,
    callback=lambda _ctx, _param, value: parse_listen(value),
    help="HOST:PORT to serve.",
)
@gpu_backend_options()
@click.option(
    "--pod-resources-socket",
    type=SocketPath(),
    default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
    show_default=True,
    help="The kubelet's PodResources socket; per-pod metrics are absent if unreachable.",
)
@click.option("--no-pod-resources", is_flag=True, help="Do not query the kubelet.")
@click.option(
    "--pod-directory",
    type=click.Choice(["logs", "api"]),
    default="logs",
    show_default=True,
    help="Name pods by UID from the kubelet's log directory, or from the API server (which "
    "also gives each pod's GPU share, needed for kubegpu_pod_gpu_over_share).",
)
@click.option(
    "--pod-log-dir",
    type=Folder(writable=False, must_exist=True, default_may_be_missing=True),
    default=Path("/var/log/pods"),
    show_default=True,
    help="Kubelet pod log root, used to name pods by UID; one named here must exist (the "
    "default may be missing off a node: pods are then not named).",
)
@click.option(
    "--proc",
    type=Folder(writable=False, must_exist=True),
    default=Path("/proc"),
    show_default=True,
    help="procfs root (the host's, with hostPID).",
)
@agent_config_option(
    "The node agent's config file: the health policy (which Xids are critical) comes from it."
)
@node_name_option("Node name for the node label (default: hostname).")
@click.option(
    "--interval",
    type=seconds(maximum=MAX_EXPORTER_INTERVAL_S),
    default=10.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option(
    "--read-timeout",
    type=seconds(maximum=MAX_READ_TIMEOUT_S),
    default=5.0,
    show_default=True,
    help="Longest wait for one NVML read; older data is served meanwhile.",
)
def exporter_command(
    listen: tuple[str, int],
    backend: str,
    fake_gpus: str | None,
    fake_control: Path | None,
    pod_resources_socket: Path,
    no_pod_resources: bool,
    pod_directory: str,
    pod_log_dir: Path,
    proc: Path,
    config_path: Path | None,
    node_name: str | None,
    interval: float,
    read_timeout: float,
) -> None:
    """Serve per-GPU and per-pod GPU metrics for Prometheus on /metrics."""
    # First: a SIGTERM while the backend opens or the port binds stops the exporter cleanly
    # as soon as it serves.
    stop = StopRequest()
    from kubegpu.config.health import health_policy
    from kubegpu.config.load import ConfigError, load_config
    from kubegpu.core.health_feed import HealthFeed
    from kubegpu.exporter.server import ExporterSettings, stale_after
    from kubegpu.roles.exporter import pod_sources, start_node_exporter

    host, port = listen
    node = node_name or socket.gethostname()
    try:
        config = load_config(config_path)
        policy = health_policy(config.health, os.environ)
    except (ConfigError, ValueError) as exc:
        log.error("invalid config: %s", exc)
        sys.exit(2)
    kube_config = None
    if pod_directory == "api":
        from kubegpu.kube.client import KubeconfigError, client_from, load_kubeconfig

        try:  # now, not on the first scrape: the error is the user's to fix at start
            kube_config = load_kubeconfig()
        except KubeconfigError as exc:
            click.echo(f"kubegpu exporter: --pod-directory api needs API access: {exc}", err=True)
            sys.exit(2)
    gpu_backend = open_gpu_backend_or_exit(backend, fake_gpus, fake_control)
    inventory = gpu_backend.snapshot()

    def kube_client() -> object:
        assert kube_config is not None  # pod_sources calls it only for --pod-directory api
        return client_from(kube_config, field_manager="kubegpu-exporter")

    directory, shares = pod_sources(pod_directory, pod_log_dir, node, kube_client)
    settings = ExporterSettings(
        node_name=node,
        listen_host=host,
        listen_port=port,
        interval_s=interval,
        read_timeout_s=read_timeout,
        stale_after_s=stale_after(interval),
        proc=proc,
    )
    log.info(
        "exporter settings: node=%s listen=%s:%d backend=%s gpus=%d pod_resources=%s pods from %s",
        node,
        host,
        port,
        gpu_backend.name,
        len(inventory.gpus),
        "off" if no_pod_resources else pod_resources_socket,
        "the API server" if pod_directory == "api" else pod_log_dir,
    )
    try:
        running = start_node_exporter(
            gpu_backend,
            settings,
            pod_resources_socket=None if no_pod_resources else pod_resources_socket,
            pod_directory=directory,
            shares=shares,
            health=HealthFeed([gpu.uuid for gpu in inventory.gpus], policy=policy),
        )
    except OSError as exc:  # the address is taken or not this machine's
        gpu_backend.close()
        click.echo(
            f"kubegpu exporter: --listen {host}:{port}: cannot listen there "
            f"({exc.strerror or exc})",
            err=True,
        )
        sys.exit(2)
    click.echo(f"serving {running.url}/metrics", err=True)
    try:
        stop.wait()
    finally:
        running.stop()
        gpu_backend.close()
