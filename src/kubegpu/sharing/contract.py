"""What a shared container is told: one contract for the device plugin and the DRA driver.

A container that holds a share of a card learns it from its environment, whichever path served
it: the cards it sees, its memory and compute share, how the share is enforced and, under
``enforcement: mps``, the CUDA MPS client settings that hold it to the share (the daemon's pipe
and log folders, mounted at the same path, a pinned-memory limit per card and an active-thread
percentage). A DRA share is also told its allocation's share ID; a container that asked in a
peer's compat mode (Volcano, Aliyun gpushare) also gets the peer's variables.

:func:`share_contract` builds all of it from the share, as either path has it (a
:class:`Grant`), and the path's sharing settings (``sharing.gpuShare`` for the device plugin,
``dra`` for the DRA driver, passed whole). The device plugin puts the result into its
``Allocate`` answer (``kubelet/coordinator.py``), the DRA driver into the claim's CDI spec
(``dra/cdi.py``); neither adds a variable of its own. Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kubegpu.core.container import (
    ENV_COMPUTE,
    ENV_ENFORCEMENT,
    ENV_MEMORY_LIMIT,
    ENV_MPS_LOG,
    ENV_MPS_MEMORY,
    ENV_MPS_PIPE,
    ENV_MPS_THREADS,
    ENV_SHARE_ID,
    ENV_UUID,
    ENV_VISIBLE_DEVICES,
    MpsDirs,
    mps_thread_percentage,
)
from kubegpu.sharing.annotations import CardShare
from kubegpu.sharing.peers import PeerCompat, container_env


class MpsHome(Protocol):
    """Where the MPS daemon lives (the config's ``mps`` section)."""

    @property
    def host_dir(self) -> str: ...


class ShareSettings(Protocol):
    """What the contract reads of a path's settings: ``sharing.gpuShare`` (device plugin) or
    ``dra`` (DRA driver), both with ``enforcement`` (``none`` or ``mps``) and ``mps``."""

    @property
    def enforcement(self) -> str: ...

    @property
    def mps(self) -> MpsHome: ...


@dataclass(frozen=True)
class Grant:
    """One card a container gets, and its share of it; no memory and no compute: the whole
    card (the DRA driver serves whole cards through the same contract)."""

    uuid: str
    index: int
    memory_mib: int | None = None
    compute_milli: int | None = None
    share_id: str | None = None

    @classmethod
    def of(cls, share: CardShare) -> Grant:
        """The device plugin's share: the extender's decision for the container."""
        return cls(share.uuid, share.index, share.gpu_memory_mib, share.compute_milli)

    @property
    def is_share(self) -> bool:
        return self.memory_mib is not None or self.compute_milli is not None


@dataclass(frozen=True)
class PeerAsk:
    """A container that asked for a share in a peer's compat mode, with the peer's figures."""

    peer: PeerCompat
    card_memory_mib: int
    container_units: int
    pod_units: int


@dataclass(frozen=True)
class MpsLimits:
    """The MPS client settings a share is held to under ``enforcement: mps``."""

    dirs: MpsDirs
    # (card UUID, MiB) for each card the container sees with a memory share, in card order.
    pinned_memory: tuple[tuple[str, int], ...]
    # Only with a compute share.
    thread_percentage: int | None

    def env(self) -> dict[str, str]:
        env = {ENV_MPS_PIPE: self.dirs.pipe_dir, ENV_MPS_LOG: self.dirs.log_dir}
        if self.pinned_memory:
            env[ENV_MPS_MEMORY] = ",".join(f"{uuid}={mib}M" for uuid, mib in self.pinned_memory)
        if self.thread_percentage is not None:
            env[ENV_MPS_THREADS] = str(self.thread_percentage)
        return env


@dataclass(frozen=True)
class ShareContract:
    """Everything a container is told about its cards and share."""

    cards: tuple[str, ...]  # UUIDs, in the order the container sees them
    env: Mapping[str, str]  # all of it, NVIDIA_VISIBLE_DEVICES first
    mps: MpsLimits | None  # None: no MPS client (a whole card, or enforcement none)
    share_id: str | None

    @property
    def share_env(self) -> dict[str, str]:
        """``env`` but NVIDIA_VISIBLE_DEVICES, for a path that names the cards its own way
        (the device plugin's device-list strategy: by UUID or index, volume mounts, CDI)."""
        return {k: v for k, v in self.env.items() if k != ENV_VISIBLE_DEVICES}

    @property
    def mounts(self) -> tuple[str, ...]:
        """Host folders mounted read-write at the same path: the MPS daemon's, for a client."""
        return (self.mps.dirs.pipe_dir, self.mps.dirs.log_dir) if self.mps is not None else ()


def share_contract(
    grant: Grant,
    settings: ShareSettings,
    *,
    together: Sequence[Grant] = (),
    peer: PeerAsk | None = None,
) -> ShareContract:
    """What a container holding ``grant`` is told under ``settings``.

    ``together``: every card the container gets with this one, ``grant`` among them, in the
    order it sees them (a DRA request of several cards; ``grant`` alone by default). The card
    list and the MPS memory limits name all of them; the share's own figures, share ID and
    thread percentage are ``grant``'s. ``peer``: the container asked in a compat mode."""
    cards = tuple(together) or (grant,)
    uuids = ",".join(c.uuid for c in cards)
    env = {ENV_VISIBLE_DEVICES: uuids}
    if peer is not None:
        env.update(
            container_env(
                peer.peer,
                card_index=grant.index,
                card_memory_mib=peer.card_memory_mib,
                container_units=peer.container_units,
                pod_units=peer.pod_units,
            )
        )
    env[ENV_UUID] = uuids
    if grant.memory_mib is not None:
        env[ENV_MEMORY_LIMIT] = str(grant.memory_mib)
    if grant.compute_milli is not None:
        env[ENV_COMPUTE] = str(grant.compute_milli)
    if grant.share_id is not None:
        env[ENV_SHARE_ID] = grant.share_id
    mps = None
    if grant.is_share:
        env[ENV_ENFORCEMENT] = settings.enforcement
        if settings.enforcement == "mps":
            mps = MpsLimits(
                MpsDirs.under(settings.mps.host_dir),
                tuple((c.uuid, c.memory_mib) for c in cards if c.memory_mib is not None),
                None if grant.compute_milli is None else mps_thread_percentage(grant.compute_milli),
            )
            env.update(mps.env())
    return ShareContract(tuple(c.uuid for c in cards), env, mps, grant.share_id)
