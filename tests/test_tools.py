"""tests/tools.py: a missing tool fails under CI and skips elsewhere."""

from __future__ import annotations

import pytest

from tests.tools import missing


def test_a_missing_tool_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="promtool not found, under CI: install it"):
        missing("promtool not found", "install it")


def test_a_missing_tool_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"promtool not found \(install it\)"):
        missing("promtool not found", "install it")
