"""The label sets of the shipped fake presets, compared with golden files.

To regenerate after a deliberate change to the catalogue, run::

    KUBEGPU_UPDATE_GOLDEN=1 .venv/bin/pytest tests/labels/test_golden.py

and review the diff of ``tests/labels/golden/*.json`` before committing it. The clock is fixed,
so the timestamp label is stable.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.labels.catalogue import (
    SharingSummary,
    compute_labels,
    is_valid_label_key,
    is_valid_label_value,
)

GOLDEN = Path(__file__).parent / "golden"
PRESETS = ["8xA100-80GB-NVLink", "4xT4", "2xV100-2xT4"]
FIXED_NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def labels_for(preset: str) -> dict[str, str]:
    return compute_labels(
        resolve_fake_spec(preset).inventory,
        health={},
        sharing=SharingSummary(strategy="none", replicas=1),
        now=FIXED_NOW,
    )


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_labels_match_the_golden_file(preset: str) -> None:
    labels = labels_for(preset)
    path = GOLDEN / f"{preset}.json"
    if os.environ.get("KUBEGPU_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(labels, indent=2, sort_keys=True) + "\n")
    assert labels == json.loads(path.read_text())


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_label_is_a_valid_kubernetes_label(preset: str) -> None:
    for key, value in labels_for(preset).items():
        assert is_valid_label_key(key), key
        assert is_valid_label_value(value), (key, value)
