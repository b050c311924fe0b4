"""The prepared-claims checkpoint survives a restart and refuses a damaged file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubegpu.core.dra import ClaimRef, PreparedClaim, PreparedDevice
from kubegpu.dra.checkpoint import CHECKPOINT_VERSION, Checkpoint, CheckpointError, checksum

CLAIM = ClaimRef("team-a", "train", "1b7c6a1e-0000-4000-8000-000000000001")
PREPARED = PreparedClaim(
    CLAIM,
    (
        PreparedDevice(
            request_names=("gpu",),
            pool="node-a",
            device="gpu-0",
            cdi_device_ids=("gpu.kubegpu.io/claim=1b7c6a1e-0000-4000-8000-000000000001-gpu-0",),
            share_id="share-1",
        ),
        PreparedDevice(("other",), "node-a", "gpu-1", ("k=x",)),
    ),
)


def test_a_new_instance_reads_what_the_last_one_wrote(tmp_path: Path) -> None:
    path = tmp_path / "state" / "checkpoint.json"
    Checkpoint(path).put(PREPARED)
    assert Checkpoint(path).get(CLAIM.uid) == PREPARED


def test_remove_is_persisted_and_removing_an_unknown_claim_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    first = Checkpoint(path)
    first.put(PREPARED)
    first.remove("never-prepared")
    first.remove(CLAIM.uid)
    assert Checkpoint(path).claims() == {}


def test_file_is_versioned_json_with_a_checksum_of_its_claims(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path).put(PREPARED)
    doc = json.loads(path.read_text())
    assert doc["version"] == CHECKPOINT_VERSION
    assert doc["checksum"] == checksum(doc["claims"])
    assert doc["checksum"].startswith("sha256:")
    assert list(doc["claims"]) == [CLAIM.uid]
    assert path.stat().st_mode & 0o777 == 0o600
    # no temp files left beside it
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]


def test_missing_file_is_an_empty_checkpoint(tmp_path: Path) -> None:
    assert Checkpoint(tmp_path / "absent.json").claims() == {}


def _tamper(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["claims"][CLAIM.uid]["devices"][0]["device"] = "gpu-7"
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.write_text("{not json"), "not JSON"),
        (lambda p: p.write_text(p.read_text()[: len(p.read_text()) // 2]), "not JSON"),
        (_tamper, "checksum mismatch"),
        (
            lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "version": 2})),
            "version 2 is not the supported 1",
        ),
        (lambda p: p.write_text("[]"), "version None"),
    ],
    ids=["garbage", "torn", "edited", "future-version", "not-an-object"],
)
def test_damaged_file_is_refused_with_the_reason(
    tmp_path: Path, damage: object, message: str
) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path).put(PREPARED)
    damage(path)  # type: ignore[operator]
    with pytest.raises(CheckpointError, match=message):
        Checkpoint(path)
