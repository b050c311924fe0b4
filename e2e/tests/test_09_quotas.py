"""GPU quotas enforced by the real API server (docs/quotas.md): the `deploy/examples/quota`
ResourceQuota, rendered by the real kubectl's kustomize with only its namespace changed (an
overlay naming the example as its base), caps a namespace's shares and whole GPUs. A pod within
the budget is admitted and runs; one past it is refused at creation with the API server's own
quota message, and never exists; a pod that ends gives its share back."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from kubegpu_e2e.cluster import Cluster
from kubegpu_e2e.kubegpu import DEPLOY, KubegpuRoles
from kubegpu_e2e.workloads import (
    SCHEDULER,
    WHOLE,
    container,
    create,
    pod,
    share,
    wait_running,
)

pytestmark = pytest.mark.e2e

EXAMPLE = DEPLOY / "examples" / "quota"
MEMORY = "requests.kubegpu.io/gpu-memory"
GPUS = "requests.nvidia.com/gpu"


def apply_example_quota(cluster: Cluster, namespace: str, folder: Path) -> dict[str, Any]:
    """The example applied to ``namespace`` through an overlay that changes only that, as the
    example's comment tells an admin to; returns the quota once the controller has set its
    hard limits (admission refuses every pod of the namespace until then)."""
    folder.mkdir()
    (folder / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"namespace: {namespace}\n"
        "resources:\n"
        f"  - {os.path.relpath(EXAMPLE, folder)}\n"
    )
    cluster.kubectl("apply", "-k", str(folder))
    return dict(
        cluster.wait_for(
            "the example quota's status",
            lambda: (
                (q := cluster.get("resourcequota", "gpu", "-n", namespace))["status"].get("hard")
                and q
            ),
            timeout=60,
        )
    )


def refused(cluster: Cluster, manifest: dict[str, Any]) -> str:
    """The API server's refusal of ``manifest`` as kubectl prints it; fails if it was created."""
    done = cluster.kubectl("create", "-f", "-", input=json.dumps(manifest), check=False)
    assert done.returncode != 0, f"created: {done.stdout}"
    meta = manifest["metadata"]
    gone = cluster.kubectl("get", "pod", "-n", meta["namespace"], meta["name"], check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout
    return done.stderr.strip()


def used(cluster: Cluster, namespace: str, resource: str) -> str:
    status = cluster.get("resourcequota", "gpu", "-n", namespace)["status"]
    return str(status.get("used", {}).get(resource, ""))


def test_a_share_past_the_namespaces_gpu_memory_is_refused_by_the_api_server(
    cluster: Cluster, roles: KubegpuRoles, namespace: str, tmp_path: Path
) -> None:
    quota = apply_example_quota(cluster, namespace, tmp_path / "quota")
    assert quota["spec"]["hard"] == {
        GPUS: "4",
        MEMORY: "81920",
        "requests.kubegpu.io/gpu-compute": "2500",
        "requests.kubegpu.io/gpu-shared": "16",
    }
    # 60 GiB of the namespace's 80 GiB: admitted, and it runs on a card.
    create(
        cluster,
        pod("within", namespace, [container("main", share(61440, 500))], scheduler=SCHEDULER),
    )
    wait_running(cluster, namespace, "within")
    assert used(cluster, namespace, MEMORY) == "61440"
    # 30 GiB more would make 90 GiB: the API server refuses the pod at creation.
    over = pod("over", namespace, [container("main", share(30720, 250))], scheduler=SCHEDULER)
    assert refused(cluster, over) == (
        'Error from server (Forbidden): error when creating "STDIN": pods "over" is forbidden: '
        f"exceeded quota: gpu, requested: {MEMORY}=30720, used: {MEMORY}=61440, "
        f"limited: {MEMORY}=81920"
    )
    # What is left, 20 GiB, is admitted and runs beside the first.
    create(
        cluster,
        pod("rest", namespace, [container("main", share(20480, 250))], scheduler=SCHEDULER),
    )
    wait_running(cluster, namespace, "rest")
    assert used(cluster, namespace, MEMORY) == "81920"
    # Deleting the first gives its 60 GiB back: the refused pod is now admitted.
    cluster.kubectl("delete", "pod", "-n", namespace, "within", "--wait=true")
    cluster.wait_for(
        "the quota's usage to drop", lambda: used(cluster, namespace, MEMORY) == "20480", 60
    )
    create(cluster, over)
    wait_running(cluster, namespace, "over")


def test_whole_gpus_past_the_namespaces_cards_are_refused_by_the_api_server(
    cluster: Cluster, roles: KubegpuRoles, namespace: str, tmp_path: Path
) -> None:
    apply_example_quota(cluster, namespace, tmp_path / "quota")
    create(cluster, pod("three", namespace, [container("main", {WHOLE: "3"})]))
    wait_running(cluster, namespace, "three")
    assert used(cluster, namespace, GPUS) == "3"
    assert refused(cluster, pod("two", namespace, [container("main", {WHOLE: "2"})])) == (
        'Error from server (Forbidden): error when creating "STDIN": pods "two" is forbidden: '
        f"exceeded quota: gpu, requested: {GPUS}=2, used: {GPUS}=3, limited: {GPUS}=4"
    )
    create(cluster, pod("one", namespace, [container("main", {WHOLE: "1"})]))
    wait_running(cluster, namespace, "one")
    assert used(cluster, namespace, GPUS) == "4"
