"""What each API verb does to the store, with the real API server's rules.

Each function validates its input, runs its checks and its write inside one store transaction
(so a check and the write it guards are atomic, as etcd's compare-and-swap makes them), and
raises :class:`StatusError` with the code and reason the real server would use. The HTTP layer
only parses requests and renders results.
"""

from __future__ import annotations

import copy
import random
import re
from datetime import timedelta
from typing import Any

from kubegpu.testing.apiserver import errors
from kubegpu.testing.apiserver.errors import StatusError, bad_request
from kubegpu.testing.apiserver.patches import json_patch, merge_patch, strategic_merge_patch
from kubegpu.testing.apiserver.resources import ResourceType
from kubegpu.testing.apiserver.selectors import is_label_key, is_label_value
from kubegpu.testing.apiserver.store import Object, Store, format_time, resolve

PATCH_JSON = "application/json-patch+json"
PATCH_MERGE = "application/merge-patch+json"
PATCH_STRATEGIC = "application/strategic-merge-patch+json"
PATCH_APPLY = "application/apply-patch+yaml"

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The real server's limit on all annotations of one object together.
ANNOTATIONS_MAX_BYTES = 256 * 1024
# Pod spec fields an update may change (PodSpec validation); everything else is immutable.
POD_MUTABLE_SPEC = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

SUCCESS_CREATED: dict[str, Any] = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Success",
    "code": 201,
}


def create(store: Store, rtype: ResourceType, namespace: str, body: Any) -> Object:
    obj = _check_body(rtype, body)
    meta = obj["metadata"]
    _check_namespace(rtype, namespace, meta)
    if meta.get("resourceVersion"):
        raise bad_request("resourceVersion should not be set on objects to be created")
    with store.transaction():
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise errors.invalid(
                    rtype.kind,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required",
                )
            meta["name"] = _generate_name(store, rtype, namespace, prefix)
        name = meta["name"]
        _validate(rtype, obj)
        if rtype.namespaced and store.current(resolve("namespaces"), "", namespace) is None:
            raise errors.not_found("namespaces", namespace)
        if store.current(rtype, namespace, name) is not None:
            raise errors.already_exists(rtype.plural, name, rtype.group)
        store.check_faults(rtype, namespace, name)
        for server_owned in ("uid", "creationTimestamp", "deletionTimestamp", "generation"):
            meta.pop(server_owned, None)
        store.stamp_new(meta, None)
        _prepare_for_create(rtype, obj)
        return store.commit(rtype, namespace, name, obj)


def update(
    store: Store,
    rtype: ResourceType,
    namespace: str,
    name: str,
    body: Any,
    *,
    subresource: str | None = None,
) -> Object:
    """PUT. ``metadata.resourceVersion``, when set, is a precondition (409 when stale)."""
    obj = _check_body(rtype, body)
    meta = obj["metadata"]
    _check_namespace(rtype, namespace, meta)
    if meta.get("name", name) != name:
        raise bad_request(
            f"the name of the object ({meta.get('name')}) does not match "
            f"the name on the URL ({name})"
        )
    meta["name"] = name
    with store.transaction():
        old = store.current(rtype, namespace, name)
        if old is None:
            raise errors.not_found(rtype.plural, name, rtype.group)
        wanted = meta.get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise errors.stale(rtype.plural, name, rtype.group)
        # A uid in the body is a precondition too: it catches writes meant for an object that
        # has since been deleted and recreated under the same name.
        _check_preconditions(rtype, name, old, {"uid": meta.get("uid")})
        new = _next_state(rtype, old, obj, subresource)
        _validate(rtype, new)
        if rtype.kind == "Pod" and subresource is None:
            _check_pod_spec_update(name, old, new)
        store.check_faults(rtype, namespace, name)
        if _same(old, new):
            # A no-op write does not bump the version nor wake watchers, as in etcd3's store.
            return copy.deepcopy(old)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            # The last finalizer went away from an object already being deleted.
            return store.commit(rtype, namespace, name, None)
        return store.commit(rtype, namespace, name, new)


def patch(
    store: Store,
    rtype: ResourceType,
    namespace: str,
    name: str,
    content_type: str,
    body: Any,
    *,
    subresource: str | None = None,
) -> Object:
    """PATCH: apply the patch to the stored object, then update with the result.

    The patched object keeps the stored resourceVersion unless the patch sets one, so a patch
    carrying ``metadata.resourceVersion`` is a precondition (409 when stale) and one without is
    unconditional, as on the real server.
    """
    with store.transaction():
        old = store.current(rtype, namespace, name)
        if old is None:
            raise errors.not_found(rtype.plural, name, rtype.group)
        if content_type == PATCH_MERGE:
            if not isinstance(body, dict):
                raise bad_request("merge patch must be a JSON object")
            patched = merge_patch(old, body)
        elif content_type == PATCH_STRATEGIC:
            patched = strategic_merge_patch(old, body)
        elif content_type == PATCH_JSON:
            patched = json_patch(old, body)
        elif content_type == PATCH_APPLY:
            raise StatusError(
                "UnsupportedMediaType",
                "server-side apply is not implemented by the fake API server",
            )
        else:
            raise StatusError(
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: "
                f"accepted media types include: {PATCH_JSON}, {PATCH_MERGE}, {PATCH_STRATEGIC}",
            )
        if not isinstance(patched, dict):
            raise errors.invalid(rtype.kind, name, "<root>", "patch result is not an object")
        return update(store, rtype, namespace, name, patched, subresource=subresource)


def delete(
    store: Store,
    rtype: ResourceType,
    namespace: str,
    name: str,
    options: Any,
    *,
    grace_period_s: int | None = None,
    graceful_pods: bool = False,
) -> Object:
    """DELETE with optional ``preconditions`` (uid, resourceVersion) from DeleteOptions.

    With ``graceful_pods``, a pod that is bound and still running is only marked for deletion
    (``deletionTimestamp`` plus grace period), as the real server does; it goes when a delete
    with grace period 0 follows, which is what the kubelet sends once the containers stopped.
    """
    if isinstance(options, dict):
        preconditions = options.get("preconditions") or {}
        if grace_period_s is None and options.get("gracePeriodSeconds") is not None:
            grace_period_s = int(options["gracePeriodSeconds"])
    else:
        preconditions = {}
    with store.transaction():
        old = store.current(rtype, namespace, name)
        if old is None:
            raise errors.not_found(rtype.plural, name, rtype.group)
        _check_preconditions(rtype, name, old, preconditions)
        store.check_faults(rtype, namespace, name)
        if graceful_pods and rtype.kind == "Pod":
            grace = _pod_grace_period_s(old, grace_period_s)
            if grace > 0:
                current = old["metadata"].get("deletionGracePeriodSeconds")
                if current is not None and current <= grace:
                    return copy.deepcopy(old)
                marked = copy.deepcopy(old)
                deadline = store.clock() + timedelta(seconds=grace)
                marked["metadata"]["deletionTimestamp"] = format_time(deadline)
                marked["metadata"]["deletionGracePeriodSeconds"] = grace
                return store.commit(rtype, namespace, name, marked)
        if old["metadata"].get("finalizers"):
            # Finalizers hold the object until whoever owns them removes them.
            if old["metadata"].get("deletionTimestamp"):
                return copy.deepcopy(old)
            marked = copy.deepcopy(old)
            marked["metadata"]["deletionTimestamp"] = format_time(store.clock())
            marked["metadata"]["deletionGracePeriodSeconds"] = 0
            return store.commit(rtype, namespace, name, marked)
        if rtype.plural == "namespaces":
            # Stands in for the namespace controller, which empties a namespace before it goes.
            for other, other_name in store.keys_in_namespace(name):
                store.commit(other, name, other_name, None)
        return store.commit(rtype, namespace, name, None)


def _pod_grace_period_s(pod: Object, requested: int | None) -> int:
    """The grace period the real pod strategy (CheckGracefulDelete) grants."""
    if not (pod.get("spec") or {}).get("nodeName"):
        return 0  # never scheduled: nothing to stop
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return 0
    if requested is not None:
        return max(requested, 0)
    return int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))


def bind(store: Store, namespace: str, name: str | None, body: Any) -> dict[str, Any]:
    """POST pods/<name>/binding (or the legacy bindings collection when ``name`` is None).

    Sets ``spec.nodeName``, copies the binding's annotations onto the pod and marks it
    PodScheduled, exactly once: a bound pod gives 409, as does a stale uid or resourceVersion
    precondition in the binding's metadata.
    """
    pods = resolve("pods")
    if not isinstance(body, dict):
        raise bad_request("the body of a binding must be a JSON object")
    if body.get("kind", "Binding") != "Binding":
        raise bad_request(f"expected kind Binding, got {body.get('kind')!r}")
    meta = body.get("metadata") or {}
    pod_name = meta.get("name") or name
    if name is not None and meta.get("name", name) != name:
        raise bad_request("name in URL does not match name in Binding object")
    if not pod_name:
        raise errors.invalid("Binding", "", "metadata.name", "Required value: name is required")
    target = body.get("target") or {}
    if target.get("kind", "") not in ("", "Node"):
        raise errors.invalid(
            "Binding",
            pod_name,
            "target.kind",
            f'Unsupported value: "{target.get("kind")}": supported values: "Node", ""',
        )
    node = target.get("name")
    if not node:
        raise errors.invalid("Binding", pod_name, "target.name", "Required value")
    with store.transaction():
        pod = store.current(pods, namespace, pod_name)
        if pod is None:
            raise errors.not_found("pods", pod_name)
        _check_preconditions(pods, pod_name, pod, meta)
        if pod["metadata"].get("deletionTimestamp"):
            raise errors.conflict(
                "pods/binding",
                pod_name,
                f"pod {pod_name} is being deleted, cannot be assigned to a host",
            )
        bound_to = pod.get("spec", {}).get("nodeName")
        if bound_to:
            raise errors.conflict(
                "pods/binding", pod_name, f'pod {pod_name} is already assigned to node "{bound_to}"'
            )
        store.check_faults(pods, namespace, pod_name)
        new = copy.deepcopy(pod)
        new.setdefault("spec", {})["nodeName"] = node
        if meta.get("annotations"):
            new["metadata"].setdefault("annotations", {}).update(meta["annotations"])
        conditions = new.setdefault("status", {}).setdefault("conditions", [])
        conditions[:] = [c for c in conditions if c.get("type") != "PodScheduled"]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": format_time(store.clock()),
            }
        )
        store.commit(pods, namespace, pod_name, new)
    return dict(SUCCESS_CREATED)


def _check_preconditions(
    rtype: ResourceType, name: str, obj: Object, preconditions: dict[str, Any]
) -> None:
    uid = preconditions.get("uid")
    if uid and uid != obj["metadata"]["uid"]:
        raise errors.conflict(
            rtype.plural,
            name,
            f"Precondition failed: UID in precondition: {uid}, "
            f"UID in object meta: {obj['metadata']['uid']}",
            rtype.group,
        )
    rv = preconditions.get("resourceVersion")
    if rv and rv != obj["metadata"]["resourceVersion"]:
        raise errors.conflict(
            rtype.plural,
            name,
            f"Precondition failed: ResourceVersion in precondition: {rv}, "
            f"ResourceVersion in object meta: "
            f"{obj['metadata']['resourceVersion']}",
            rtype.group,
        )


def _check_body(rtype: ResourceType, body: Any) -> Object:
    if not isinstance(body, dict):
        raise bad_request(f"the body of a {rtype.kind} must be a JSON object")
    obj = copy.deepcopy(body)
    kind = obj.setdefault("kind", rtype.kind)
    api_version = obj.setdefault("apiVersion", rtype.api_version)
    if kind != rtype.kind or api_version != rtype.api_version:
        raise bad_request(
            f"the object provided is unrecognized (must be of type {rtype.kind}): "
            f"got {api_version}/{kind}"
        )
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise bad_request("metadata must be a JSON object")
    return obj


def _check_namespace(rtype: ResourceType, namespace: str, meta: dict[str, Any]) -> None:
    if not rtype.namespaced:
        meta.pop("namespace", None)
        return
    if meta.get("namespace", namespace) != namespace:
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    meta["namespace"] = namespace


def _generate_name(store: Store, rtype: ResourceType, namespace: str, prefix: str) -> str:
    prefix = prefix[: 63 - 5]
    while True:
        name = prefix + "".join(random.choices(_GENERATE_ALPHABET, k=5))
        if store.current(rtype, namespace, name) is None:
            return name


def _validate(rtype: ResourceType, obj: Object) -> None:
    meta = obj["metadata"]
    name = meta.get("name", "")
    pattern = DNS_LABEL if rtype.plural == "namespaces" else DNS_SUBDOMAIN
    if not pattern.match(name) or len(name) > 253:
        raise errors.invalid(
            rtype.kind,
            name,
            "metadata.name",
            f'Invalid value: "{name}": a lowercase RFC 1123 name must consist of '
            "lower case alphanumeric characters, '-' or '.'",
        )
    labels = meta.get("labels") or {}
    for key, value in labels.items():
        if not is_label_key(key):
            raise errors.invalid(
                rtype.kind,
                name,
                "metadata.labels",
                f'Invalid value: "{key}": not a valid label key',
            )
        if not isinstance(value, str) or not is_label_value(value):
            raise errors.invalid(
                rtype.kind,
                name,
                "metadata.labels",
                f'Invalid value: "{value}": a valid label must be an empty string '
                "or consist of alphanumeric characters, '-', '_' or '.', and "
                "must start and end with an alphanumeric character (at most 63)",
            )
    annotations = meta.get("annotations") or {}
    size = 0
    for key, value in annotations.items():
        if not is_label_key(key) or not isinstance(value, str):
            raise errors.invalid(
                rtype.kind,
                name,
                "metadata.annotations",
                f'Invalid value: "{key}": annotations are string to string',
            )
        size += len(key) + len(value.encode())
    if size > ANNOTATIONS_MAX_BYTES:
        raise errors.invalid(
            rtype.kind,
            name,
            "metadata.annotations",
            f"Too long: must have at most {ANNOTATIONS_MAX_BYTES} bytes",
        )
    if rtype.kind == "Pod":
        containers = (obj.get("spec") or {}).get("containers")
        if not containers:
            raise errors.invalid("Pod", name, "spec.containers", "Required value")
        for i, container in enumerate(containers):
            for required in ("name", "image"):
                if not isinstance(container, dict) or not container.get(required):
                    raise errors.invalid(
                        "Pod", name, f"spec.containers[{i}].{required}", "Required value"
                    )


def _prepare_for_create(rtype: ResourceType, obj: Object) -> None:
    """Defaults and status resets the real registry applies on create."""
    if rtype.kind == "Pod":
        spec = obj.setdefault("spec", {})
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        obj["status"] = {"phase": "Pending"}
    elif rtype.kind == "Namespace":
        obj["status"] = {"phase": "Active"}
    elif rtype.kind == "ResourceQuota":
        obj.pop("status", None)
    # Nodes keep the status they are created with: the kubelet registers itself that way.


def _next_state(rtype: ResourceType, old: Object, obj: Object, subresource: str | None) -> Object:
    """The object an update stores, keeping what this endpoint may not change."""
    if subresource == "status":
        # The status endpoint changes status only (ResetObjectMetaForStatus and friends).
        new = copy.deepcopy(old)
        if "status" in obj:
            new["status"] = copy.deepcopy(obj["status"])
        else:
            new.pop("status", None)
        return new
    new = copy.deepcopy(obj)
    meta = new["metadata"]
    old_meta = old["metadata"]
    for server_owned in (
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "namespace",
    ):
        if server_owned in old_meta:
            meta[server_owned] = old_meta[server_owned]
        else:
            meta.pop(server_owned, None)
    if rtype.has_status:
        if "status" in old:
            new["status"] = copy.deepcopy(old["status"])
        else:
            new.pop("status", None)
    body_changed = {k: v for k, v in new.items() if k not in ("metadata", "status")} != {
        k: v for k, v in old.items() if k not in ("metadata", "status")
    }
    generation = old_meta.get("generation", 1)
    meta["generation"] = generation + 1 if body_changed else generation
    return new


def _check_pod_spec_update(name: str, old: Object, new: Object) -> None:
    def frozen(spec: dict[str, Any]) -> dict[str, Any]:
        spec = copy.deepcopy(spec)
        for key in POD_MUTABLE_SPEC:
            spec.pop(key, None)
        for group in ("containers", "initContainers"):
            for container in spec.get(group) or []:
                container.pop("image", None)
        return spec

    if frozen(old.get("spec") or {}) != frozen(new.get("spec") or {}):
        raise errors.invalid(
            "Pod",
            name,
            "spec",
            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
            "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` "
            "(only additions to existing tolerations), `spec.terminationGracePeriodSeconds`",
        )


def _same(old: Object, new: Object) -> bool:
    def bare(obj: Object) -> Object:
        obj = copy.deepcopy(obj)
        obj["metadata"].pop("resourceVersion", None)
        return obj

    return bare(old) == bare(new)
