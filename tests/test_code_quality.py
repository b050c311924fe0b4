"""The repository's own checks run as tests, so the README's one test command covers them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = BIN / tool
    if not exe.exists():
        found = shutil.which(tool)
        if found is None:
            pytest.fail(f"{tool} is not installed; install the package with its [test] extra")
        exe = Path(found)
    return subprocess.run(
        [str(exe), *args], cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )


def test_ruff_lint_is_clean() -> None:
    result = _run("ruff", "check", "src", "tests", "bench", "e2e")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = _run("ruff", "format", "--check", "src", "tests", "bench", "e2e")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(600)
def test_mypy_strict_is_clean() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_core_imports_no_edge() -> None:
    result = _run("lint-imports")
    assert result.returncode == 0, result.stdout + result.stderr
