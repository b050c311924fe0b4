"""The extender's pod port on lightkube: read a pod, merge annotations onto it, bind it.

Implements :class:`kubegpu.sharing.podstore.PodStore`. The annotation patch carries the
resourceVersion the caller read, so a pod that changed meanwhile answers 409 (raised as
:class:`~kubegpu.sharing.podstore.PodConflict`) and the caller decides again on fresh data. The
Binding goes to the pods/binding subresource with the pod's UID as a precondition, exactly what
kube-scheduler's default binder sends. lightkube's and httpx's errors stop here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast

import httpx2 as httpx
import lightkube
from lightkube import ApiError
from lightkube.generic_resource import GenericNamespacedStatus
from lightkube.resources.core_v1 import Pod, PodBinding
from lightkube.types import PatchType

from kubegpu.sharing.podstore import PodConflict, PodGone, PodStoreError


class _BindingRequest(GenericNamespacedStatus):
    """pods/binding with an untyped reply: kube-apiserver answers a Binding with a v1.Status,
    which lightkube's typed PodBinding would fail to decode after the bind succeeded."""

    _api_info = PodBinding._api_info


@asynccontextmanager
async def translated() -> AsyncIterator[None]:
    try:
        yield
    except ApiError as exc:
        code, message = exc.status.code, str(exc.status.message)
        kind = {409: PodConflict, 404: PodGone}.get(code or 0, PodStoreError)
        raise kind(message, code) from exc
    except httpx.HTTPError as exc:
        raise PodStoreError(str(exc)) from exc


def _json(pod: Any) -> dict[str, Any]:
    out: dict[str, Any] = pod.to_dict()
    return out


class ApiPodStore:
    def __init__(self, client: lightkube.AsyncClient) -> None:
        self.client = client

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        async with translated():
            return _json(await self.client.get(Pod, name, namespace=namespace))

    async def patch_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str,
    ) -> dict[str, Any]:
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        async with translated():
            pod = await self.client.patch(
                Pod, name, {"metadata": metadata}, namespace=namespace, patch_type=PatchType.MERGE
            )
        return _json(pod)

    async def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        *,
        annotations: Mapping[str, str] | None = None,
        resource_version: str = "",
    ) -> None:
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if annotations:
            metadata["annotations"] = dict(annotations)
        if resource_version:
            metadata["resourceVersion"] = resource_version
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        binding = cast(Any, _BindingRequest)(body)  # dict-built generic resource
        async with translated():
            await self.client.create(binding, name=name, namespace=namespace)
