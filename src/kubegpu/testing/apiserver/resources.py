"""The resource types the fake API server serves, and what is special about each.

One table instead of per-type handlers: every type gets the same verbs, and the few real
differences (cluster-scoped or not, status subresource, supported field selectors, how create
resets status) are data here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ResourceType:
    plural: str
    kind: str
    namespaced: bool
    group: str = ""
    version: str = "v1"
    # Has a /status subresource: the main resource ignores status writes and vice versa.
    has_status: bool = False
    # Field selectors the real server accepts for this type (besides metadata.name/namespace).
    fields: frozenset[str] = field(default_factory=frozenset)
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def selectable_fields(self) -> frozenset[str]:
        base = {"metadata.name", "metadata.namespace"} if self.namespaced else {"metadata.name"}
        return self.fields | base


POD_FIELDS = frozenset(
    {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    }
)
EVENT_FIELDS = frozenset(
    {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    }
)

RESOURCE_TYPES: tuple[ResourceType, ...] = (
    ResourceType(
        "nodes",
        "Node",
        namespaced=False,
        has_status=True,
        fields=frozenset({"spec.unschedulable"}),
        short_names=("no",),
    ),
    ResourceType(
        "namespaces",
        "Namespace",
        namespaced=False,
        has_status=True,
        fields=frozenset({"status.phase"}),
        short_names=("ns",),
    ),
    ResourceType(
        "pods", "Pod", namespaced=True, has_status=True, fields=POD_FIELDS, short_names=("po",)
    ),
    ResourceType("events", "Event", namespaced=True, fields=EVENT_FIELDS, short_names=("ev",)),
    ResourceType("configmaps", "ConfigMap", namespaced=True, short_names=("cm",)),
    ResourceType(
        "resourcequotas", "ResourceQuota", namespaced=True, has_status=True, short_names=("quota",)
    ),
    ResourceType("leases", "Lease", namespaced=True, group="coordination.k8s.io"),
    ResourceType(
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        namespaced=True,
        group="policy",
        has_status=True,
        short_names=("pdb",),
    ),
    # DRA objects, as the claim-budget webhook reads them (tests/webhook).
    ResourceType(
        "resourceclaims", "ResourceClaim", namespaced=True, group="resource.k8s.io", has_status=True
    ),
    ResourceType(
        "resourceslices",
        "ResourceSlice",
        namespaced=False,
        group="resource.k8s.io",
        fields=frozenset({"spec.nodeName", "spec.driver"}),
    ),
)

BY_PATH: dict[tuple[str, str, str], ResourceType] = {
    (r.group, r.version, r.plural): r for r in RESOURCE_TYPES
}
BY_PLURAL: dict[str, ResourceType] = {r.plural: r for r in RESOURCE_TYPES}
# Namespaces that exist in every cluster, so a fresh server accepts writes to them.
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
