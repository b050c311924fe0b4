"""``kubegpu labels``: label the node from its GPUs (the labeller's command line).

Checks the options and has the labeller's composition root (:mod:`kubegpu.roles.labeller`)
open the GPU backend, judge GPU health and run the :class:`Labeller` against the chosen sink:
an NFD feature file (``nfd``), the Node object through the Kubernetes API (``node``), or
stdout. ``--once`` labels once and exits. Exit codes: 0 done or stopped, 1 the GPU backend
cannot be opened, 2 an invalid config, or the sink cannot be written with ``--once``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
from pathlib import Path

import click

from kubegpu.cli.common_options import agent_config_option, gpu_backend_options, node_name_option
from kubegpu.cli.stop import StopRequest
from kubegpu.cli.types import ONE_DAY_S, HostFile, OutputFile, seconds
from kubegpu.config.model import MAX_REPLICAS
from kubegpu.labels.catalogue import sharing_from_config
from kubegpu.labels.host import DMI_PRODUCT_NAME
from kubegpu.labels.sinks import DEFAULT_NFD_FEATURE_FILE

log = logging.getLogger(__name__)


@click.command("labels")
@gpu_backend_options()
@click.option(
    "--sink",
    type=click.Choice(["nfd", "node", "stdout"]),
    default="stdout",
    show_default=True,
    help="Where the labels go.",
)
@click.option(
    "--nfd-file",
    # Its folder may be missing (NFD makes it), but not lie under a file. The default is
    # checked only when written to: it is a node's path, and the sink may be stdout.
    type=OutputFile(parents=True, check_default=False),
    default=DEFAULT_NFD_FEATURE_FILE,
    show_default=True,
    help="Feature file for --sink nfd.",
)
@node_name_option("Node to label for --sink node (default: hostname).")
@agent_config_option(
    "The node agent's config file: sharing labels and the health policy come from it."
)
@click.option(
    "--sharing-strategy",
    default=None,
    help="Reported as nvidia.com/gpu.sharing-strategy (default: from --config, else none).",
)
@click.option(
    "--replicas",
    type=click.IntRange(0, MAX_REPLICAS),
    default=None,
    help="Replicas per GPU, reported as nvidia.com/gpu.replicas (default: from --config, else 1).",
)
@click.option(
    "--mig-strategy",
    type=click.Choice(["none", "single", "mixed"]),
    default=None,
    help="GFD's MIG labels for this strategy (default: the config's flags.migStrategy, else none).",
)
@click.option(
    "--machine-type-file",
    # GFD's flag and environment variable. The default is missing on machines without DMI (VMs,
    # some Arm servers): the machine is then "unknown", as with GFD.
    type=HostFile(),
    envvar=["KUBEGPU_LABELS_MACHINE_TYPE_FILE", "GFD_MACHINE_TYPE_FILE"],
    default=DMI_PRODUCT_NAME,
    show_default=True,
    help="File naming the machine (DMI product name), reported as nvidia.com/gpu.machine.",
)
@click.option("--once", is_flag=True, help="Label once and exit.")
@click.option(
    "--no-timestamp",
    is_flag=True,
    help="Leave out nvidia.com/gfd.timestamp (the time the other labels last changed).",
)
@click.option(
    "--interval",
    type=seconds(maximum=ONE_DAY_S),
    default=60.0,
    show_default=True,
    help="Seconds between re-asserting the labels (nothing is written if they are still "
    "there); changes are written within --poll.",
)
@click.option(
    "--poll",
    type=seconds(maximum=3600),
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
    mig_strategy: str | None,
    machine_type_file: Path,
    once: bool,
    no_timestamp: bool,
    interval: float,
    poll: float,
) -> None:
    """Label this node with its GPUs' model, memory, count, driver, health and topology."""
    # Before the backend opens: a SIGTERM during start-up stops the labeller once it runs.
    # (--once ends by itself; a SIGTERM keeps its default action there.)
    stop = None if once else StopRequest()
    from kubegpu.cli.exporter import open_gpu_backend_or_exit
    from kubegpu.config.health import health_policy
    from kubegpu.config.load import ConfigError, load_config
    from kubegpu.roles.labeller import KubeconfigError, label_sink, run_labeller

    node = node_name or socket.gethostname()
    try:
        config = load_config(config_path)
        policy = health_policy(config.health, os.environ)
    except (ConfigError, ValueError) as exc:
        log.error("invalid config: %s", exc)
        sys.exit(2)
    sharing = sharing_from_config(config)
    sharing = dataclasses.replace(
        sharing,
        strategy=sharing.strategy if sharing_strategy is None else sharing_strategy,
        replicas=sharing.replicas if replicas is None else replicas,
        mig_strategy=sharing.mig_strategy if mig_strategy is None else mig_strategy,
    )
    try:
        to = label_sink(sink, nfd_file, node)
    except KubeconfigError as exc:
        click.echo(f"kubegpu labels: --sink node needs API access: {exc}", err=True)
        sys.exit(2)
    gpu_backend = open_gpu_backend_or_exit(backend, fake_gpus, fake_control)
    sys.exit(
        run_labeller(
            gpu_backend,
            to,
            sharing,
            policy,
            node_name=node,
            sink_name=sink,
            once=once,
            timestamp=not no_timestamp,
            interval_s=interval,
            poll_s=poll,
            wait_for_stop=stop.wait if stop is not None else lambda: None,
            machine_type_file=machine_type_file,
        )
    )
