"""Replacing a file so that a reader, or a restart after a crash, sees the old content or the
new, never a mix. Standard library only, like :mod:`kubegpu.tls`: the node agent's CDI spec,
the labeller's feature file and the DRA driver's checkpoint and CDI specs all write this way."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str, mode: int = 0o600) -> None:
    """Temp file in the same directory, fsync, ``mode``, rename over ``path``, fsync the
    directory (so the rename itself survives a crash)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
