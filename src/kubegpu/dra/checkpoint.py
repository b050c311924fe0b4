"""The prepared-claims checkpoint: which claims this node's driver has prepared, and into what.

Why a file: NodePrepareResources and NodeUnprepareResources are repeated by the kubelet (after
its own restart, after a partial failure) and the driver itself restarts. The checkpoint lets a
restarted driver answer a repeated Prepare with exactly what it answered before (no second share
for the same claim) and still remove, on Unprepare, what an earlier instance prepared.

Format: versioned JSON ``{"version": 1, "checksum": "sha256:…", "claims": {uid: {...}}}``;
the checksum covers the canonical JSON of ``claims`` so a torn or hand-edited file is refused
instead of being half-believed. Written atomically (temp file, fsync, rename, fsync of the dir),
once per kubelet call whatever the number of claims in it (:meth:`Checkpoint.update`).

Reading survives any file at the path: anything but a regular file (a directory, a FIFO that
would block the open for ever, a socket, a device) is refused before it is read, a file over
:data:`MAX_CHECKPOINT_BYTES` before it is read, and then bytes that are not UTF-8, JSON nested
past the parser's limit, a number the parser refuses, and every entry of the wrong shape (each
field's type, the UID, namespace and name as Kubernetes spells them), checksum or not. Each is
a :class:`CheckpointError` whose one-line message names the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kubegpu.atomic_file import write_atomically
from kubegpu.core.dra import ClaimRef, PreparedClaim, PreparedDevice

CHECKPOINT_VERSION = 1
# A claim takes well under 1 KiB; a node never holds tens of thousands of them. Past this the
# file is not ours (or not sane), and reading it whole would cost the memory it claims.
MAX_CHECKPOINT_BYTES = 32 * 2**20

_TOP_KEYS = frozenset({"version", "checksum", "claims"})
_CLAIM_KEYS = frozenset({"namespace", "name", "devices"})
_DEVICE_KEYS = frozenset({"requestNames", "pool", "device", "cdiDeviceIDs", "shareID"})


class CheckpointError(RuntimeError):
    """The checkpoint file exists but cannot be trusted (its type, size, encoding, JSON,
    version, checksum or an entry); the message is one line naming the file."""


def _canonical(claims: dict[str, Any]) -> bytes:
    return json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()


def checksum(claims: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(_canonical(claims)).hexdigest()


def _claim_to_json(prepared: PreparedClaim) -> dict[str, Any]:
    return {
        "namespace": prepared.claim.namespace,
        "name": prepared.claim.name,
        "devices": [
            {
                "requestNames": list(d.request_names),
                "pool": d.pool,
                "device": d.device,
                "cdiDeviceIDs": list(d.cdi_device_ids),
                **({"shareID": d.share_id} if d.share_id is not None else {}),
            }
            for d in prepared.devices
        ],
    }


class _Malformed(ValueError):
    """An entry's field is of the wrong type or spelling (the message says which)."""


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _fields(raw: Any, where: str, keys: frozenset[str], optional: frozenset[str]) -> None:
    if not isinstance(raw, dict):
        raise _Malformed(f"{where} is a {_type_name(raw)}, not an object")
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise _Malformed(f"{where} has unknown field {unknown[0]!r:.60}")
    missing = sorted(keys - optional - set(raw))
    if missing:
        raise _Malformed(f"{where} lacks {missing[0]!r}")


def _string(raw: dict[str, Any], key: str, where: str) -> str:
    value = raw[key]
    if not isinstance(value, str):
        raise _Malformed(f"{where}.{key} is a {_type_name(value)}, not a string")
    return value


def _strings(raw: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = raw[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Malformed(f"{where}.{key} must be a list of strings, not {_type_name(value)}")
    return tuple(value)


def _claim_from_json(uid: str, raw: Any) -> PreparedClaim:
    """Raises :class:`_Malformed` naming the first field that is not as we write it."""
    where = f"claim {uid!r:.80}"
    _fields(raw, where, _CLAIM_KEYS, frozenset())
    claim = ClaimRef(_string(raw, "namespace", where), _string(raw, "name", where), uid)
    problem = claim.problem()
    if problem is not None:
        raise _Malformed(f"{where}: {problem}")
    devices = raw["devices"]
    if not isinstance(devices, list):
        raise _Malformed(f"{where}.devices is a {_type_name(devices)}, not a list")
    prepared = []
    for i, d in enumerate(devices):
        at = f"{where}.devices[{i}]"
        _fields(d, at, _DEVICE_KEYS, frozenset({"shareID"}))
        share_id = _string(d, "shareID", at) if "shareID" in d else None
        prepared.append(
            PreparedDevice(
                request_names=_strings(d, "requestNames", at),
                pool=_string(d, "pool", at),
                device=_string(d, "device", at),
                cdi_device_ids=_strings(d, "cdiDeviceIDs", at),
                share_id=share_id,
            )
        )
    return PreparedClaim(claim=claim, devices=tuple(prepared))


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def _read_capped(path: Path) -> bytes | None:
    """The file's bytes, None when there is none; raises :class:`CheckpointError` for what
    is not a regular file of at most :data:`MAX_CHECKPOINT_BYTES`, without blocking."""
    try:
        # Looked at before it is opened: opening a FIFO for reading waits for a writer.
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path}: is {_file_kind(mode)}, not a checkpoint file")
    try:
        # Non-blocking as well, in case the path was replaced by a FIFO since the stat.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{path}: is {_file_kind(st.st_mode)}, not a checkpoint file")
        if st.st_size > MAX_CHECKPOINT_BYTES:
            raise CheckpointError(
                f"{path}: is {st.st_size} bytes, more than the {MAX_CHECKPOINT_BYTES} a "
                "checkpoint may be"
            )
        chunks = []
        left = MAX_CHECKPOINT_BYTES + 1  # one more: a file that grew since the fstat shows it
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(
            f"{path}: is more than the {MAX_CHECKPOINT_BYTES} bytes a checkpoint may be"
        )
    return data


def read_checkpoint(path: Path) -> dict[str, PreparedClaim]:
    """The claims recorded in ``path`` ({} when there is no file); raises
    :class:`CheckpointError` for any file that is not a checkpoint we wrote, whole."""
    data = _read_capped(path)
    if data is None:
        return {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise CheckpointError(f"{path}: not a checkpoint (JSON nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, and numbers too long to convert
        raise CheckpointError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: version None is not the supported {CHECKPOINT_VERSION}")
    version = doc.get("version")
    # bool is an int in Python, and True == 1: not a version we write.
    if type(version) is not int or version != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{path}: version {version!r:.40} is not the supported {CHECKPOINT_VERSION}"
        )
    try:
        _fields(doc, "the file", _TOP_KEYS, frozenset())
    except _Malformed as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    claims = doc["claims"]
    if not isinstance(claims, dict):
        raise CheckpointError(f"{path}: 'claims' must be an object")
    if doc["checksum"] != checksum(claims):
        raise CheckpointError(f"{path}: checksum mismatch, the file is damaged")
    # The checksum proves the file whole, not that it is ours: every entry is read as strictly
    # as an unchecked one, since its UID, names and ids go into file names, URLs and answers.
    read: dict[str, PreparedClaim] = {}
    for uid, raw in claims.items():
        try:
            claim = _claim_from_json(uid, raw)
        except _Malformed as exc:
            raise CheckpointError(f"{path}: {exc}") from None
        read[uid] = claim
    return read


class Checkpoint:
    """The checkpoint file at ``path``; every change is written through before it returns.
    Raises :class:`CheckpointError` when the file there cannot be trusted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._claims: dict[str, PreparedClaim] = read_checkpoint(path)

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def claims(self) -> dict[str, PreparedClaim]:
        return dict(self._claims)

    def update(self, put: Iterable[PreparedClaim] = (), remove: Iterable[str] = ()) -> None:
        """Record ``put`` and drop ``remove`` in one write (none when nothing changes): a call
        of N claims costs one file of the node's claims, not N of them. Raises OSError or
        :class:`CheckpointError` (the file would exceed the size a reader accepts), leaving
        the checkpoint as it was."""
        claims = dict(self._claims)
        changed = False
        for uid in remove:
            changed |= claims.pop(uid, None) is not None
        for prepared in put:
            claims[prepared.claim.uid] = prepared
            changed = True
        if not changed:
            return
        self._write(claims)
        self._claims = claims

    def _write(self, claims: Mapping[str, PreparedClaim]) -> None:
        body = {uid: _claim_to_json(p) for uid, p in sorted(claims.items())}
        doc = {"version": CHECKPOINT_VERSION, "checksum": checksum(body), "claims": body}
        text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
        if len(text.encode()) > MAX_CHECKPOINT_BYTES:
            raise CheckpointError(
                f"{self.path}: {len(claims)} claims would take more than the "
                f"{MAX_CHECKPOINT_BYTES} bytes a checkpoint may be"
            )
        write_atomically(self.path, text)
