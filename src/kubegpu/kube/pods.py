"""Writing the extender's decision onto a pod, clearing it, and binding the pod.

The decision patch carries the resourceVersion the decision was computed from, so a pod that
changed meanwhile answers 409 and the caller decides again on fresh data. The Binding goes to
the pods/binding subresource with the pod's UID as a precondition, exactly what kube-scheduler's
default binder sends.
"""

from __future__ import annotations

from typing import Any, cast

import lightkube
from lightkube.generic_resource import GenericNamespacedStatus
from lightkube.resources.core_v1 import Pod, PodBinding
from lightkube.types import PatchType

from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION, AllocationDecision, encode_allocation


class _BindingRequest(GenericNamespacedStatus):
    """pods/binding with an untyped reply: kube-apiserver answers a Binding with a v1.Status,
    which lightkube's typed PodBinding would fail to decode after the bind succeeded."""

    _api_info = PodBinding._api_info


def _json(pod: Any) -> dict[str, Any]:
    out: dict[str, Any] = pod.to_dict()
    return out


async def record_decision(
    client: lightkube.AsyncClient,
    namespace: str,
    name: str,
    decision: AllocationDecision,
    resource_version: str | None,
) -> dict[str, Any]:
    """Write ``decision`` on the pod (409 if the pod moved past ``resource_version``); returns
    the patched pod's JSON."""
    metadata: dict[str, Any] = {"annotations": {ALLOCATION_ANNOTATION: encode_allocation(decision)}}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    pod = await client.patch(
        Pod, name, {"metadata": metadata}, namespace=namespace, patch_type=PatchType.MERGE
    )
    return _json(pod)


async def clear_decision(
    client: lightkube.AsyncClient,
    namespace: str,
    name: str,
    resource_version: str | None = None,
) -> dict[str, Any]:
    """Remove the allocation annotation (rollback after a failed binding); 409 if the pod
    moved past ``resource_version``."""
    metadata: dict[str, Any] = {"annotations": {ALLOCATION_ANNOTATION: None}}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    patch = {"metadata": metadata}
    pod = await client.patch(Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE)
    return _json(pod)


async def get_pod(client: lightkube.AsyncClient, namespace: str, name: str) -> dict[str, Any]:
    return _json(await client.get(Pod, name, namespace=namespace))


async def bind_pod(
    client: lightkube.AsyncClient, namespace: str, name: str, uid: str, node: str
) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    binding = cast(Any, _BindingRequest)(body)  # dict-built generic resource
    await client.create(binding, name=name, namespace=namespace)
