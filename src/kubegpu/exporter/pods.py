"""What the exporter needs to know about the node's pods, each behind a small protocol.

* :class:`PodResourcesSource` — which container holds which device ID. The real one is the
  kubelet's PodResources v1 ``List`` over its unix socket (:class:`KubeletPodResources`).
* :class:`PodDirectory` — pod UID to namespace/name, because cgroups name pods by UID and
  PodResources by name. The real one reads the kubelet's log directory
  ``/var/log/pods/<namespace>_<name>_<uid>`` (names and namespaces cannot contain ``_``, so
  the split is unambiguous), which needs no API-server access.
* :class:`PodShareLookup` — the share of a GPU each pod was granted on shared GPUs. The format
  of the share annotation belongs to the sharing feature (``kubegpu.sharing.annotations``);
  :class:`KubeNodePods` lists the node's pods through lightkube and applies
  :func:`allocation_annotation_shares` (it is also a :class:`PodDirectory`).
  :class:`NoShares` is the default and :class:`StaticShares` serves tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.metrics import DeviceAssignment, PodGpuShare, PodKey

log = logging.getLogger(__name__)

DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_POD_LOG_DIR = Path("/var/log/pods")


class PodResourcesSource(Protocol):
    def list_assignments(self) -> tuple[DeviceAssignment, ...]:
        """Every device ID held by every container of every active pod on the node."""
        ...

    def close(self) -> None: ...


class PodDirectory(Protocol):
    def pods_by_uid(self) -> Mapping[str, PodKey]: ...


class PodShareLookup(Protocol):
    def shares(self) -> Mapping[PodKey, Sequence[PodGpuShare]]:
        """Shares of the node's pods that run on shared GPUs (pods without one are absent)."""
        ...


class KubeletPodResources:
    """PodResources v1 ``List`` over the kubelet's unix socket.

    dcgm-exporter's pattern: one ``List`` per refresh with a deadline. The kubelet rate-limits
    this API (100/s, burst 10, shared by every caller on the node), which a refresh every few
    seconds stays far below. The kubelet re-creates its socket on restart; gRPC reconnects to
    the path by itself.
    """

    def __init__(self, socket_path: Path = DEFAULT_POD_RESOURCES_SOCKET, timeout_s: float = 5.0):
        from kubegpu.kubelet.api.podresources.v1 import api_pb2

        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._pb = api_pb2
        self._channel: Any = None
        self._stub: Any = None
        self._connect()

    def _connect(self) -> None:
        from kubegpu.kubelet.api.podresources.v1 import api_pb2_grpc
        from kubegpu.kubelet.channels import unix_channel

        if self._channel is not None:
            self._channel.close()
        self._channel = unix_channel(self.socket_path)
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def list_assignments(self) -> tuple[DeviceAssignment, ...]:
        import grpc

        request = self._pb.ListPodResourcesRequest()
        try:
            response = self._stub.List(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                raise
            # The kubelet restarted and re-created its socket. A channel that saw the old one
            # fail backs off exponentially (up to minutes) before reconnecting, so start a
            # fresh one (with subchannels of its own: kubegpu.kubelet.channels) and try once
            # more now.
            log.info("PodResources at %s unavailable; reconnecting", self.socket_path)
            self._connect()
            response = self._stub.List(request, timeout=self.timeout_s)
        return assignments_from_list_response(response)

    def close(self) -> None:
        self._channel.close()


def assignments_from_list_response(response: Any) -> tuple[DeviceAssignment, ...]:
    """Convert a ``ListPodResourcesResponse`` into our values. The kubelet writes one
    ``ContainerDevices`` entry per device ID (and NUMA node), so entries are flattened, never
    assumed to be one per resource."""
    found: list[DeviceAssignment] = []
    for pod in response.pod_resources:
        key = PodKey(namespace=pod.namespace, name=pod.name)
        for container in pod.containers:
            for devices in container.devices:
                for device_id in devices.device_ids:
                    found.append(
                        DeviceAssignment(
                            pod=key,
                            container=container.name,
                            resource_name=devices.resource_name,
                            device_id=device_id,
                        )
                    )
    # The same ID can appear once per NUMA node; keep one.
    return tuple(dict.fromkeys(found))


class StaticPodResources:
    """Fixed assignments (for tests and demos)."""

    def __init__(self, assignments: Sequence[DeviceAssignment] = ()) -> None:
        self.assignments = tuple(assignments)

    def list_assignments(self) -> tuple[DeviceAssignment, ...]:
        return self.assignments

    def close(self) -> None:
        pass


class PodLogDirectory:
    def __init__(self, root: Path = DEFAULT_POD_LOG_DIR) -> None:
        self.root = root

    def pods_by_uid(self) -> dict[str, PodKey]:
        found: dict[str, PodKey] = {}
        try:
            entries = list(self.root.iterdir())
        except OSError as exc:
            log.debug("cannot list pod log directory %s: %s", self.root, exc)
            return found
        for entry in entries:
            parts = entry.name.split("_")
            if len(parts) == 3 and all(parts):
                namespace, name, uid = parts
                found[uid.lower()] = PodKey(namespace=namespace, name=name)
        return found


class StaticPodDirectory:
    def __init__(self, pods: Mapping[str, PodKey]) -> None:
        self.pods = dict(pods)

    def pods_by_uid(self) -> Mapping[str, PodKey]:
        return self.pods


class NoShares:
    def shares(self) -> Mapping[PodKey, Sequence[PodGpuShare]]:
        return {}


class StaticShares:
    """Scriptable shares for tests; replace the mapping to change them."""

    def __init__(self, shares: Mapping[PodKey, Sequence[PodGpuShare]] | None = None) -> None:
        self.current: dict[PodKey, Sequence[PodGpuShare]] = dict(shares or {})

    def shares(self) -> Mapping[PodKey, Sequence[PodGpuShare]]:
        return self.current


ShareParser = Callable[[Mapping[str, str]], Sequence[PodGpuShare]]


def allocation_annotation_shares(annotations: Mapping[str, str]) -> list[PodGpuShare]:
    """The pod's grant per card from the sharing feature's ``kubegpu.io/gpu-allocation``
    annotation (written by the scheduler extender at bind time): memory and compute on each
    card, whole cards included. Raises ``ValueError`` (``AnnotationError``) when malformed."""
    from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION, decode_allocation

    text = annotations.get(ALLOCATION_ANNOTATION)
    if text is None:
        return []
    decision = decode_allocation(text)
    return [
        PodGpuShare(
            uuid=GpuUuid(card.uuid),
            memory_bytes=card.gpu_memory_mib * 1024 * 1024,
            compute_ratio=card.compute_milli / 1000,
        )
        for card in decision.cards
    ]


class KubeNodePods:
    """The node's pods from the API server (``spec.nodeName=<node>``), as a pod directory
    and, given the sharing feature's annotation parser, as a share lookup.

    One list serves both roles for ``max_age_s`` so a refresh costs one API call. A pod whose
    annotation does not parse has no share (logged), rather than failing the refresh.
    """

    def __init__(
        self,
        client: Any,  # lightkube.Client
        node_name: str,
        parse_shares: ShareParser | None = None,
        *,
        max_age_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.node_name = node_name
        self.parse_shares = parse_shares
        self.max_age_s = max_age_s
        self.clock = clock
        self._cached: list[tuple[str, PodKey, dict[str, str]]] | None = None
        self._cached_at = 0.0

    def _pods(self) -> list[tuple[str, PodKey, dict[str, str]]]:
        now = self.clock()
        if self._cached is None or now - self._cached_at >= self.max_age_s:
            from lightkube.resources.core_v1 import Pod

            pods = []
            for pod in self.client.list(
                Pod, namespace="*", fields={"spec.nodeName": self.node_name}
            ):
                meta = pod.metadata
                if meta is None or not meta.uid or not meta.name or not meta.namespace:
                    continue
                key = PodKey(namespace=meta.namespace, name=meta.name)
                pods.append((meta.uid.lower(), key, dict(meta.annotations or {})))
            self._cached, self._cached_at = pods, now
        return self._cached

    def pods_by_uid(self) -> dict[str, PodKey]:
        return {uid: key for uid, key, _ in self._pods()}

    def shares(self) -> dict[PodKey, Sequence[PodGpuShare]]:
        if self.parse_shares is None:
            return {}
        found: dict[PodKey, Sequence[PodGpuShare]] = {}
        for _, key, pod_annotations in self._pods():
            try:
                shares = self.parse_shares(pod_annotations)
            except ValueError as exc:
                log.warning(
                    "node %s: pod %s/%s: unreadable share annotation: %s",
                    self.node_name,
                    key.namespace,
                    key.name,
                    exc,
                )
                continue
            if shares:
                found[key] = tuple(shares)
        return found
