"""One process per served unix socket: the claim a kubelet-facing server holds on its socket.

Two instances on one kubelet directory (a DaemonSet rolling update with a surge, an operator
starting a second copy by hand) would each unlink and rebind the other's socket, and the first
to stop would delete the socket the other still serves, so the kubelet drops a plugin that is
running. The node agent's device plugins and the DRA driver's sockets are both claimed here.
It belongs to no edge (standard library only, like :mod:`kubegpu.atomic_file`): the kubelet and
DRA edges both serve such sockets, and neither may import the other.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path


class SocketInUse(RuntimeError):
    """Another live process holds the claim on a socket."""

    def __init__(self, socket_path: Path, lock_path: Path, owner: str, role: str) -> None:
        super().__init__(
            f"{socket_path} is served by another {role} ({owner or 'owner unknown'}; "
            f"lock {lock_path})"
        )
        self.socket_path = socket_path
        self.owner = owner


def lock_path_of(socket_path: Path) -> Path:
    """``<socket>.lock``, beside the socket."""
    return socket_path.with_name(socket_path.name + ".lock")


class SocketClaim:
    """The exclusive right to serve one socket: an ``flock`` on ``<socket>.lock`` beside it,
    held for as long as the process serves the socket.

    An flock goes with its process, even on SIGKILL, so a crashed owner never blocks its
    successor, and the kubelet, which deletes every socket in its directory when it starts and
    whose plugin watcher skips anything that is not a socket, leaves regular files alone. The
    file names its owner (pid, host, since when) for the message the next process logs."""

    def __init__(self, socket_path: Path, lock_path: Path, fd: int) -> None:
        self.socket_path = socket_path
        self.lock_path = lock_path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, socket_path: Path, *, role: str) -> SocketClaim:
        """Claim ``socket_path``; raises :class:`SocketInUse` naming the owner (``role`` says
        what the owner is, for the message), or OSError."""
        lock_path = lock_path_of(socket_path)
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.pread(fd, 512, 0).decode(errors="replace").strip()
                os.close(fd)
                raise SocketInUse(socket_path, lock_path, owner, role) from None
            except BaseException:
                os.close(fd)
                raise
            # The owner removes the file as it releases it: a lock won on the removed file
            # is no claim (a third process may lock the new one), so look again.
            if _same_file(fd, lock_path):
                break
            os.close(fd)
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        owner = f"pid {os.getpid()} on {socket.gethostname()} since {since}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner.encode(), 0)
        return cls(socket_path, lock_path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if _same_file(fd, self.lock_path):
            self.lock_path.unlink(missing_ok=True)  # before unlocking: see acquire
        os.close(fd)  # drops the flock


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def socket_identity(path: Path) -> tuple[int, int] | None:
    """(inode, ctime) of a file, or None when it is missing: a recreated file differs (the
    ctime because inodes are reused at once after a delete)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_ctime_ns)
