"""Whether a folder can hold the unix sockets of the kubelet and of our device plugins.

Checked at start, before any socket is made: otherwise a ``--kubelet-dir`` that is a file, lies
under a file, cannot be written, or is so deep that a socket path in it is longer than the
kernel's ``sun_path`` (108 bytes with the terminating NUL) fails later inside gRPC or asyncio
with a message that names neither the option nor the path.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

# sun_path in struct sockaddr_un is 108 bytes on Linux, and the path must end with a NUL.
MAX_SOCKET_PATH_BYTES = 107


class SocketDirError(ValueError):
    """The folder cannot hold the sockets; the message names it and says why."""


def check_socket_dir(directory: Path, socket_names: Iterable[str]) -> None:
    """Raise :class:`SocketDirError` unless every ``socket_names`` can be bound in
    ``directory`` (which may not exist yet, as long as it can be made)."""
    longest = max(socket_names, key=lambda name: len(os.fsencode(name)))
    path = directory.absolute() / longest
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH_BYTES:
        raise SocketDirError(
            f"{directory}: the socket path {path} would be {size} bytes, more than the "
            f"{MAX_SOCKET_PATH_BYTES} a unix socket path may have; use a shorter folder"
        )
    check_folder(directory, "create sockets")


def check_folder(directory: Path, purpose: str = "write") -> None:
    """Raise :class:`SocketDirError` unless ``directory`` is a folder this process can
    ``purpose`` in, or can be made as one."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is" if existing == directory else f"lies under {existing}, which is"
        raise SocketDirError(f"{directory} {what} not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SocketDirError(f"{existing}: no permission to {purpose} there")
