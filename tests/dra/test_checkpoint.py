"""The prepared-claims checkpoint survives a restart and refuses, with one line naming the file
and what is wrong, any file it did not write: damaged, of another type, size or encoding, nested
past the parser, or with an entry of the wrong shape under a valid checksum. The driver as a
process on such files: tests/dra/test_dra_driver_process.py."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.dra import ClaimRef, PreparedClaim, PreparedDevice
from kubegpu.dra import checkpoint as checkpoint_module
from kubegpu.dra.checkpoint import (
    CHECKPOINT_VERSION,
    MAX_CHECKPOINT_BYTES,
    Checkpoint,
    CheckpointError,
    checksum,
)

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
    Checkpoint(path).update(put=[PREPARED])
    assert Checkpoint(path).get(CLAIM.uid) == PREPARED


def test_remove_is_persisted_and_removing_an_unknown_claim_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    first = Checkpoint(path)
    first.update(put=[PREPARED])
    first.update(remove=["never-prepared"])
    first.update(remove=[CLAIM.uid])
    assert Checkpoint(path).claims() == {}


def test_file_is_versioned_json_with_a_checksum_of_its_claims(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path).update(put=[PREPARED])
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
    Checkpoint(path).update(put=[PREPARED])
    damage(path)  # type: ignore[operator]
    with pytest.raises(CheckpointError, match=message):
        Checkpoint(path)


def many(count: int) -> list[PreparedClaim]:
    return [
        PreparedClaim(
            ClaimRef("team-a", f"c{i}", f"2b7c6a1e-0000-4000-8000-{i:012d}"),
            (PreparedDevice(("gpu",), "node-a", "gpu-0", (f"k=c{i}",)),),
        )
        for i in range(count)
    ]


def test_one_update_of_many_claims_is_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[int] = []
    real = checkpoint_module.write_atomically

    def counted(path: Path, text: str, mode: int = 0o600) -> None:
        writes.append(len(text))
        real(path, text, mode)

    monkeypatch.setattr(checkpoint_module, "write_atomically", counted)
    path = tmp_path / "checkpoint.json"
    checkpoint = Checkpoint(path)
    claims = many(300)
    checkpoint.update(put=claims)
    assert len(writes) == 1
    checkpoint.update(remove=[c.claim.uid for c in claims[:299]] + ["never-prepared"])
    assert len(writes) == 2
    checkpoint.update(remove=["never-prepared"])  # nothing changes: nothing written
    assert len(writes) == 2
    assert list(Checkpoint(path).claims()) == [claims[299].claim.uid]


def test_a_write_past_the_size_a_reader_accepts_is_refused_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint = Checkpoint(path)
    checkpoint.update(put=[PREPARED])
    monkeypatch.setattr(checkpoint_module, "MAX_CHECKPOINT_BYTES", 2000)
    with pytest.raises(CheckpointError, match=f"{path}: 11 claims would take more than the 2000"):
        checkpoint.update(put=many(10))
    assert checkpoint.claims() == {CLAIM.uid: PREPARED}
    assert Checkpoint(path).claims() == {CLAIM.uid: PREPARED}


# -- files it did not write -----------------------------------------------------------------


def refused(path: Path) -> str:
    """The one-line message a file at ``path`` is refused with."""
    with pytest.raises(CheckpointError) as raised:
        Checkpoint(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


def test_bytes_that_are_not_utf8_are_refused_naming_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(b'{"version": 1, "claims": {"\xff\xfe": 1}}')
    assert "not UTF-8 text (byte 0xff at offset 27)" in refused(path)


def test_json_nested_100k_levels_deep_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert "JSON nested too deeply" in refused(path)
    path.write_text('{"version": 1, "checksum": "x", "claims": ' + '{"a": ' * 100_000)
    assert "JSON nested too deeply" in refused(path)


def test_a_number_the_parser_refuses_is_not_json(tmp_path: Path) -> None:
    # Python refuses to convert integers of more than 4300 digits, with a ValueError.
    path = tmp_path / "checkpoint.json"
    path.write_text('{"version": ' + "1" * 5000 + "}")
    assert "not JSON" in refused(path)


def test_a_directory_at_the_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.mkdir()
    assert refused(path) == f"{path}: is a directory, not a checkpoint file"


@pytest.mark.timeout(30)
def test_a_fifo_at_the_path_is_refused_without_opening_it(tmp_path: Path) -> None:
    # Opening a FIFO for reading blocks until a writer comes: the driver never served.
    path = tmp_path / "checkpoint.json"
    os.mkfifo(path)
    assert refused(path) == f"{path}: is a FIFO, not a checkpoint file"


def test_a_socket_at_the_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        assert refused(path) == f"{path}: is a socket, not a checkpoint file"


def test_a_file_past_the_size_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    with path.open("wb") as f:
        f.truncate(MAX_CHECKPOINT_BYTES + 1)  # sparse: no disk, but that size to a reader
    message = refused(path)
    assert f"is {MAX_CHECKPOINT_BYTES + 1} bytes, more than the {MAX_CHECKPOINT_BYTES}" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads anything")
def test_a_file_it_may_not_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path).update(put=[PREPARED])
    path.chmod(0)
    assert "cannot read it: Permission denied" in refused(path)


def _entry() -> dict[str, Any]:
    return {
        "namespace": "team-a",
        "name": "train",
        "devices": [
            {"requestNames": ["gpu"], "pool": "node-a", "device": "gpu-0", "cdiDeviceIDs": ["k=x"]}
        ],
    }


def _with(**changes: Any) -> dict[str, Any]:
    entry = _entry()
    device = changes.pop("device", None)
    entry.update(changes)
    if device is not None:
        entry["devices"][0].update(device)
    return entry


UID = CLAIM.uid
SECRET = "../../../../api/v1/namespaces/kube-system/secrets/x"
LIST_OF_STRINGS = "must be a list of strings"


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({UID: _with(namespace=7)}, f"claim '{UID}'.namespace is a int, not a string"),
        ({UID: _with(devices={"a": 1})}, ".devices is a dict, not a list"),
        ({UID: _with(device={"requestNames": "gpu"})}, f".requestNames {LIST_OF_STRINGS}"),
        ({UID: _with(device={"cdiDeviceIDs": [1]})}, f".devices[0].cdiDeviceIDs {LIST_OF_STRINGS}"),
        ({UID: _with(device={"shareID": 5})}, ".devices[0].shareID is a int, not a string"),
        ({UID: _with(device={"pool": None})}, ".devices[0].pool is a null, not a string"),
        ({UID: _with(devices=["gpu-0"])}, ".devices[0] is a str, not an object"),
        ({UID: "prepared"}, "is a str, not an object"),
        ({UID: {"namespace": "team-a", "name": "train"}}, "lacks 'devices'"),
        ({UID: _with(extra=1)}, "has unknown field 'extra'"),
        ({"../../etc/passwd": _entry()}, "uid '../../etc/passwd' is not a Kubernetes UID"),
        ({UID: _with(name=SECRET)}, "is not a Kubernetes object name"),
        ({UID: _with(namespace="Team_A")}, "namespace 'Team_A' is not a Kubernetes namespace"),
    ],
    ids=[
        "namespace-int",
        "devices-object",
        "request-names-string",
        "cdi-ids-not-strings",
        "share-id-int",
        "pool-null",
        "device-string",
        "entry-string",
        "entry-incomplete",
        "unknown-field",
        "path-like-uid",
        "path-like-name",
        "bad-namespace",
    ],
)
def test_an_entry_of_the_wrong_shape_is_refused_even_with_a_valid_checksum(
    tmp_path: Path, claims: dict[str, Any], message: str
) -> None:
    path = tmp_path / "checkpoint.json"
    doc = {"version": CHECKPOINT_VERSION, "checksum": checksum(claims), "claims": claims}
    path.write_text(json.dumps(doc))
    assert message in refused(path)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"version": True, "checksum": checksum({}), "claims": {}}, "version True is not"),
        ({"version": 1.0, "checksum": checksum({}), "claims": {}}, "version 1.0 is not"),
        ({"version": 1, "claims": {}}, "the file lacks 'checksum'"),
        ({"version": 1, "checksum": checksum({}), "claims": {}, "x": 1}, "unknown field 'x'"),
        ({"version": 1, "checksum": checksum([]), "claims": []}, "'claims' must be an object"),
    ],
    ids=["version-bool", "version-float", "no-checksum", "unknown-field", "claims-list"],
)
def test_a_top_level_of_the_wrong_shape_is_refused(
    tmp_path: Path, doc: dict[str, Any], message: str
) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps(doc))
    assert message in refused(path)
