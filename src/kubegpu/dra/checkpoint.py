"""The prepared-claims checkpoint: which claims this node's driver has prepared, and into what.

Why a file: NodePrepareResources and NodeUnprepareResources are repeated by the kubelet (after
its own restart, after a partial failure) and the driver itself restarts. The checkpoint lets a
restarted driver answer a repeated Prepare with exactly what it answered before (no second share
for the same claim) and still remove, on Unprepare, what an earlier instance prepared.

Format: versioned JSON ``{"version": 1, "checksum": "sha256:…", "claims": {uid: {...}}}``;
the checksum covers the canonical JSON of ``claims`` so a torn or hand-edited file is refused
instead of being half-believed. Written atomically (temp file, fsync, rename, fsync of the dir).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kubegpu.atomic_file import write_atomically
from kubegpu.core.dra import ClaimRef, PreparedClaim, PreparedDevice

CHECKPOINT_VERSION = 1


class CheckpointError(RuntimeError):
    """The checkpoint file exists but cannot be trusted (bad JSON, version or checksum)."""


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


def _claim_from_json(uid: str, raw: Any) -> PreparedClaim:
    try:
        return PreparedClaim(
            claim=ClaimRef(namespace=str(raw["namespace"]), name=str(raw["name"]), uid=uid),
            devices=tuple(
                PreparedDevice(
                    request_names=tuple(str(n) for n in d["requestNames"]),
                    pool=str(d["pool"]),
                    device=str(d["device"]),
                    cdi_device_ids=tuple(str(i) for i in d["cdiDeviceIDs"]),
                    share_id=str(d["shareID"]) if "shareID" in d else None,
                )
                for d in raw["devices"]
            ),
        )
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"claim {uid}: malformed entry ({exc!r})") from None


class Checkpoint:
    """The checkpoint file at ``path``; every change is written through before it returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._claims: dict[str, PreparedClaim] = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{self.path}: not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("version") != CHECKPOINT_VERSION:
            version = doc.get("version") if isinstance(doc, dict) else None
            raise CheckpointError(
                f"{self.path}: version {version!r} is not the supported {CHECKPOINT_VERSION}"
            )
        claims = doc.get("claims")
        if not isinstance(claims, dict):
            raise CheckpointError(f"{self.path}: 'claims' must be an object")
        if doc.get("checksum") != checksum(claims):
            raise CheckpointError(f"{self.path}: checksum mismatch, the file is damaged")
        return {uid: _claim_from_json(uid, raw) for uid, raw in claims.items()}

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def claims(self) -> dict[str, PreparedClaim]:
        return dict(self._claims)

    def put(self, prepared: PreparedClaim) -> None:
        claims = dict(self._claims)
        claims[prepared.claim.uid] = prepared
        self._write(claims)
        self._claims = claims

    def remove(self, uid: str) -> None:
        if uid not in self._claims:
            return
        claims = {k: v for k, v in self._claims.items() if k != uid}
        self._write(claims)
        self._claims = claims

    def _write(self, claims: dict[str, PreparedClaim]) -> None:
        body = {uid: _claim_to_json(p) for uid, p in sorted(claims.items())}
        doc = {"version": CHECKPOINT_VERSION, "checksum": checksum(body), "claims": body}
        write_atomically(self.path, json.dumps(doc, indent=2, sort_keys=True) + "\n")
