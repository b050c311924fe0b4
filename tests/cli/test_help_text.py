"""Every option of every ``kubegpu`` subcommand (and of the group itself) says what it does."""

from __future__ import annotations

import click
import pytest

from kubegpu.cli.main import cli
from kubegpu.inspect.command import kubectl_gpu

CONTEXT = click.Context(cli)


def commands() -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = [("kubegpu", cli), ("kubectl-gpu", kubectl_gpu)]
    for name in cli.list_commands(CONTEXT):
        command = cli.get_command(CONTEXT, name)
        assert command is not None, name
        found.append((name, command))
    return found


@pytest.mark.parametrize(
    ("name", "command"), commands(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_option_has_help_text(name: str, command: click.Command) -> None:
    missing = [
        param.opts[0]
        for param in command.params
        if isinstance(param, click.Option)
        and not param.hidden
        and param.name != "help"
        and not (param.help or "").strip()
    ]
    assert not missing, f"kubegpu {name}: options without help text: {missing}"
    assert (command.help or "").strip(), f"kubegpu {name} has no description"
