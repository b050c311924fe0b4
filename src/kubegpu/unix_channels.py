"""Client channels to unix sockets that get re-created: the kubelet's ``kubelet.sock`` and
PodResources socket, a device plugin's own socket, and the DRA driver's sockets its probes ping.
It belongs to no edge (gRPC only, like :mod:`kubegpu.httpd` is standard library only): the
kubelet and DRA edges both dial such sockets, and neither may import the other.

gRPC shares subchannels between all channels of a process that dial the same target. A
subchannel that saw the socket go away waits out an exponential reconnect backoff (1 s, growing
to 2 min) and meanwhile fails every call with its last error, "No such file or directory", even
on a channel created after the socket came back. Every channel made here therefore has its own
subchannel pool, so that a fresh channel dials the socket that exists now; that is what the
reconnect paths (re-registration after a kubelet restart, a fresh PodResources channel after
UNAVAILABLE) rely on.
"""

from __future__ import annotations

from pathlib import Path

import grpc
from grpc import aio

# Our own subchannels per channel, instead of the process-wide pool (see the module docstring).
OWN_SUBCHANNELS = ("grpc.use_local_subchannel_pool", 1)


def unix_target(socket_path: Path) -> str:
    return f"unix://{socket_path}"


def unix_channel(socket_path: Path, *options: tuple[str, object]) -> grpc.Channel:
    """A blocking-API channel to ``socket_path`` with subchannels of its own."""
    return grpc.insecure_channel(unix_target(socket_path), options=[OWN_SUBCHANNELS, *options])


def unix_aio_channel(socket_path: Path) -> aio.Channel:
    """An asyncio channel to ``socket_path`` with subchannels of its own."""
    return aio.insecure_channel(unix_target(socket_path), options=[OWN_SUBCHANNELS])
