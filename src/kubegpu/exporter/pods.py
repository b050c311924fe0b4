"""What the exporter needs to know about the node's pods, each behind a small protocol.

* :class:`PodResourcesSource` — which container holds which device ID. The real one is the
  kubelet's PodResources v1 ``List`` over its unix socket
  (:class:`kubegpu.kubelet.pod_resources.KubeletPodResources`, in the kubelet edge, which owns
  that API's generated code).
* :class:`PodDirectory` — pod UID to namespace/name, because cgroups name pods by UID and
  PodResources by name. The real one reads the kubelet's log directory
  ``/var/log/pods/<namespace>_<name>_<uid>`` (names and namespaces cannot contain ``_``, so
  the split is unambiguous), which needs no API-server access.
* :class:`PodShareLookup` — the share of a GPU each pod was granted on shared GPUs. The format
  of the share annotation belongs to the sharing feature (``kubegpu.sharing.annotations``);
  :class:`KubeNodePods` lists the node's pods through a :class:`NodePodsApi` (the kube edge's
  :class:`kubegpu.kube.node_pods.LightkubeNodePods`) and applies
  :func:`allocation_annotation_shares` (it is also a :class:`PodDirectory`).
  :class:`NoShares` is the default and :class:`StaticShares` serves tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from kubegpu.core.apiserver import NodePod
from kubegpu.core.gpu import GpuUuid
from kubegpu.core.metrics import DeviceAssignment, PodGpuShare, PodKey

log = logging.getLogger(__name__)

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


class NodePodsApi(Protocol):
    def list_node_pods(self, node_name: str) -> list[NodePod]:
        """Every pod with ``spec.nodeName=<node_name>`` that has a uid, name and namespace."""
        ...


class KubeNodePods:
    """The node's pods from the API server (``spec.nodeName=<node>``), as a pod directory
    and, given the sharing feature's annotation parser, as a share lookup.

    One list serves both roles for ``max_age_s`` so a refresh costs one API call. A pod whose
    annotation does not parse has no share (logged), rather than failing the refresh.
    """

    def __init__(
        self,
        api: NodePodsApi,
        node_name: str,
        parse_shares: ShareParser | None = None,
        *,
        max_age_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.parse_shares = parse_shares
        self.max_age_s = max_age_s
        self.clock = clock
        self._cached: list[tuple[str, PodKey, dict[str, str]]] | None = None
        self._cached_at = 0.0

    def _pods(self) -> list[tuple[str, PodKey, dict[str, str]]]:
        now = self.clock()
        if self._cached is None or now - self._cached_at >= self.max_age_s:
            pods = [
                (pod.uid.lower(), PodKey(namespace=pod.namespace, name=pod.name), pod.annotations)
                for pod in self.api.list_node_pods(self.node_name)
            ]
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
