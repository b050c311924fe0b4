"""Options that set a config field are made from it, and the options the roles share are
declared once (``kubegpu.cli.config_options``, ``kubegpu.cli.common_options``)."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import click
import pytest

from kubegpu.cli import common_options
from kubegpu.cli.config_options import FileOverrideOption, field_at, help_text, option_type
from kubegpu.cli.device_plugin import CONFIG_FLAGS, FLAG_TO_CONFIG, ConfigFlag, device_plugin
from kubegpu.cli.dra_driver import dra_driver
from kubegpu.cli.exporter import exporter_command
from kubegpu.cli.extender import OPTION_FIELDS, RESOURCE_OPTIONS, extender_command
from kubegpu.cli.labels import labels_command
from kubegpu.cli.peer_options import PEER_OPTIONS
from kubegpu.cli.peer_webhook import peer_webhook_command
from kubegpu.config.extender import ExtenderConfig
from kubegpu.config.model import AgentConfig

CLI = Path(common_options.__file__).resolve().parent


def _options(command: click.Command) -> dict[str, click.Option]:
    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name}


# device-plugin options that set no field of the config file (the file cannot say them).
NOT_IN_THE_FILE = {
    "backend",
    "fake_gpus",
    "fake_control",
    "kubelet_dir",
    "config_path",
    "node_name",
    "kubeconfig",
}


@pytest.mark.parametrize("entry", CONFIG_FLAGS, ids=lambda e: e.flag)
def test_every_flag_in_the_flag_to_config_table_has_its_help_from_the_model(
    entry: ConfigFlag,
) -> None:
    info = field_at(AgentConfig, entry.path)
    param = _options(device_plugin)[entry.name]
    _kind, form = option_type(info)
    assert param.help == help_text(info, entry.path, "key") + form
    assert info.description and " ".join(info.description.replace("`", "").split()) in (
        param.help or ""
    )
    # Not given, the file decides: None, and --help shows the model's default instead.
    assert isinstance(param, FileOverrideOption)
    assert param.default is None
    shown = param.get_help_extra(click.Context(device_plugin))["default"]
    assert shown.endswith("unless --config sets it")
    if typing.get_origin(info.annotation) is typing.Literal:
        assert isinstance(param.type, click.Choice)
        assert list(param.type.choices) == [str(c) for c in typing.get_args(info.annotation)]
    if info.annotation is bool:
        assert param.secondary_opts == [f"--no-{entry.flag.removeprefix('--')}"]
    assert param.envvar == entry.envvars


def test_every_device_plugin_option_is_in_the_table_or_has_no_field() -> None:
    # A new option that sets a config field goes into CONFIG_FLAGS, which makes it from the
    # field; one the file cannot say is added here.
    names = set(_options(device_plugin)) - {"help"}
    assert names == set(FLAG_TO_CONFIG) | NOT_IN_THE_FILE


def test_the_table_names_each_flag_and_field_once() -> None:
    assert len({e.flag for e in CONFIG_FLAGS}) == len(CONFIG_FLAGS)
    assert len({e.path for e in CONFIG_FLAGS}) == len(CONFIG_FLAGS)


@pytest.mark.parametrize(
    ("command", "table"),
    [
        (extender_command, {**RESOURCE_OPTIONS, **PEER_OPTIONS}),
        (peer_webhook_command, PEER_OPTIONS),
    ],
    ids=["extender", "peer-webhook"],
)
def test_options_that_must_equal_an_agent_setting_take_its_text_and_default(
    command: click.Command, table: dict[str, str]
) -> None:
    params = _options(command)
    for flag, path in table.items():
        param = params[flag.removeprefix("--").replace("-", "_")]
        info = field_at(AgentConfig, path)
        assert (param.help or "").startswith(help_text(info, path, "agent")), flag
        default = info.get_default(call_default_factory=True)
        expected = ",".join(default) if isinstance(default, list) else default
        assert param.default == expected, flag


def test_extender_options_take_their_text_and_default_from_extender_config() -> None:
    params = _options(extender_command)
    assert set(OPTION_FIELDS.values()) == set(ExtenderConfig.model_fields) - {"names"}
    for option, field in OPTION_FIELDS.items():
        info = ExtenderConfig.model_fields[field]
        assert params[option].help == help_text(info, field), option
        assert params[option].default == info.default, option


# Each shared option: the roles that take it, and what it must be in every one of them.
SHARED = {
    "config_path": [device_plugin, dra_driver, labels_command, exporter_command],
    "node_name": [device_plugin, dra_driver, labels_command, exporter_command],
    "kubeconfig": [device_plugin, dra_driver],
    "backend": [device_plugin, dra_driver, labels_command, exporter_command],
    "fake_gpus": [device_plugin, dra_driver, labels_command, exporter_command],
    "fake_control": [device_plugin, dra_driver, labels_command, exporter_command],
}


@pytest.mark.parametrize("name", SHARED)
def test_shared_options_are_the_same_option_in_every_role(name: str) -> None:
    found = [_options(command)[name] for command in SHARED[name]]
    first = found[0]
    for param in found[1:]:
        assert param.opts == first.opts
        assert type(param.type) is type(first.type)
        assert param.default == first.default
    if name in ("config_path", "node_name", "kubeconfig"):
        assert all(p.envvar == first.envvar for p in found)


def _declared_flags(path: Path) -> set[str]:
    """The option names a module passes to click.option (or to a helper that makes one)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            for arg in node.args:
                value = arg.value if isinstance(arg, ast.Constant) else None
                if isinstance(value, str) and value.startswith("--") and " " not in value:
                    found.add(value.split("/")[0])
    return found


def test_shared_options_are_declared_only_in_common_options() -> None:
    shared = {"--config", "--node-name", "--kubeconfig", "--backend", "--fake-gpus"}
    shared.add("--fake-control")
    # The extender's --config is its settings file and its --kubeconfig one of its settings.
    own = {"extender.py": {"--config", "--kubeconfig"}}
    elsewhere = {}
    for path in sorted(CLI.glob("*.py")):
        if path.name == "common_options.py":
            continue
        again = (_declared_flags(path) & shared) - own.get(path.name, set())
        if again:
            elsewhere[path.name] = sorted(again)
    assert not elsewhere, f"declare these with kubegpu.cli.common_options: {elsewhere}"
    assert shared <= _declared_flags(CLI / "common_options.py")
