"""The node agent's side of the peer compat modes (``sharing.gpuShare.compat``): what a peer's
container asked for at ``Allocate`` (told to it by :func:`kubegpu.sharing.contract.share_contract`)
and the peer's node figures on the Node.

The rules are :mod:`kubegpu.sharing.peers`; this module applies them to the agent's config and
its pods, and re-asserts the node figures. Those are extended resources patched straight into
the Node's status (no device plugin stands behind them: that is what keeps the kubelet's
``ListAndWatch`` small, docs/sharing.md), and the kubelet drops such figures when it re-registers
a node, so the agent writes them on start, on every inventory publication and whenever they
differ from what it wants.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from kubegpu.config.model import AgentConfig
from kubegpu.sharing.claim import PodClaim
from kubegpu.sharing.contract import PeerAsk
from kubegpu.sharing.peers import PeerCompat, node_capacity, peer_compat, peer_named

log = logging.getLogger(__name__)


def peers_of(config: AgentConfig) -> tuple[PeerCompat, ...]:
    compat = config.sharing.gpu_share.compat
    return peer_compat(
        compat.modes,
        aliyun_memory_unit=compat.aliyun_memory_unit,
        volcano_memory_factor=compat.volcano_memory_factor,
        compute_milli=compat.compute_milli,
    )


def peer_ask(
    config: AgentConfig, claim: PodClaim, container: str, card_memory_mib: int
) -> PeerAsk | None:
    """What ``container`` of ``claim`` asked for when it asked in a compat mode, else ``None``.
    The pod's total (Aliyun's ``_POD``) adds up its app containers and sidecars in the peer's
    unit, as gpushare's extender records it."""
    totals = claim.totals
    peers = peers_of(config)
    if totals is None or not peers:
        return None
    asked = next((c for c in totals.containers if c.name == container), None)
    if asked is None or not asked.peer:
        return None
    peer = peer_named(peers, asked.peer)
    if peer is None:
        return None
    pod_units = sum(
        c.peer_units for c in totals.containers if c.peer == peer.name and (not c.init or c.sidecar)
    )
    return PeerAsk(peer, card_memory_mib, asked.peer_units, pod_units or asked.peer_units)


@runtime_checkable
class NodeCapacityApi(Protocol):
    """The Node's status figures (the real one: ``kube.agent_api.LightkubeNodeApi``)."""

    async def publish_node_capacity(self, figures: Mapping[str, str]) -> bool:
        """Set capacity and allocatable of each resource in ``figures``; ``False`` when they
        already were."""
        ...


async def publish_peer_capacity(
    api: object, config: AgentConfig, card_memory_mib: Sequence[int]
) -> bool:
    """Write the peers' node figures when compat modes are on and ``api`` can; ``True`` when a
    write happened."""
    peers = peers_of(config)
    if not peers:
        return False
    if not isinstance(api, NodeCapacityApi):
        log.warning("peer compat: this API access cannot write node capacity; figures not shown")
        return False
    figures = node_capacity(peers, card_memory_mib)
    written = await api.publish_node_capacity(figures)
    if written:
        log.info(
            "peer compat: node capacity set: %s",
            ", ".join(f"{k}={v}" for k, v in sorted(figures.items())),
        )
    return written
