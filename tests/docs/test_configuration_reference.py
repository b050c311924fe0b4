"""docs/configuration.md is generated from the code; these tests keep it current and honest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kubegpu.cli.main import SUBCOMMANDS, cli
from kubegpu.config.load import ConfigError, load_config
from kubegpu.config.model import AgentConfig
from kubegpu.docgen import configuration as gen

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "configuration.md"


def test_configuration_md_matches_what_the_generator_writes() -> None:
    current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    assert current == gen.render(), (
        f"docs/configuration.md is stale; regenerate it from the repository root with: "
        f"{gen.REGENERATE}"
    )


def _paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a dumped config; list items of objects become ``key[]``."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, child in value.items():
            path = f"{prefix}.{key}" if prefix else key
            found.add(path)
            found |= _paths(child, path)
    elif isinstance(value, list):
        for item in value:
            found |= _paths(item, f"{prefix}[]")
    return found


def test_every_key_of_the_default_agent_config_has_a_heading() -> None:
    # An independent walk (the dumped default config), not the generator's own.
    dumped = AgentConfig().model_dump(mode="json", by_alias=True)
    text = DOC.read_text(encoding="utf-8")
    missing = [p for p in sorted(_paths(dumped)) if f"#### `{p}`" not in text]
    assert missing == []


def test_every_agent_field_has_a_type_a_default_and_a_description() -> None:
    for field in gen.agent_fields():
        assert field.description, f"{field.path} has no description"
        if not field.section or field.type != "object":
            assert field.type and field.default, field.path


def test_every_flag_the_device_plugin_maps_to_the_config_is_documented_on_its_field() -> None:
    from kubegpu.cli.device_plugin import _OVERRIDES

    overrides = gen.agent_overrides()
    fields = {f.path for f in gen.agent_fields()}
    assert set(_OVERRIDES.values()) <= fields
    for option, path in _OVERRIDES.items():
        flag = "--" + option.replace("_", "-")
        assert flag in overrides[path].flags


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("KUBEGPU_DEVICE_ID_STRATEGY", "serial"),
        ("DEVICE_ID_STRATEGY", "serial"),
        ("KUBEGPU_DEVICE_PLUGIN_DEVICE_ID_STRATEGY", "serial"),
        ("MIG_STRATEGY", "mixed"),
        ("KUBEGPU_GPU_SHARE", "perhaps"),
        ("SHARED_DEVICES_ALLOCATION_POLICY", "random"),
    ],
)
def test_documented_environment_variables_reach_the_device_plugin(env: str, value: str) -> None:
    documented = {e for f in gen.agent_fields() if f.override for e in f.override.envvars}
    assert env in documented
    # An invalid value is refused by click while parsing, before any backend is opened:
    # proof that the variable is read under exactly this name.
    result = CliRunner().invoke(
        cli, ["device-plugin", "--backend", "fake"], env={env: value}, auto_envvar_prefix="KUBEGPU"
    )
    assert result.exit_code == 2, result.output
    assert "Invalid value" in result.output


@pytest.mark.parametrize("rule", gen.AGENT_RULES, ids=lambda r: r.fragment)
def test_each_documented_agent_rule_refuses_its_bad_input(rule: gen.Rule, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(rule.bad_input), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert rule.fragment in str(caught.value)


@pytest.mark.parametrize("rule", gen.EXTENDER_RULES, ids=lambda r: r.fragment)
def test_each_documented_extender_rule_refuses_its_bad_input(
    rule: gen.Rule, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubegpu.cli import extender as extender_cli

    async def must_not_serve(config: object) -> None:
        raise AssertionError(f"the extender accepted {rule.bad_input!r}")

    monkeypatch.setattr(extender_cli, "_serve", must_not_serve)
    args = rule.bad_input
    if args is None:
        settings = tmp_path / "extender.yaml"
        settings.write_text("apiVersion: v1\nkind: ConfigMap\nsettings: {}\n", encoding="utf-8")
        args = ["--config", str(settings)]
    result = CliRunner().invoke(extender_cli.extender_command, args)
    assert result.exit_code == 2, result.output
    assert rule.fragment in result.output


def test_notes_name_only_settings_that_exist() -> None:
    paths = {f.path for f in gen.agent_fields()}
    assert set(gen.AGENT_NOTES) <= paths
    keys = {s.key for s in gen.extender_settings()}
    assert set(gen.EXTENDER_NOTES) <= keys


def test_every_extender_setting_maps_to_an_option_with_the_same_default() -> None:
    assert gen.extender_defaults_agree() == []
    assert {s.key for s in gen.extender_settings()} >= {"host", "port", "policy", "bind-attempts"}


def test_documented_commands_are_the_registered_ones() -> None:
    for name, target in gen.COMMANDS.items():
        if name in SUBCOMMANDS:  # registrations land through the lead's commits
            assert SUBCOMMANDS[name] == target


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a:\n  b: 1  # one\n", {"a.b": "one"}),
        ("a:\n  - x: 1   # first\n    y: 2   # second\n", {"a[].x": "first", "a[].y": "second"}),
        ('a: "#not" # real\n', {"a": "real"}),
        ("a: 1  # example: skip me\n", {}),
        ("a:\n  b: 1\nc: 2 # top\n", {"c": "top"}),
    ],
    ids=["nested", "list-items", "hash-in-quotes", "example-skipped", "dedent"],
)
def test_example_config_comments_are_keyed_by_yaml_path(
    text: str, expected: dict[str, str]
) -> None:
    assert gen.example_comments(text) == expected


def test_check_mode_names_the_command_when_the_file_is_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "configuration.md"
    out.write_text("old\n", encoding="utf-8")
    assert gen.main(["--check", "--output", str(out)]) == 1
    assert gen.REGENERATE in capsys.readouterr().err
    assert gen.main(["--write", "--output", str(out)]) == 0
    assert gen.main(["--check", "--output", str(out)]) == 0


def test_recover_after_healthy_checks_says_how_long_a_check_is() -> None:
    from kubegpu.inventory.health import HEALTH_CHECK_S

    section = DOC.read_text(encoding="utf-8").split("#### `health.recoverAfterHealthyChecks`")[1]
    description = section.split("####")[0]
    assert f"{HEALTH_CHECK_S:g} s" in description
