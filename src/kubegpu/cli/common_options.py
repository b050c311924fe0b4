"""The options several node roles share, each declared once: the GPU backend, the node agent's
config file, the node's name and the kubeconfig.

Name, type, environment variables and default live here; what the option means for the role
(what the node name is used for, what the role takes from the config file) is the role's own
help text, passed in. A role that reads the value differently has an option of its own: the
extender's ``--config`` is its settings file and its ``--kubeconfig`` one of its settings
(:class:`~kubegpu.config.extender.ExtenderConfig`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from kubegpu.cli.types import SocketPath, input_file

F = TypeVar("F", bound=Callable[..., Any])

# The environment names every role reads for the node agent's config file and the node's name:
# ours, then the ones NVIDIA's plugin and a DaemonSet's downward API use.
CONFIG_ENV = ["KUBEGPU_CONFIG", "CONFIG_FILE"]
NODE_NAME_ENV = ["KUBEGPU_NODE_NAME", "NODE_NAME"]


def _apply(options: tuple[Callable[[F], F], ...], command: F) -> F:
    for option in reversed(options):  # in the order given, in --help too
        command = option(command)
    return command


def gpu_backend_options(*, env: bool = False) -> Callable[[F], F]:
    """``--backend``, ``--fake-gpus`` and ``--fake-control``, in that order in ``--help``.
    ``env``: also read ``KUBEGPU_BACKEND``, ``KUBEGPU_FAKE_GPUS`` and ``KUBEGPU_FAKE_CONTROL``
    (the device plugin's DaemonSet sets them)."""

    def named(name: str) -> list[str] | None:
        return [f"KUBEGPU_{name}"] if env else None

    options = (
        click.option(
            "--backend",
            type=click.Choice(["auto", "nvml", "fake"]),
            default="auto",
            show_default=True,
            envvar=named("BACKEND"),
            help="Where GPUs are read from: auto and nvml use NVML (auto fails clearly without "
            "it); fake uses --fake-gpus.",
        ),
        click.option(
            "--fake-gpus",
            default=None,
            envvar=named("FAKE_GPUS"),
            help="Fake backend: a preset name (e.g. 8xA100-80GB-NVLink) or a YAML spec path.",
        ),
        click.option(
            "--fake-control",
            type=SocketPath(),
            default=None,
            envvar=named("FAKE_CONTROL"),
            help="Fake backend: unix socket for injecting Xids / losing GPUs from outside.",
        ),
    )
    return lambda command: _apply(options, command)


def agent_config_option(help: str) -> Callable[[F], F]:
    """``--config FILE``: the node agent's versioned config file (``version: v1``), as
    ``config_path``; ``help`` says what the role takes from it."""
    return click.option(
        "--config", "config_path", type=input_file(), envvar=CONFIG_ENV, default=None, help=help
    )


def node_name_option(help: str) -> Callable[[F], F]:
    """``--node-name``: this node's name, ``NODE_NAME`` in a DaemonSet; unset, None (each role
    says in ``help`` what it does then)."""
    return click.option("--node-name", envvar=NODE_NAME_ENV, default=None, help=help)


def kubeconfig_option(help: str) -> Callable[[F], F]:
    """``--kubeconfig FILE``: API access for a node role, checked to exist when the options are
    read (a mistyped path is a usage error naming the option, not a traceback); unset, the
    role goes in-cluster or to ``$KUBECONFIG`` as ``help`` says."""
    return click.option(
        "--kubeconfig",
        type=input_file(),
        envvar=["KUBEGPU_KUBECONFIG"],
        default=None,
        help=help,
    )
