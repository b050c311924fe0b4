"""What a SIGHUP reload changes, judged before the agent stops anything (kubelet.reload)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubegpu.config import load_config
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.kubelet.reload import ReloadRejected, read_change

INVENTORY = resolve_fake_spec("4xT4").inventory


def test_an_unchanged_config_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    running = load_config(path)
    assert read_change(running, path, {}, INVENTORY, api=False, node_name="n1") is None


def test_a_changed_block_restarts_only_its_part(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    running = load_config(path)
    path.write_text('version: v1\nexporter:\n  enabled: true\n  listen: "127.0.0.1:9400"\n')
    change = read_change(running, path, {}, INVENTORY, api=False, node_name="n1")
    assert change is not None
    assert (change.exporter, change.health, change.probes) == (True, False, False)
    assert change.config.exporter.enabled
    assert [p.resource_name for p in change.plans] == ["nvidia.com/gpu"]


def test_a_config_needing_api_access_the_agent_lacks_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    running = load_config(path)
    path.write_text("version: v1\nsharing:\n  gpuShare:\n    enabled: true\n")
    with pytest.raises(ReloadRejected, match=r"sharing\.gpuShare\.enabled needs API access"):
        read_change(running, path, {}, INVENTORY, api=False, node_name="n1")


def test_a_config_that_does_not_load_is_rejected_naming_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    running = load_config(path)
    path.write_text("version: v1\nflags:\n  migStrategy: hybrid\n")
    with pytest.raises(ReloadRejected, match="migStrategy"):
        read_change(running, path, {}, INVENTORY, api=False, node_name="n1")
