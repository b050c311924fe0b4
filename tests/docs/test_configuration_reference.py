"""docs/configuration.md is generated from the code; these tests keep it current and honest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kubegpu.cli.config_options import field_at, help_text
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
    from kubegpu.cli.device_plugin import CONFIG_FLAGS

    overrides = gen.agent_overrides()
    fields = {f.path for f in gen.agent_fields()}
    assert {entry.path for entry in CONFIG_FLAGS} <= fields
    for entry in CONFIG_FLAGS:
        assert entry.flag in overrides[entry.path].flags
        assert entry.envvars == list(overrides[entry.path].envvars[: len(entry.envvars)])


def test_each_agent_field_is_described_by_its_model_alone() -> None:
    # The reference says what the field's description says (and, for a section, what its
    # model's docstring says) and nothing from anywhere else: no table of notes in the
    # generator, no comment above the field, no comment in the example config.
    for field in gen.agent_fields():
        info = field_at(AgentConfig, field.path)
        assert field.description == gen.field_description(info), field.path
        assert info.description is None or _same_start(field.description, info.description)


def test_each_extender_setting_is_described_by_a_model_field() -> None:
    from kubegpu.cli.extender import OPTION_FIELDS, RESOURCE_OPTIONS
    from kubegpu.cli.peer_options import PEER_OPTIONS
    from kubegpu.config.extender import ExtenderConfig

    agent_paths = {**RESOURCE_OPTIONS, **PEER_OPTIONS}
    for setting in gen.extender_settings():
        option = setting.key.replace("-", "_")
        if option in OPTION_FIELDS:
            field = OPTION_FIELDS[option]
            expected = help_text(ExtenderConfig.model_fields[field], field)
        else:
            path = agent_paths[f"--{setting.key}"]
            expected = help_text(field_at(AgentConfig, path), path, "agent")
        assert _same_start(setting.description, expected), setting.key


def _same_start(text: str, start: str) -> bool:
    """``text`` begins with ``start``, its first letter capitalised as the reference does."""
    start = start.strip()
    return text[:1].lower() == start[:1].lower() and text[1:].startswith(start[1:])


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("KUBEGPU_DEVICE_ID_STRATEGY", "serial"),
        ("DEVICE_ID_STRATEGY", "serial"),
        ("KUBEGPU_DEVICE_PLUGIN_DEVICE_ID_STRATEGY", "serial"),
        ("MIG_STRATEGY", "hybrid"),
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


def test_every_extender_setting_maps_to_an_option_with_the_same_default() -> None:
    assert gen.extender_defaults_agree() == []
    assert {s.key for s in gen.extender_settings()} >= {"host", "port", "policy", "bind-attempts"}


def test_documented_commands_are_the_registered_ones() -> None:
    for name, target in gen.COMMANDS.items():
        if name in SUBCOMMANDS:  # registrations land through the lead's commits
            assert SUBCOMMANDS[name] == target


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
