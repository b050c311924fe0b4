"""Entry point of the ``kubegpu`` command.

Every option of every subcommand can also be set from the environment as ``KUBEGPU_<OPTION>``
(click's ``auto_envvar_prefix``), so flag > env > config file > default holds everywhere.
Subcommands live next to the feature they run and are registered here, lazily, so that
``kubegpu --help`` does not import numpy, grpc or matplotlib.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import click

from kubegpu import __version__
from kubegpu.cli.logs import configure_logging

# name -> "module:attribute" of a click.Command; imported only when the subcommand runs.
SUBCOMMANDS: dict[str, str] = {}


def register(name: str, target: str) -> None:
    SUBCOMMANDS[name] = target


# One line per subcommand: name -> the click command in the feature's own package.
register("device-plugin", "kubegpu.cli.device_plugin:device_plugin")
register("dra-driver", "kubegpu.cli.dra_driver:dra_driver")
register("emulate-node", "kubegpu.testing.emulate_node:emulate_node")
register("simulate", "kubegpu.simulate.command:simulate")
register("trace", "kubegpu.simulate.trace_command:trace")
register("labels", "kubegpu.cli.labels:labels_command")
register("exporter", "kubegpu.cli.exporter:exporter_command")
register("fake-apiserver", "kubegpu.testing.apiserver.cli:fake_apiserver")
register("discover", "kubegpu.inventory.cli:discover")
register("fake-gpu", "kubegpu.inventory.cli:fake_gpu")
register("inspect", "kubegpu.inspect.command:inspect_command")
register("extender", "kubegpu.cli.extender:extender_command")
register("demo", "kubegpu.demo.command:demo_command")
register("peer-webhook", "kubegpu.cli.peer_webhook:peer_webhook_command")


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(SUBCOMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kubegpu")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    help="Least severe log lines shown (on stderr).",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: one line per record for people; json: one JSON object per line for collectors.",
)
def cli(log_level: str, log_format: str) -> None:
    """GPUs as a first-class, shareable, observable Kubernetes resource."""
    configure_logging(getattr(logging, log_level.upper()), json_format=log_format == "json")


def main(argv: list[str] | None = None) -> Any:
    return cli.main(args=argv, prog_name="kubegpu", auto_envvar_prefix="KUBEGPU")


if __name__ == "__main__":
    sys.exit(main())
