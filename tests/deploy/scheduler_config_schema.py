"""A strict schema for ``kubescheduler.config.k8s.io/v1`` ``KubeSchedulerConfiguration``.

kubernetes-validate ships the API objects' schemas only, not the component configs, so a
misspelt key in a scheduler config (``percentageOfNodeToScore``, ``managedResource``) would pass
every other check here and only fail when kube-scheduler, which decodes its config strictly,
refuses to start. This schema is transcribed from the v1 Go types (``k8s.io/kube-scheduler``
``config/v1/types.go`` and ``k8s.io/component-base`` ``config/v1alpha1/types.go``; the JSON keys
are the fields' ``json`` tags) and the parts of kube-scheduler's config validation our files
touch. Every object forbids keys it does not list.

It covers the fields present in every release install.md supports (1.28 to 1.37); fields that
exist only behind newer feature gates (``percentageOfPlacementsToScore``, the placement
extension points) are left out on purpose, so a file using them fails here instead of on an
older cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jsonschema

API_VERSION = "kubescheduler.config.k8s.io/v1"
KIND = "KubeSchedulerConfiguration"

# metav1.Duration is Go's time.ParseDuration syntax: "10s", "1m30s", "500ms", or "0".
_DURATION = r"^(0|([0-9]+(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+)$"
# []byte fields are base64 in JSON/YAML.
_BASE64 = r"^[A-Za-z0-9+/]*={0,2}$"
_INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
_INT64 = {"type": "integer"}


def _object(properties: Mapping[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
    }


_PLUGIN = _object({"name": {"type": "string", "minLength": 1}, "weight": _INT32}, ("name",))
_PLUGIN_SET = _object(
    {
        "enabled": {"type": "array", "items": _PLUGIN},
        "disabled": {"type": "array", "items": _PLUGIN},
    }
)
# Extension points of v1.Plugins present since 1.26 (preEnqueue is the newest of them).
EXTENSION_POINTS = (
    "preEnqueue",
    "queueSort",
    "preFilter",
    "filter",
    "postFilter",
    "preScore",
    "score",
    "reserve",
    "permit",
    "preBind",
    "bind",
    "postBind",
    "multiPoint",
)

_PROFILE = _object(
    {
        "schedulerName": {"type": "string", "minLength": 1},
        "percentageOfNodesToScore": {**_INT32, "minimum": 0, "maximum": 100},
        "plugins": _object({point: _PLUGIN_SET for point in EXTENSION_POINTS}),
        "pluginConfig": {
            "type": "array",
            "items": _object(
                # args is a runtime.RawExtension: each plugin decodes (and checks) its own.
                {"name": {"type": "string", "minLength": 1}, "args": {"type": "object"}},
                ("name",),
            ),
        },
    }
)

_TLS_CONFIG = _object(
    {
        "insecure": {"type": "boolean"},
        "serverName": {"type": "string"},
        "certFile": {"type": "string"},
        "keyFile": {"type": "string"},
        "caFile": {"type": "string"},
        "certData": {"type": "string", "pattern": _BASE64},
        "keyData": {"type": "string", "pattern": _BASE64},
        "caData": {"type": "string", "pattern": _BASE64},
    }
)

_EXTENDER = _object(
    {
        "urlPrefix": {"type": "string", "pattern": r"^https?://"},
        "filterVerb": {"type": "string"},
        "preemptVerb": {"type": "string"},
        "prioritizeVerb": {"type": "string"},
        "weight": _INT64,
        "bindVerb": {"type": "string"},
        "enableHTTPS": {"type": "boolean"},
        "tlsConfig": _TLS_CONFIG,
        "httpTimeout": {"type": "string", "pattern": _DURATION},
        "nodeCacheCapable": {"type": "boolean"},
        "managedResources": {
            "type": "array",
            "items": _object(
                {"name": {"type": "string"}, "ignoredByScheduler": {"type": "boolean"}},
                ("name",),
            ),
        },
        "ignorable": {"type": "boolean"},
    },
    ("urlPrefix",),
)

_LEADER_ELECTION = _object(
    {
        "leaderElect": {"type": "boolean"},
        "leaseDuration": {"type": "string", "pattern": _DURATION},
        "renewDeadline": {"type": "string", "pattern": _DURATION},
        "retryPeriod": {"type": "string", "pattern": _DURATION},
        "resourceLock": {"type": "string", "enum": ["leases"]},
        "resourceName": {"type": "string"},
        "resourceNamespace": {"type": "string"},
    }
)

_CLIENT_CONNECTION = _object(
    {
        "kubeconfig": {"type": "string"},
        "acceptContentTypes": {"type": "string"},
        "contentType": {"type": "string"},
        "qps": {"type": "number"},
        "burst": _INT32,
    }
)

SCHEMA: dict[str, Any] = _object(
    {
        "apiVersion": {"const": API_VERSION},
        "kind": {"const": KIND},
        "parallelism": {**_INT32, "minimum": 1},
        "leaderElection": _LEADER_ELECTION,
        "clientConnection": _CLIENT_CONNECTION,
        # componentbaseconfigv1alpha1.DebuggingConfiguration, inlined.
        "enableProfiling": {"type": "boolean"},
        "enableContentionProfiling": {"type": "boolean"},
        "percentageOfNodesToScore": {**_INT32, "minimum": 0, "maximum": 100},
        "podInitialBackoffSeconds": {**_INT64, "minimum": 1},
        "podMaxBackoffSeconds": _INT64,
        "profiles": {"type": "array", "items": _PROFILE},
        "extenders": {"type": "array", "items": _EXTENDER},
        "delayCacheUntilActive": {"type": "boolean"},
    },
    ("apiVersion", "kind"),
)

# An extended resource name: a domain-prefixed name outside kubernetes.io (validation's
# IsExtendedResourceName; "requests." prefixes are quota names, not resources).
_EXTENDED_RESOURCE = re.compile(
    r"^(?!requests\.)(?![^/]*kubernetes\.io/)"
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def problems(doc: Mapping[str, Any]) -> list[str]:
    """Everything kube-scheduler would refuse in ``doc``, each naming its path; empty if none.

    Schema first (unknown keys, wrong types), then the cross-field rules of kube-scheduler's
    ``ValidateKubeSchedulerConfiguration`` that apply to the fields above.
    """
    validator = jsonschema.Draft202012Validator(SCHEMA)
    found = [
        f"{'.'.join(str(p) for p in error.absolute_path) or '(top)'}: {error.message}"
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    ]
    if found:
        return found
    names = [p.get("schedulerName", "default-scheduler") for p in doc.get("profiles", [])]
    for name in {n for n in names if names.count(n) > 1}:
        found.append(f"profiles: schedulerName {name!r} is used more than once")
    initial = doc.get("podInitialBackoffSeconds", 1)
    if doc.get("podMaxBackoffSeconds", 10) < initial:
        found.append("podMaxBackoffSeconds: must be at least podInitialBackoffSeconds")
    binders = 0
    managed: set[str] = set()
    for i, extender in enumerate(doc.get("extenders", [])):
        where = f"extenders.{i}"
        if extender.get("prioritizeVerb") and extender.get("weight", 0) <= 0:
            found.append(f"{where}.weight: must have a positive weight applied to it")
        binders += bool(extender.get("bindVerb"))
        for j, resource in enumerate(extender.get("managedResources", [])):
            name = resource["name"]
            if not _EXTENDED_RESOURCE.match(name):
                found.append(
                    f"{where}.managedResources.{j}.name: {name!r} is not an extended resource name"
                )
            if name in managed:
                found.append(f"{where}.managedResources.{j}.name: {name!r} is managed twice")
            managed.add(name)
    if binders > 1:
        found.append("extenders: only one extender can implement bind")
    return found
