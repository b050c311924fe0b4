"""RBAC's authorizer, as far as the shipped rules need it: whether a request the fake API server
recorded is one a set of Role and ClusterRole rules grants. Tests run a real component against
the fake API server and check every request it made against the rules under ``deploy/``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from kubegpu.testing.apiserver.server import RequestRecord

# The API group of each resource a component may touch that is not in the core group (RBAC
# rules name groups; the request log names only resources).
API_GROUPS = {
    "leases": "coordination.k8s.io",
    "resourceslices": "resource.k8s.io",
    "resourceclaims": "resource.k8s.io",
    "poddisruptionbudgets": "policy",
}
Rule = tuple[str, dict[str, Any]]  # (namespace of a Role, "" for a ClusterRole; the rule)


def rbac_rules(path: Path) -> Iterator[Rule]:
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") in ("Role", "ClusterRole"):
            namespace = doc["metadata"].get("namespace", "") if doc["kind"] == "Role" else ""
            for rule in doc["rules"]:
                yield namespace, rule


def allowed(rules: list[Rule], request: RequestRecord) -> bool:
    """Whether RBAC's authorizer grants ``request`` under ``rules`` (no wildcards: a test in
    tests/deploy forbids them). resourceNames narrow only requests that name an object; a list
    or watch is not granted by a named rule."""
    group = API_GROUPS.get(request.resource.split("/")[0], "")
    for namespace, rule in rules:
        if namespace and request.namespace != namespace:
            continue
        if group not in rule["apiGroups"] or request.resource not in rule["resources"]:
            continue
        if request.verb not in rule["verbs"]:
            continue
        names = rule.get("resourceNames")
        if names and request.name not in names:
            continue
        return True
    return False
