"""The pod-admission half of a kubelet for one emulated node, driving a :class:`KubeletEmulator`.

What it owns: what the kubelet does with pods bound to its node, as far as GPUs go. It lists
and watches the node's pods (field selector ``spec.nodeName``) through lightkube and admits
them one at a time, oldest first (the kubelet's order, which the node agent's shared mode relies
on): for each init container, then each app container, it asks the emulator to allocate the
container's ``nvidia.com/gpu`` cards or its share slot with the pod's identity, which goes through
the real GetPreferredAllocation and Allocate RPCs of the node agent. Then it marks the pod
Running through the status subresource, or Failed with the kubelet's ``UnexpectedAdmissionError``
wording when Allocate refused. Devices are released when the pod finishes or is deleted.

Like the kubelet it also reports the node's device-plugin resources in
``status.capacity``/``allocatable`` (all devices / healthy ones).

No containers run: "Running" means admitted and given its devices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import lightkube
from lightkube import ApiError
from lightkube.resources.core_v1 import NodeStatus, Pod, PodStatus
from lightkube.types import PatchType

from kubegpu.sharing.claim import read_claim
from kubegpu.sharing.podstate import pod_uid
from kubegpu.sharing.resources import RequestError, ResourceNames
from kubegpu.testing.kubelet import AllocationError, ContainerKind, KubeletEmulator
from kubegpu.testing.scheduler import TERMINAL_PHASES, follow, now_rfc3339, pod_name

log = logging.getLogger(__name__)

CAPACITY_POLL_S = 0.5


def admission_order(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    """The node agent's order for pods with nothing allocated yet: created, decided, uid."""
    claim = read_claim(pod)
    decision = claim.decision
    return (claim.created, decision.decided_at if decision is not None else "", pod_uid(pod))


def device_requests(
    pod: Mapping[str, Any], names: ResourceNames
) -> list[tuple[str, ContainerKind, str, int]]:
    """(container, kind, resource, count) for every container asking for GPU devices, in the
    kubelet's order: init containers (sidecars among them) first, then app containers, each in
    spec order."""
    claim = read_claim(pod, names)
    if claim.totals is None:
        raise RequestError(claim.refusal)
    shares = claim.totals.containers
    ordered = [c for c in shares if c.init] + [c for c in shares if not c.init]
    out: list[tuple[str, ContainerKind, str, int]] = []
    for c in ordered:
        kind: ContainerKind = "sidecar" if c.sidecar else "init" if c.init else "app"
        if c.whole_gpus:
            out.append((c.name, kind, names.whole_gpu, c.whole_gpus))
        if c.share_slots:
            out.append((c.name, kind, names.share_slot, c.share_slots))
    return out


class KubeletDriver:
    """``await KubeletDriver(client, node, emulator).run()`` admits pods until cancelled.

    ``admitted`` and ``rejected`` count outcomes (uid -> node-local message for rejects).
    """

    def __init__(
        self,
        client: lightkube.AsyncClient,
        node_name: str,
        emulator: KubeletEmulator,
        *,
        names: ResourceNames | None = None,
        pod_ip_prefix: str = "10.244.0.",
    ) -> None:
        self.client = client
        self.node_name = node_name
        self.emulator = emulator
        self.names = names or ResourceNames()
        self.pod_ip_prefix = pod_ip_prefix
        self.admitted: dict[str, str] = {}  # uid -> pod
        self.rejected: dict[str, str] = {}  # uid -> message
        # "namespace/name" -> container -> the environment the node agent's Allocate returned
        self.container_env: dict[str, dict[str, Mapping[str, str]]] = {}
        self._pending: dict[str, dict[str, Any]] = {}
        self._current = ""  # uid being admitted: its watch events must not queue it again
        self._holding: set[str] = set()
        self._wake = asyncio.Event()
        self._published: dict[str, tuple[int, int]] = {}

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._watch())
            group.create_task(self._admit_loop())
            group.create_task(self._publish_capacity())

    # ------------------------------------------------------------------ pods
    async def _watch(self) -> None:
        fields = {"spec.nodeName": self.node_name}
        async for event, pod in follow(self.client, Pod, fields=fields):
            if event == "SYNCED":
                continue
            uid = pod_uid(pod)
            phase = (pod.get("status") or {}).get("phase")
            if event == "DELETED" or phase in TERMINAL_PHASES:
                self._pending.pop(uid, None)
                self._release(uid, pod)
                continue
            done = uid in self.admitted or uid in self.rejected or uid == self._current
            if (
                phase == "Pending"
                and not done
                and not (pod.get("metadata") or {}).get("deletionTimestamp")
            ):
                self._pending[uid] = pod
                self._wake.set()

    def _release(self, uid: str, pod: Mapping[str, Any]) -> None:
        if uid in self._holding:
            self._holding.discard(uid)
            freed = self.emulator.release(uid)
            log.info(
                "node %s: pod %s ended; released %s", self.node_name, pod_name(pod), freed or "-"
            )

    async def _admit_loop(self) -> None:
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            uid = min(self._pending, key=lambda u: admission_order(self._pending[u]))
            pod = self._pending.pop(uid)
            self._current = uid
            try:
                await self.admit(pod)
            finally:
                self._current = ""

    async def admit(self, pod: Mapping[str, Any]) -> bool:
        """Allocate every GPU container of ``pod``, then mark it Running (True) or Failed."""
        uid, key = pod_uid(pod), pod_name(pod)
        meta = pod.get("metadata") or {}
        try:
            requests = device_requests(pod, self.names)
        except RequestError as exc:
            await self._fail(pod, f"Pod was rejected: {exc}")
            return False
        # resource -> devices of finished regular init containers not yet taken by a sidecar or
        # an app container (the device manager's devicesToReuse)
        reusable: dict[str, list[str]] = {}
        try:
            for container, kind, resource, count in requests:
                must = reusable.get(resource, [])[:count]
                self._holding.add(uid)
                allocation = await asyncio.to_thread(
                    self.emulator.allocate,
                    resource,
                    count,
                    must_include=must,
                    pod_uid=uid,
                    pod_name=str(meta.get("name")),
                    namespace=str(meta.get("namespace") or "default"),
                    container=container,
                    kind=kind,
                )
                self.container_env.setdefault(key, {})[container] = dict(allocation.envs)
                pool = reusable.setdefault(resource, [])
                if kind == "init":
                    pool.extend(d for d in allocation.device_ids if d not in pool)
                else:
                    # A sidecar or app container keeps what it got: no later container reuses it.
                    pool[:] = [d for d in pool if d not in allocation.device_ids]
                log.info(
                    "node %s: pod %s container %s got %s %s (NVIDIA_VISIBLE_DEVICES=%s)",
                    self.node_name,
                    key,
                    container,
                    resource,
                    ",".join(allocation.device_ids),
                    allocation.envs.get("NVIDIA_VISIBLE_DEVICES", "-"),
                )
        except AllocationError as exc:
            self._release(uid, pod)
            await self._fail(
                pod, f"Pod was rejected: Allocate failed due to {exc}, which is unexpected"
            )
            return False
        await self._running(pod)
        self.admitted[uid] = key
        return True

    async def _running(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        now = now_rfc3339()
        containers = (pod.get("spec") or {}).get("containers") or []
        ready = [
            {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
            for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        statuses = [
            {
                "name": c.get("name"),
                "image": c.get("image"),
                "imageID": "",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for c in containers
        ]
        octet = len(self.admitted) % 250 + 2
        status = {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": f"{self.pod_ip_prefix}{octet}",
            "startTime": now,
            "conditions": ready,
            "containerStatuses": statuses,
        }
        await self._patch_status(meta, status)

    async def _fail(self, pod: Mapping[str, Any], message: str) -> None:
        uid = pod_uid(pod)
        self.rejected[uid] = message
        log.warning("node %s: pod %s: %s", self.node_name, pod_name(pod), message)
        status = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": message}
        await self._patch_status(pod.get("metadata") or {}, status)

    async def _patch_status(self, meta: Mapping[str, Any], status: dict[str, Any]) -> None:
        name, namespace = str(meta.get("name")), str(meta.get("namespace") or "default")
        try:
            await self.client.patch(
                PodStatus,
                name,
                {"status": status},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
        except ApiError as exc:
            log.warning(
                "node %s: pod %s/%s: status update failed: %s", self.node_name, namespace, name, exc
            )

    # ------------------------------------------------------------------ node status
    async def _publish_capacity(self) -> None:
        while True:
            counts = {
                resource: (self.emulator.capacity(resource), self.emulator.allocatable(resource))
                for resource in self.emulator.resources()
            }
            if counts != self._published:
                patch = {
                    "status": {
                        "capacity": {r: str(c) for r, (c, _) in counts.items()},
                        "allocatable": {r: str(a) for r, (_, a) in counts.items()},
                    }
                }
                with contextlib.suppress(ApiError):
                    await self.client.patch(
                        NodeStatus, self.node_name, patch, patch_type=PatchType.MERGE
                    )
                    self._published = counts
            # The kubelet's own node-status period (its emulator announces no change of
            # devices to an asyncio loop): behaviour of the stand-in, not a test waiting.
            await asyncio.sleep(CAPACITY_POLL_S)
