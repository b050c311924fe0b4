"""The errors any subcommand can meet are handled once, around every subcommand: an unusable
kubeconfig is a usage error (exit 2), a file the system refuses a runtime failure (exit 1),
each one line naming the subcommand and the file, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from kubegpu.cli.main import cli
from kubegpu.kube.errors import KubeconfigError


@pytest.fixture
def failing() -> Iterator[None]:
    @click.command("fails-kubeconfig")
    def fails_kubeconfig() -> None:
        raise KubeconfigError("kubeconfig /k.yaml: client-key /k.key: No such file or directory")

    @click.command("fails-os")
    def fails_os() -> None:
        raise PermissionError(13, "Permission denied", "/var/lib/kubegpu/dra/checkpoint.json")

    cli.add_command(fails_kubeconfig)
    cli.add_command(fails_os)
    yield
    for name in ("fails-kubeconfig", "fails-os"):
        cli.commands.pop(name)


def test_a_kubeconfig_error_is_one_line_and_exit_2(failing: None) -> None:
    result = CliRunner().invoke(cli, ["fails-kubeconfig"])
    assert result.exit_code == 2
    assert result.output == (
        "kubegpu fails-kubeconfig: kubeconfig /k.yaml: client-key /k.key: "
        "No such file or directory\n"
    )


def test_an_operating_system_error_is_one_line_naming_the_file_and_exit_1(failing: None) -> None:
    result = CliRunner().invoke(cli, ["fails-os"])
    assert result.exit_code == 1
    assert result.output == (
        "kubegpu fails-os: /var/lib/kubegpu/dra/checkpoint.json: Permission denied\n"
    )
