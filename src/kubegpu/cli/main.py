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
from typing import IO, Any

import click

from kubegpu import __version__
from kubegpu.cli.logs import configure_logging

log = logging.getLogger(__name__)

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
register("claim-budget-webhook", "kubegpu.cli.claim_budget_webhook:claim_budget_webhook_command")


class OneLineFailure(click.ClickException):
    """A failure reported as one line, ``kubegpu SUBCOMMAND: message``, without click's usage
    lines: the input was well formed, what it names cannot be used. Exit 1: a runtime
    failure."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(self.message, err=True, file=file)


class OneLineUsageFailure(OneLineFailure):
    """As :class:`OneLineFailure`, for what the user must fix in the invocation: exit 2."""

    exit_code = 2


class LazyGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        """Every subcommand, with the errors any of them can meet handled once, here: a
        kubeconfig that cannot be used (a usage error, exit 2) and a file or folder the system
        refuses (exit 1) end as one line naming the file, never as a traceback."""
        try:
            return super().invoke(ctx)
        except Exception as exc:
            # Not imported here: a role that never reads a kubeconfig (a node agent without
            # API access) must not load the kube edge, and then none can have been raised.
            errors = sys.modules.get("kubegpu.kube.errors")
            if errors is not None and isinstance(exc, errors.KubeconfigError):
                log.debug("kubeconfig refused", exc_info=True)
                raise OneLineUsageFailure(f"{_prog(ctx)}: {exc}") from None
            if isinstance(exc, OSError):
                log.debug("operating system error", exc_info=True)
                where = f"{exc.filename}: " if exc.filename else ""
                raise OneLineFailure(f"{_prog(ctx)}: {where}{exc.strerror or exc}") from None
            raise

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


def _prog(ctx: click.Context) -> str:
    sub = ctx.invoked_subcommand
    return f"kubegpu {sub}" if sub else "kubegpu"


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
