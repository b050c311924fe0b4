"""The fake MPS control daemon, installed as an executable for the tests that need one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.enforcement.fakes import install_fake_mps_control


@pytest.fixture
def fake_mps_control(tmp_path: Path) -> Path:
    return install_fake_mps_control(tmp_path)
