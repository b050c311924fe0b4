"""MIG in the inspect report: the cards a node serves by their MIG devices, and who holds them.

The node agent publishes those cards in ``kubegpu.io/mig-devices``, apart from its inventory
(the extender places nothing on them: kube-scheduler hands out MIG devices as any extended
resource). Which pod holds which MIG device is the kubelet's word, read from the exporter's
``kubegpu_pod_mig_device_allocated`` when usage is fetched. A pod on the node asking for a MIG
resource (``nvidia.com/mig-3g.40gb``, or the card's own resource under ``single``) that no such
reading names is listed as holding that many devices of the resource's profile, which ones not
known: a request, not a placement.

Separate from the model and the per-node card arithmetic: none of their figures (shares, whole
cards, free memory) applies to a card in MIG mode. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kubegpu.inspect.reading import metadata_of
from kubegpu.inspect.report import (
    DriftWarning,
    MigCardView,
    MigDeviceView,
    MigPod,
    MigRequest,
    NodeView,
    WarningKind,
)
from kubegpu.inspect.usage import NodeUsage
from kubegpu.sharing.annotations import (
    MIG_DEVICES_ANNOTATION,
    AnnotationError,
    NodeMigDevices,
    decode_mig_devices,
)
from kubegpu.sharing.claim import TERMINAL_PHASES, device_requests


@dataclass(frozen=True)
class NodeMig:
    """A node's MIG devices annotation, read: ``devices`` None when absent or unreadable."""

    devices: NodeMigDevices | None = None
    error: str = ""

    @property
    def resources(self) -> frozenset[str]:
        return self.devices.resources if self.devices is not None else frozenset()


@dataclass(frozen=True)
class MigPodFacts:
    """A pod bound to a node with MIG devices, and what it asks of their resources."""

    namespace: str
    name: str
    phase: str
    requests: Mapping[str, int]


def read_node_mig(node: Mapping[str, Any]) -> NodeMig:
    annotations = metadata_of(node).get("annotations")
    raw = annotations.get(MIG_DEVICES_ANNOTATION) if isinstance(annotations, Mapping) else None
    if raw is None:
        return NodeMig()
    try:
        return NodeMig(decode_mig_devices(raw))
    except AnnotationError as exc:
        return NodeMig(None, str(exc))


def bound_node(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return node if isinstance(node, str) else ""


def mig_pod_facts(pod: Mapping[str, Any], phase: str, mig: NodeMig) -> MigPodFacts | None:
    """What a pod bound to a node with MIG devices asks of them; None when nothing (or it has
    finished)."""
    if phase in TERMINAL_PHASES:
        return None
    requests = device_requests(pod, mig.resources)
    if not requests:
        return None
    meta = metadata_of(pod)
    return MigPodFacts(
        str(meta.get("namespace") or "default"), str(meta.get("name") or "?"), phase, requests
    )


def node_pod_keys(view: NodeView) -> set[str]:
    """Every pod the node's view shows: on cards, without a card, on MIG devices."""
    keys = {p.key for c in view.cards for p in c.pods} | {u.key for u in view.unplaced}
    keys |= {p.key for c in view.mig_cards for d in c.devices for p in d.pods}
    return keys | {r.key for r in view.mig_requests}


def with_mig(
    view: NodeView,
    mig: NodeMig,
    pods: list[MigPodFacts],
    usage: NodeUsage | None,
    warnings: list[DriftWarning],
) -> NodeView:
    """``view`` with the node's cards in MIG mode, their holders and the pods asking for them;
    unchanged for a node without the annotation."""
    name = view.name
    if mig.error:
        warnings.append(
            DriftWarning(
                WarningKind.INVALID_MIG_DEVICES,
                f"node {name}: {mig.error}; its MIG devices are unknown",
                node=name,
            )
        )
        return replace(view, mig_error=mig.error)
    if mig.devices is None:
        return view
    phases = {(p.namespace, p.name): p.phase for p in pods}
    named: Counter[tuple[str, str, str]] = Counter()  # namespace, pod, resource
    cards: list[MigCardView] = []
    for card in mig.devices.gpus:
        devices: list[MigDeviceView] = []
        for device in card.devices:
            holders = sorted(usage.mig_pods.get(device.uuid, ())) if usage is not None else []
            for namespace, pod in holders:
                named[(namespace, pod, device.resource)] += 1
            on_device = tuple(MigPod(ns, pod, phases.get((ns, pod), "")) for ns, pod in holders)
            devices.append(
                MigDeviceView(
                    device.uuid,
                    device.profile,
                    device.start,
                    device.slices,
                    device.memory_mib,
                    device.gpu_instance_id,
                    device.resource,
                    device.healthy,
                    on_device,
                )
            )
            if on_device and not device.healthy:
                warnings.append(
                    DriftWarning(
                        WarningKind.UNHEALTHY_CARD_IN_USE,
                        f"node {name} card {card.index} MIG device {device.uuid} "
                        f"({device.profile}) is unhealthy and still holds "
                        f"{', '.join(p.key for p in on_device)}",
                        node=name,
                        uuid=device.uuid,
                    )
                )
        cards.append(
            MigCardView(
                card.index, card.uuid, card.model, card.memory_mib, card.healthy, tuple(devices)
            )
        )
    kinds = _resource_kinds(mig.devices)
    requests: list[MigRequest] = []
    for facts in sorted(pods, key=lambda f: (f.namespace, f.name)):
        for resource, count in sorted(facts.requests.items()):
            left = count - named[(facts.namespace, facts.name, resource)]
            if left > 0:
                profile, memory_mib = kinds[resource]
                requests.append(
                    MigRequest(
                        facts.namespace,
                        facts.name,
                        facts.phase,
                        resource,
                        profile,
                        left,
                        memory_mib,
                    )
                )
    shown = replace(view, mig_cards=tuple(cards), mig_requests=tuple(requests))
    return replace(shown, totals=replace(view.totals, pods=len(node_pod_keys(shown))))


def _resource_kinds(devices: NodeMigDevices) -> dict[str, tuple[str, int]]:
    """Resource -> the profile of its MIG devices and one device's memory. A resource holds
    one kind (``mixed``: one per profile; ``single``: one type per node); should it hold more,
    the profiles are joined and the memory is the smallest."""
    profiles: dict[str, set[str]] = {}
    memory: dict[str, int] = {}
    for card in devices.gpus:
        for device in card.devices:
            if device.resource:
                profiles.setdefault(device.resource, set()).add(device.profile)
                memory[device.resource] = min(
                    memory.get(device.resource, device.memory_mib), device.memory_mib
                )
    return {r: ("/".join(sorted(p)), memory[r]) for r, p in profiles.items()}


def mig_in_namespace(view: NodeView, namespace: str) -> NodeView:
    """``view`` with only ``namespace``'s pods on its MIG devices and in its MIG requests."""
    cards = tuple(
        replace(
            card,
            devices=tuple(
                replace(d, pods=tuple(p for p in d.pods if p.namespace == namespace))
                for d in card.devices
            ),
        )
        for card in view.mig_cards
    )
    requests = tuple(r for r in view.mig_requests if r.namespace == namespace)
    return replace(view, mig_cards=cards, mig_requests=requests)
