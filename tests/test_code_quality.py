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


# The layers docs/architecture.md draws (roles -> edges -> core), each an import-linter
# contract in pyproject.toml: a contract dropped or renamed fails here, not silently.
LAYER_CONTRACTS = (
    "The pure core imports no edge",
    "The simulator imports no edge and no I/O library",
    "Policies import no engine",
    "Edges are independent of each other",
    "Edges import no role, command line or tool",
    "lightkube only in the kube edge",
)


def test_every_layer_contract_is_checked_and_kept() -> None:
    result = _run("lint-imports")
    for name in LAYER_CONTRACTS:
        assert f"{name} KEPT" in result.stdout, result.stdout + result.stderr


def test_contracts_hold_without_exceptions() -> None:
    # An ignored import would be an edge quietly reaching into another: the fix is a port.
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert "ignore_imports" not in text
