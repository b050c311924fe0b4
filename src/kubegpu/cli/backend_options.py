"""The GPU backend options the exporter and the labeller share: one definition, one help text.

The device plugin's own take environment variables as well (its DaemonSet sets them), so it
keeps its definitions."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from kubegpu.cli.types import SocketPath

F = TypeVar("F", bound=Callable[..., object])

_OPTIONS = (
    click.option(
        "--backend",
        type=click.Choice(["auto", "nvml", "fake"]),
        default="auto",
        show_default=True,
        help="Where GPUs are read from: auto and nvml use NVML (auto fails clearly without it); "
        "fake uses --fake-gpus.",
    ),
    click.option("--fake-gpus", default=None, help="Fake node: preset name or spec file."),
    click.option(
        "--fake-control",
        type=SocketPath(),
        default=None,
        help="Fake backend: unix socket for injecting Xids / losing GPUs from outside.",
    ),
)


def gpu_backend_options(command: F) -> F:
    """``--backend``, ``--fake-gpus`` and ``--fake-control``, in that order in ``--help``."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command
