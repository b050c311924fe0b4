from __future__ import annotations

from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces" / "openb"


@pytest.fixture(scope="session")
def openb() -> Path:
    if not (TRACES / "paper_allocation_ratio.csv").is_file():
        pytest.skip(f"openb traces not found at {TRACES}")
    return TRACES
