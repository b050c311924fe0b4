"""deploy/examples/kueue, the objects docs/batch.md tells an admin to write: they hang together
(flavor, ClusterQueue, LocalQueue and Job name each other), the ClusterQueue covers every
resource the example Job's pods request (Kueue leaves a Job whose pods request an uncovered
resource queued for good) and every GPU resource kubegpu uses, the whole gang fits the quota,
and the Job's pods are a share kubegpu serves. e2e/tests/test_09_kueue.py applies them to a real
Kueue."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kubegpu.sharing.resources import RequestKind, ResourceNames, gpu_request, parse_quantity
from tests.deploy.manifests import DEPLOY, Obj, render

EXAMPLE = "examples/kueue"


def _one(objs: list[Obj], kind: str) -> Obj:
    (found,) = [o for o in objs if o["kind"] == kind]
    return found


@pytest.fixture(scope="module")
def objs() -> list[Obj]:
    return render(EXAMPLE)


def _quota(cluster_queue: Obj) -> dict[str, str]:
    (group,) = cluster_queue["spec"]["resourceGroups"]
    (flavor,) = group["flavors"]
    quota = {r["name"]: str(r["nominalQuota"]) for r in flavor["resources"]}
    # Kueue refuses a flavor whose resources differ from the group's coveredResources.
    assert list(quota) == group["coveredResources"]
    return quota


def _pod_requests(job: Obj) -> dict[str, Decimal]:
    """Per pod, every resource Kueue counts: requests, and limits where no request is given
    (Kueue, like the API server, takes a limit alone as the request)."""
    totals: dict[str, Decimal] = {}
    for container in job["spec"]["template"]["spec"]["containers"]:
        resources = container.get("resources", {})
        asked = {**resources.get("limits", {}), **resources.get("requests", {})}
        for name, value in asked.items():
            totals[name] = totals.get(name, Decimal(0)) + parse_quantity(value)
    return totals


def test_the_objects_name_each_other(objs: list[Obj]) -> None:
    assert sorted(o["kind"] for o in objs) == [
        "ClusterQueue",
        "Job",
        "LocalQueue",
        "ResourceFlavor",
    ]
    flavor, cluster_queue = _one(objs, "ResourceFlavor"), _one(objs, "ClusterQueue")
    local, job = _one(objs, "LocalQueue"), _one(objs, "Job")
    assert {o["apiVersion"] for o in (flavor, cluster_queue, local)} == {"kueue.x-k8s.io/v1beta2"}
    # Cluster-scoped: a namespace on them would be refused by the API server.
    assert "namespace" not in flavor["metadata"] and "namespace" not in cluster_queue["metadata"]
    (group,) = cluster_queue["spec"]["resourceGroups"]
    assert [f["name"] for f in group["flavors"]] == [flavor["metadata"]["name"]]
    # In v1beta2 a ClusterQueue without a namespaceSelector admits from no namespace at all.
    assert cluster_queue["spec"]["namespaceSelector"] == {}
    assert local["spec"]["clusterQueue"] == cluster_queue["metadata"]["name"]
    assert job["metadata"]["namespace"] == local["metadata"]["namespace"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == local["metadata"]["name"]


def test_the_cluster_queue_covers_every_resource_the_job_requests_and_kubegpus_gpu_resources(
    objs: list[Obj],
) -> None:
    quota = _quota(_one(objs, "ClusterQueue"))
    requested = _pod_requests(_one(objs, "Job"))
    assert set(requested) <= set(quota), sorted(set(requested) - set(quota))
    assert set(ResourceNames().all) <= set(quota)
    # Extended resources in their own unit, plain integers (MiB, milli-GPU, cards, slots).
    for name in ResourceNames().all:
        assert quota[name].isdigit(), (name, quota[name])


def test_the_whole_example_gang_fits_the_quota(objs: list[Obj]) -> None:
    quota = _quota(_one(objs, "ClusterQueue"))
    job = _one(objs, "Job")
    pods = job["spec"]["parallelism"]
    assert job["spec"]["completions"] == pods > 1
    for name, per_pod in _pod_requests(job).items():
        assert pods * per_pod <= parse_quantity(quota[name]), name


def test_the_example_jobs_pods_are_a_share_kubegpu_serves(objs: list[Obj]) -> None:
    job = _one(objs, "Job")
    template = job["spec"]["template"]
    assert template["spec"]["schedulerName"] == "kubegpu-scheduler"
    pod: dict[str, Any] = {"metadata": {"name": "worker", "namespace": "team-a"}, **template}
    request = gpu_request(pod)
    assert request.kind is RequestKind.SHARED
    assert request.gpu_memory_mib > 0 and 0 < request.compute_milli < 1000


@pytest.mark.parametrize("version", ["1.28.0", kubernetes_validate.latest_version()])
def test_the_example_job_validates_against_the_kubernetes_schemas(
    objs: list[Obj], version: str
) -> None:
    # The Kueue kinds are CRDs (tests/deploy/manifests.py SCHEMALESS); the Job is core.
    kubernetes_validate.validate(_one(objs, "Job"), version, strict=True)


def test_kueues_configuration_turns_on_what_the_docs_rely_on() -> None:
    config = yaml.safe_load((DEPLOY / EXAMPLE / "kueue-config.yaml").read_text())
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["kind"] == "Configuration"
    assert "batch/job" in config["integrations"]["frameworks"]
    assert config["waitForPodsReady"]["timeout"]
    # Not a resource of the kustomization: it is Kueue's file, not a Kubernetes object.
    kustomization = yaml.safe_load((DEPLOY / EXAMPLE / "kustomization.yaml").read_text())
    assert "kueue-config.yaml" not in kustomization["resources"]
