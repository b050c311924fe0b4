"""The extender serves on uvloop's event loop (issue 32: a third of a decision's CPU was the
loop's share of the HTTP exchanges on asyncio's own)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import uvloop
from click.testing import CliRunner

from kubegpu.cli import extender as extender_cli
from kubegpu.config.extender import ExtenderConfig


def test_the_extender_runs_on_uvloop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    async def serve(config: ExtenderConfig) -> None:
        seen.append((config.port, asyncio.get_running_loop()))

    monkeypatch.setattr(extender_cli, "_serve", serve)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    result = CliRunner().invoke(
        extender_cli.extender_command,
        ["--kubeconfig", str(kubeconfig), "--port", "18888", "--leader-lease", "none"],
    )
    assert result.exit_code == 0, result.output
    [(port, loop)] = seen
    assert port == 18888
    assert isinstance(loop, uvloop.Loop)
