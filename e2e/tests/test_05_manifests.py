"""Every kustomize overlay in deploy/ is accepted by the real API server (server-side dry run:
admission, validation and RBAC escalation checks all run, nothing is persisted)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubegpu_e2e.cluster import Cluster
from kubegpu_e2e.kubegpu import DEPLOY, KubegpuRoles

pytestmark = pytest.mark.e2e

# deploy/examples/kueue's kinds are Kueue's CRDs: test_09_kueue.py dry-runs it once Kueue runs.
OVERLAYS = sorted(
    p.parent
    for p in DEPLOY.glob("*/*/kustomization.yaml")
    if p.parent.parent.name != "components" and p.parent != DEPLOY / "examples" / "kueue"
)

# The Prometheus operator's kinds, so the monitoring overlay has something to be checked
# against. Only the kinds are real here: their schemas are not (the operator's CRDs are not in
# any registry this suite may reach), so the fields of ServiceMonitor/PodMonitor are checked by
# tests/deploy instead (and the PrometheusRule's rules by promtool: tests/deploy and
# test_08_monitoring).
_MONITORING_CRDS = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: servicemonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names:
    kind: ServiceMonitor
    plural: servicemonitors
    singular: servicemonitor
    listKind: ServiceMonitorList
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: podmonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: PodMonitor, plural: podmonitors, singular: podmonitor}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: prometheusrules.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: PrometheusRule, plural: prometheusrules, singular: prometheusrule}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
"""


@pytest.fixture(scope="module")
def monitoring_kinds(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", "-", input=_MONITORING_CRDS)
    cluster.wait_for(
        "the monitoring kinds to be served",
        lambda: (
            {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
            <= set(
                cluster.kubectl("api-resources", "--api-group=monitoring.coreos.com").stdout.split()
            )
        ),
        timeout=60,
    )


def test_there_are_overlays_to_check() -> None:
    names = {p.name for p in OVERLAYS}
    assert {"second-scheduler", "default-scheduler", "monitoring"} <= names, names


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_overlay_is_accepted_by_the_real_api_server(
    cluster: Cluster, roles: KubegpuRoles, monitoring_kinds: None, overlay: Path
) -> None:
    # An example for an admin's own namespaces (deploy/examples/quota: team-a) needs them to
    # exist, as on the admin's cluster.
    rendered = yaml.safe_load_all(cluster.kubectl("kustomize", str(overlay)).stdout)
    documents = [d for d in rendered if d]
    own = {d["metadata"]["name"] for d in documents if d["kind"] == "Namespace"}
    for namespace in {d["metadata"].get("namespace") for d in documents} - own - {None}:
        if cluster.kubectl("get", "namespace", namespace, check=False).returncode != 0:
            cluster.kubectl("create", "namespace", namespace)
    result = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "--server-side",
        "--force-conflicts",  # ownership of fields set by the RBAC apply is not validity
        "-k",
        str(overlay),
        check=False,
    )
    assert result.returncode == 0, f"{overlay}:\n{result.stderr}\n{result.stdout}"
    assert "dry run" in result.stdout, result.stdout
