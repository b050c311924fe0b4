"""The three patch formats of the Kubernetes API, applied to plain JSON values.

* JSON merge patch (RFC 7386): objects merge, ``null`` deletes, lists are replaced.
* Strategic merge patch: as merge patch, but lists of objects that Kubernetes declares with a
  ``patchMergeKey`` (containers by ``name``, conditions by ``type`` ...) are merged element by
  element, ``finalizers`` is merged as a set, and the ``$patch`` / ``$retainKeys`` /
  ``$deleteFromPrimitiveList`` directives are honoured. The merge keys are looked up by field name
  alone, which is exact for the pod, node and namespace fields this fake serves.
* JSON patch (RFC 6902), including ``test``.

Every function returns a new value and never mutates its inputs.
"""

from __future__ import annotations

import copy
from typing import Any

from kubegpu.testing.apiserver.errors import StatusError, bad_request

# Field name -> merge key, from the patchMergeKey struct tags of k8s.io/api/core/v1.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "resourceClaims": "name",
    "topologySpreadConstraints": "topologyKey",
}
# Lists of scalars that strategic merge treats as sets.
MERGE_SETS = frozenset({"finalizers"})


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch must be a JSON object")
    return _strategic_object(target if isinstance(target, dict) else {}, patch)


def _strategic_object(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    result = copy.deepcopy(target)
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            current = result.get(name)
            if isinstance(current, list) and isinstance(value, list):
                result[name] = [v for v in current if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            current = result.get(key)
            merged = _strategic_object(current if isinstance(current, dict) else {}, value)
            if value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_keyed_list(result.get(key), value, MERGE_KEYS[key])
        elif isinstance(value, list) and key in MERGE_SETS:
            current = result.get(key)
            base = list(current) if isinstance(current, list) else []
            result[key] = base + [v for v in value if v not in base]
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_keyed_list(target: Any, patch: list[Any], merge_key: str) -> list[Any]:
    result: list[Any] = copy.deepcopy(target) if isinstance(target, list) else []
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise bad_request(f"map in strategic merge list lacks the merge key {merge_key!r}")
        index = next(
            (
                i
                for i, cur in enumerate(result)
                if isinstance(cur, dict) and cur.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append({k: copy.deepcopy(v) for k, v in item.items() if v is not None})
        else:
            result[index] = _strategic_object(result[index], item)
    return result


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902. A failed ``test`` or a missing path is 422, like the real server."""
    if not isinstance(operations, list):
        raise bad_request("json patch must be a JSON array of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid json patch operation: {op!r}")
        kind = op["op"]
        path = _pointer(op["path"])
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(_required(op, "value")))
        elif kind == "remove":
            doc, _ = _remove(doc, path)
        elif kind == "replace":
            doc, _ = _remove(doc, path)
            doc = _add(doc, path, copy.deepcopy(_required(op, "value")))
        elif kind == "move":
            doc, value = _remove(doc, _pointer(_required(op, "from")))
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, _pointer(_required(op, "from")))))
        elif kind == "test":
            if _get(doc, path) != _required(op, "value"):
                raise _unprocessable(f"testing value {op['path']} failed: test failed")
        else:
            raise bad_request(f"unexpected kind of json patch operation: {kind!r}")
    return doc


def _required(op: dict[str, Any], key: str) -> Any:
    if key not in op:
        raise bad_request(f"json patch operation {op.get('op')!r} lacks {key!r}")
    return op[key]


def _unprocessable(message: str) -> StatusError:
    return StatusError("Invalid", message, code=422)


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise bad_request(f"invalid json pointer: {path!r}")
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise _unprocessable(f"invalid array index {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not allow_end):
        raise _unprocessable(f"array index {index} out of bounds")
    return index


def _parent(doc: Any, path: list[str]) -> Any:
    node = doc
    for token in path[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, allow_end=False)]
        else:
            raise _unprocessable(f"doc is missing path: /{'/'.join(path)}")
    return node


def _get(doc: Any, path: list[str]) -> Any:
    if not path:
        return doc
    parent = _parent(doc, path)
    token = path[-1]
    if isinstance(parent, dict) and token in parent:
        return parent[token]
    if isinstance(parent, list):
        return parent[_index(parent, token, allow_end=False)]
    raise _unprocessable(f"doc is missing path: /{'/'.join(path)}")


def _add(doc: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _parent(doc, path)
    token = path[-1]
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, allow_end=True), value)
    else:
        raise _unprocessable(f"doc is missing path: /{'/'.join(path)}")
    return doc


def _remove(doc: Any, path: list[str]) -> tuple[Any, Any]:
    if not path:
        return None, doc
    parent = _parent(doc, path)
    token = path[-1]
    if isinstance(parent, dict) and token in parent:
        return doc, parent.pop(token)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, token, allow_end=False))
    raise _unprocessable(f"doc is missing path: /{'/'.join(path)}")
