"""The kubelet's DRA device-health stream (``v1alpha1.DRAResourceHealth``, KEP-4680).

With the ``ResourceHealthStatus`` gate on, the kubelet calls ``NodeWatchResources`` on the DRA
socket once the driver has registered, and shows each prepared device's health in the pod's
``status.containerStatuses[].allocatedResourcesStatus``. So a pod whose GPU turned unhealthy
says so itself, beside the ResourceSlice taint that keeps new claims away.

Each message lists every GPU of the node with the health the Xid policy gives it now: sent at
once, on every verdict flip, and at least every ``heartbeat_s``: the kubelet marks a device
``Unknown`` when it has heard nothing about it for ``health_check_timeout_seconds``, which we
set to a few heartbeats. A kubelet without the gate never calls; serving it costs nothing then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from kubegpu.core.dra import device_name, mig_device_name
from kubegpu.core.gpu import NodeInventory
from kubegpu.dra.api.dra_health.v1alpha1 import api_pb2 as health_pb
from kubegpu.dra.api.dra_health.v1alpha1 import api_pb2_grpc as health_grpc

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_S = 10.0
# Three heartbeats: one late message must not turn a healthy GPU Unknown.
HEARTBEATS_PER_TIMEOUT = 3


def health_response(
    inventory: NodeInventory,
    pool: str,
    unhealthy: Mapping[str, str],
    now_s: int,
    timeout_s: int,
) -> Any:
    """Every device of the node by its name in ``pool``: a card, or for a card in MIG mode each
    of its MIG devices (:mod:`kubegpu.dra.mig_slices`); UNHEALTHY when ``unhealthy`` (UUID →
    reason) names it or, for a MIG device, its card."""
    devices: list[tuple[str, bool]] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        card_bad = gpu.uuid in unhealthy
        if not gpu.mig_enabled:
            devices.append((device_name(gpu.index), card_bad))
            continue
        devices += [
            (
                mig_device_name(gpu.index, mig.profile, mig.profile_id, mig.start),
                card_bad or mig.uuid in unhealthy,
            )
            for mig in gpu.mig_devices
        ]
    return health_pb.NodeWatchResourcesResponse(
        devices=[
            health_pb.DeviceHealth(
                device=health_pb.DeviceIdentifier(pool_name=pool, device_name=name),
                health=health_pb.HealthStatus.UNHEALTHY if bad else health_pb.HealthStatus.HEALTHY,
                last_updated_time=now_s,
                health_check_timeout_seconds=timeout_s,
            )
            for name, bad in devices
        ]
    )


class DeviceHealthServicer(health_grpc.DRAResourceHealthServicer):
    """One stream per kubelet connection; :meth:`notify` (on the server's event loop) wakes
    them all to send the new verdicts."""

    def __init__(
        self,
        node_name: str,
        pool: str,
        inventory: NodeInventory,
        unhealthy: Callable[[], Mapping[str, str]],
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s must be > 0, got {heartbeat_s}")
        self.node_name = node_name
        self.pool = pool
        self.inventory = inventory
        self.unhealthy = unhealthy
        self.heartbeat_s = heartbeat_s
        self.timeout_s = max(1, round(heartbeat_s * HEARTBEATS_PER_TIMEOUT))
        self.clock = clock
        # Replaced on every notify: a stream waits on the event it saw before its last send,
        # so a flip between the send and the wait is not missed.
        self._changed = asyncio.Event()
        self.streams = 0
        self.closed = False

    def notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def close(self) -> None:
        """End every stream now (the driver stops): the server's stop then need not wait out
        its grace period for streams that never end by themselves."""
        self.closed = True
        self.notify()

    def snapshot(self) -> Any:
        return health_response(
            self.inventory, self.pool, self.unhealthy(), int(self.clock()), self.timeout_s
        )

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.streams += 1
        log.info(
            "node %s: the kubelet watches the health of %d GPU(s)",
            self.node_name,
            len(self.inventory.gpus),
        )
        try:
            while not self.closed:
                changed = self._changed
                yield self.snapshot()
                with contextlib.suppress(TimeoutError):  # a heartbeat is due
                    await asyncio.wait_for(changed.wait(), self.heartbeat_s)
        finally:
            self.streams -= 1
            log.info("node %s: a kubelet health stream ended", self.node_name)
