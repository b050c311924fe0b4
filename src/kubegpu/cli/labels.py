"""``kubegpu labels``: label the node from its GPUs (the labeller's command line and root).

Opens the GPU backend, watches GPU health, and runs the :class:`Labeller` against the chosen
sink: an NFD feature file (``nfd``), the Node object through the Kubernetes API (``node``), or
stdout. ``--once`` labels once and exits. Exit codes: 0 done or stopped, 1 the GPU backend
cannot be opened, 2 an invalid config, or the sink cannot be written with ``--once``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import click

from kubegpu.cli.types import POSITIVE_SECONDS
from kubegpu.config.model import DEFAULT_RESOURCE, AgentConfig
from kubegpu.labels.catalogue import GpuShareSummary, SharingSummary
from kubegpu.labels.sinks import DEFAULT_NFD_FEATURE_FILE, LabelSink

log = logging.getLogger(__name__)


def sharing_from_config(config: AgentConfig) -> SharingSummary:
    """The sharing labels from the agent config, saying whether the node's cards are shared.

    GFD's ``nvidia.com/gpu.sharing-strategy`` takes GFD's values: ``mps`` when kubegpu's
    card-level sharing (``sharing.gpuShare``) is on with ``enforcement: mps`` (pods on a card
    run as clients of one MPS daemon, as under GFD's mps); ``time-slicing`` when it is on
    without enforcement (CUDA time-slices the pods' contexts with no isolation, which is what
    GFD's time-slicing means) or when NVIDIA-style ``timeSlicing`` is configured; else ``none``.
    ``nvidia.com/gpu.replicas`` stays the time-slicing replicas of the ``nvidia.com/gpu`` entry
    (else of the first shared resource), 1 without: gpuShare does not replicate the whole-GPU
    resource, its slots are ``kubegpu.io/gpu-share.slots``."""
    shared = config.sharing.time_slicing.resources
    replicas = 1
    strategy = "none"
    if shared:
        chosen = next((r for r in shared if r.name == DEFAULT_RESOURCE), shared[0])
        strategy, replicas = "time-slicing", chosen.replicas
    share = config.sharing.gpu_share
    if not share.enabled:
        return SharingSummary(strategy=strategy, replicas=replicas)
    return SharingSummary(
        strategy="mps" if share.enforcement == "mps" else "time-slicing",
        replicas=replicas,
        gpu_share=GpuShareSummary(
            enforcement=share.enforcement, slots_per_card=share.slots_per_card
        ),
    )


def _sink(kind: str, nfd_file: Path, node_name: str) -> LabelSink:
    from kubegpu.labels.sinks import NfdFeatureFileSink, NodeLabelSink, StdoutSink

    if kind == "nfd":
        return NfdFeatureFileSink(nfd_file)
    if kind == "node":
        from kubegpu.kube.client import KubeconfigError, client_from, load_kubeconfig

        try:  # In-cluster service account, else KUBECONFIG / ~/.kube/config.
            kube_config = load_kubeconfig()
        except KubeconfigError as exc:
            click.echo(f"kubegpu labels: --sink node needs API access: {exc}", err=True)
            sys.exit(2)
        from kubegpu.kube.node_labels import LightkubeNodeLabels

        client = client_from(kube_config, field_manager="kubegpu-labels")
        return NodeLabelSink(LightkubeNodeLabels(client), node_name)
    return StdoutSink(sys.stdout)


def _under_a_folder(path: Path) -> Path:
    """The feature file's folder may be missing (NFD makes it), but not lie under a file."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise click.BadParameter(f"{path}: {folder} is a file, not a folder")
    return path


@click.command("labels")
@click.option(
    "--backend",
    type=click.Choice(["auto", "nvml", "fake"]),
    default="auto",
    show_default=True,
    help="Where GPUs are read from: auto and nvml use NVML (auto fails clearly without it); "
    "fake uses --fake-gpus.",
)
@click.option("--fake-gpus", default=None, help="Fake node: preset name or spec file.")
@click.option(
    "--fake-control",
    type=click.Path(path_type=Path),
    default=None,
    help="Fake backend: unix socket for injecting Xids / losing GPUs from outside.",
)
@click.option(
    "--sink",
    type=click.Choice(["nfd", "node", "stdout"]),
    default="stdout",
    show_default=True,
    help="Where the labels go.",
)
@click.option(
    "--nfd-file",
    type=click.Path(path_type=Path, dir_okay=False),
    callback=lambda _ctx, _param, value: _under_a_folder(value),
    default=DEFAULT_NFD_FEATURE_FILE,
    show_default=True,
    help="Feature file for --sink nfd.",
)
@click.option(
    "--node-name",
    envvar=["KUBEGPU_NODE_NAME", "NODE_NAME"],
    default=None,
    help="Node to label for --sink node (default: hostname).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    envvar=["KUBEGPU_CONFIG", "CONFIG_FILE"],
    help="The node agent's config file: sharing labels and the health policy come from it.",
)
@click.option(
    "--sharing-strategy",
    default=None,
    help="Reported as nvidia.com/gpu.sharing-strategy (default: from --config, else none).",
)
@click.option(
    "--replicas",
    type=click.IntRange(min=0),
    default=None,
    help="Replicas per GPU, reported as nvidia.com/gpu.replicas (default: from --config, else 1).",
)
@click.option("--once", is_flag=True, help="Label once and exit.")
@click.option(
    "--no-timestamp",
    is_flag=True,
    help="Leave out nvidia.com/gfd.timestamp (the time the other labels last changed).",
)
@click.option(
    "--interval",
    type=POSITIVE_SECONDS,
    default=60.0,
    show_default=True,
    help="Seconds between re-asserting the labels (nothing is written if they are still "
    "there); changes are written within --poll.",
)
@click.option(
    "--poll",
    type=POSITIVE_SECONDS,
    default=10.0,
    show_default=True,
    help="Seconds between inventory checks.",
)
def labels_command(
    backend: str,
    fake_gpus: str | None,
    fake_control: Path | None,
    sink: str,
    nfd_file: Path,
    node_name: str | None,
    config_path: Path | None,
    sharing_strategy: str | None,
    replicas: int | None,
    once: bool,
    no_timestamp: bool,
    interval: float,
    poll: float,
) -> None:
    """Label this node with its GPUs' model, memory, count, driver, health and topology."""
    from kubegpu.cli.exporter import open_gpu_backend_or_exit
    from kubegpu.config.health import health_policy
    from kubegpu.config.load import ConfigError, load_config
    from kubegpu.core.health_feed import HealthFeed
    from kubegpu.labels.labeller import Labeller
    from kubegpu.roles.health import judge_health

    node = node_name or socket.gethostname()
    try:
        config = load_config(config_path)
        policy = health_policy(config.health, os.environ)
    except (ConfigError, ValueError) as exc:
        log.error("invalid config: %s", exc)
        sys.exit(2)
    sharing = sharing_from_config(config)
    sharing = SharingSummary(
        strategy=sharing.strategy if sharing_strategy is None else sharing_strategy,
        replicas=sharing.replicas if replicas is None else replicas,
        gpu_share=sharing.gpu_share,
    )
    label_sink = _sink(sink, nfd_file, node)
    gpu_backend = open_gpu_backend_or_exit(backend, fake_gpus, fake_control)
    inventory = gpu_backend.snapshot()
    health = HealthFeed(policy=policy)
    labeller = Labeller(
        inventory=gpu_backend.snapshot,
        sink=label_sink,
        health=health.healthy_map,
        sharing=sharing,
        timestamp=not no_timestamp,
        poll_s=poll,
        resync_s=interval,
    )
    log.info(
        "labels settings: node=%s backend=%s sink=%s gpus=%d once=%s",
        node,
        gpu_backend.name,
        sink,
        len(inventory.gpus),
        once,
    )
    if once:
        try:
            labeller.refresh_once(force=True)
        except Exception as exc:
            log.error("node %s: writing labels failed: %s", node, exc)
            sys.exit(2)
        finally:
            gpu_backend.close()
        return
    health.add_listener(labeller.notify)
    judge_health(health, gpu_backend, inventory, node_name=node)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: labeller.stop())
    thread = threading.Thread(target=labeller.run, name="kubegpu-labeller")
    thread.start()
    thread.join()
    health.close()
    gpu_backend.close()
