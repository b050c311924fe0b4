"""The chart's values.yaml, its schema and docs/helm-values.md agree; the generated reference is
current. The chart's rendering is tested with the real helm in e2e/tests/test_07_helm.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.docgen import helm_values as gen

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "kubegpu"
DOC = REPO / "docs" / "helm-values.md"
# Free-form label maps (node selectors): their keys are the admin's labels, so the schema
# checks their shape (label name -> string) instead of listing them.
LABEL_MAPS = {"nodeAgent.nodeSelector", "scheduler.nodeSelector"}


def _paths(value: Any, prefix: str = "") -> set[str]:
    found: set[str] = set()
    if isinstance(value, dict):
        for key, child in value.items():
            path = f"{prefix}.{key}" if prefix else key
            found.add(path)
            if path not in LABEL_MAPS:
                found |= _paths(child, path)
    return found


def _schema_paths(node: dict[str, Any], prefix: str = "") -> set[str]:
    found: set[str] = set()
    for key, child in node.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        found.add(path)
        found |= _schema_paths(child, path)
    return found


def _objects(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)] if node.get("type") == "object" else []
    for key, child in node.get("properties", {}).items():
        found += _objects(child, f"{path}.{key}" if path else key)
    return found


def test_helm_values_md_matches_what_the_generator_writes() -> None:
    current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    assert current == gen.render(CHART), (
        f"docs/helm-values.md is stale; regenerate it from the repository root with: "
        f"{gen.REGENERATE}"
    )


def test_every_key_of_values_yaml_is_documented_and_the_parser_sees_them_all() -> None:
    # An independent walk (PyYAML's), not the generator's own line parser.
    loaded = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    documented = {key.path for key in gen.value_keys(CHART)}
    assert documented == _paths(loaded)
    text = DOC.read_text(encoding="utf-8")
    assert [p for p in sorted(documented) if f"`{p}`" not in text] == []


def test_the_schema_knows_exactly_the_keys_of_values_yaml() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    loaded = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert _schema_paths(schema) == _paths(loaded)


def test_every_schema_object_refuses_unknown_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    for path, node in _objects(schema):
        if path in LABEL_MAPS:
            assert node["additionalProperties"] == {"type": "string"}, path
            assert "propertyNames" in node, path
        else:
            assert node.get("additionalProperties") is False, path or "(top level)"


def test_dra_is_no_node_agent_mode_and_the_mode_points_to_the_dra_driver() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    assert schema["properties"]["nodeAgent"]["properties"]["mode"]["enum"] == ["device-plugin"]
    assert schema["properties"]["draDriver"]["properties"]["enabled"]["type"] == "boolean"
    mode = next(k for k in gen.value_keys(CHART) if k.path == "nodeAgent.mode")
    assert "dra" in mode.description and "draDriver.enabled" in mode.description


def test_a_key_without_a_comment_is_an_error_naming_it(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    values = chart / "values.yaml"
    values.write_text(values.read_text(encoding="utf-8") + "\nundocumented: 1\n")
    with pytest.raises(gen.ValuesDocError, match="undocumented: no comment"):
        gen.value_keys(chart)


def test_a_key_the_schema_lacks_is_an_error_naming_it(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    values = chart / "values.yaml"
    values.write_text(values.read_text(encoding="utf-8") + "\n# Said.\nunknown: 1\n")
    with pytest.raises(gen.ValuesDocError, match=r"unknown: not in values\.schema\.json"):
        gen.value_keys(chart)


def test_check_mode_exits_1_when_stale_and_2_on_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(CHART, tmp_path / gen.CHART)
    (tmp_path / "docs").mkdir()
    assert gen.main(["--check"]) == 1
    assert gen.main(["--write"]) == 0
    assert gen.main(["--check"]) == 0
    values = tmp_path / gen.CHART / "values.yaml"
    values.write_text(values.read_text(encoding="utf-8") + "\nbad: 1\n")
    assert gen.main(["--check"]) == 2
    assert "bad: no comment" in capsys.readouterr().err


# The chart reads the overlays' config files from its own files/ (helm reads nothing outside the
# chart): byte-for-byte copies, so the ConfigMaps and their hashed names are the overlays'.
COPIES = {
    "node-agent-config.yaml": "base/node-agent-config.yaml",
    "dra-driver-config.yaml": "components/dra-driver/dra-driver-config.yaml",
    "peer-compat-node-agent-config.yaml": "components/peer-compat/node-agent-config.yaml",
    "second-scheduler-extender-config.yaml": "overlays/second-scheduler/extender-config.yaml",
    "second-scheduler-kube-scheduler-config.yaml": (
        "overlays/second-scheduler/kube-scheduler-config.yaml"
    ),
    "default-scheduler-extender-config.yaml": "overlays/default-scheduler/extender-config.yaml",
    "default-scheduler-kube-scheduler-config.yaml": (
        "overlays/default-scheduler/kube-scheduler-config.yaml"
    ),
    "kubegpu-rules.yaml": "monitoring/kubegpu-rules.yaml",
}


@pytest.mark.parametrize("name", sorted(COPIES))
def test_chart_files_are_copies_of_the_overlays_files(name: str) -> None:
    assert (CHART / "files" / name).read_bytes() == (REPO / "deploy" / COPIES[name]).read_bytes()


def test_chart_files_are_all_accounted_for() -> None:
    assert sorted(p.name for p in (CHART / "files").iterdir()) == sorted(COPIES)
