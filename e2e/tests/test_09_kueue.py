"""Gang admission with the real Kueue (sigs.k8s.io/kueue, built from its Go module) on the
default cluster: the ResourceFlavor and ClusterQueue of deploy/examples/kueue, unchanged, with
quotas on whole cards and on kubegpu's share resources; Jobs queued through a LocalQueue are
admitted whole or not at all, and their pods are placed on cards by kubegpu-scheduler and the
extender as any other pod.

Every assertion reads the API server: the Workload's conditions and admission (what Kueue
decided), the Job's suspend flag and events, the pods' nodeName and phase, and what each
container was told of its card. Kueue runs as a host process (kubegpu_e2e/kueue.py); its
waitForPodsReady timeout is shortened to seconds so that the eviction of a gang whose pods
cannot all be placed is seen here.

The module needs the default cluster, which test_10_install.py stops: it sorts before it."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from kubegpu_e2e.cluster import NODE_NAME, Cluster
from kubegpu_e2e.images import WORKLOAD_IMAGE
from kubegpu_e2e.kubegpu import KubegpuRoles
from kubegpu_e2e.kueue import EXAMPLE, Kueue, example
from kubegpu_e2e.workloads import (
    CARD_COMPUTE_MILLI,
    CARD_MEMORY_MIB,
    ENV_END,
    PRINT_ENV_AND_IDLE,
    SCHEDULER,
    WHOLE,
    card_totals,
    container,
    container_env,
    create,
    pending_reason,
    pod,
    share,
    wait_running,
)

from kubegpu.sharing.resources import parse_quantity

pytestmark = pytest.mark.e2e

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
WORKLOADS = "workloads.kueue.x-k8s.io"
# Short, so that the eviction scenario takes seconds; long enough for a gang of busybox pods
# on this machine (they run within a few seconds of admission).
PODS_READY_TIMEOUT_S = 30
BACKOFF_BASE_S = 5

CLUSTER_QUEUE = example("clusterqueue.yaml")
QUOTA = {
    r["name"]: str(r["nominalQuota"])
    for r in CLUSTER_QUEUE["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
}


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def kueue(cluster: Cluster, roles: KubegpuRoles) -> Iterator[Kueue]:
    k = Kueue(cluster, f"{PODS_READY_TIMEOUT_S}s", BACKOFF_BASE_S)
    try:
        k.install_crds()
        k.start()
        # The admin's objects, exactly as shipped.
        for name in ("resourceflavor.yaml", "clusterqueue.yaml"):
            cluster.kubectl("apply", "--server-side", "-f", str(EXAMPLE / name))
        cluster.wait_for(
            "the ClusterQueue Active",
            lambda: _condition(_cluster_queue(cluster), "Active").get("status") == "True",
            timeout=60,
        )
        yield k
    finally:
        # Kueue's finalizers on these are removed by Kueue itself: delete them while it runs.
        cluster.kubectl(
            "delete",
            "clusterqueues.kueue.x-k8s.io,resourceflavors.kueue.x-k8s.io",
            "--all",
            "--timeout=60s",
            check=False,
            timeout=90,
        )
        k.stop()


@pytest.fixture
def queue(cluster: Cluster, kueue: Kueue, namespace: str) -> str:
    """The shipped LocalQueue in the scenario's namespace; the ClusterQueue holds nothing of
    an earlier scenario (their namespaces are deleted, Workloads and all)."""
    local = example("localqueue.yaml")
    local["metadata"]["namespace"] = namespace
    create(cluster, local)
    cluster.wait_for(
        "the ClusterQueue to hold no workload",
        lambda: (
            _cluster_queue(cluster).get("status", {}).get("reservingWorkloads", 0) == 0
            and not any(reserved(cluster).values())
        ),
        timeout=60,
    )
    return str(local["metadata"]["name"])


# ---------------------------------------------------------------------------- helpers
def _cluster_queue(cluster: Cluster) -> dict[str, Any]:
    return dict(cluster.get("clusterqueues.kueue.x-k8s.io", CLUSTER_QUEUE["metadata"]["name"]))


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return dict(c)
    return {}


def _time(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def job(
    name: str,
    namespace: str,
    queue: str,
    pods: int,
    limits: dict[str, str],
    *,
    run_s: int | None = None,
) -> dict[str, Any]:
    """A Job of ``pods`` pods at once, each one container with ``limits``, through
    kubegpu-scheduler, queued in ``queue``; each prints its environment, then idles (or exits
    after ``run_s`` seconds)."""
    command = PRINT_ENV_AND_IDLE if run_s is None else f"env | sort; echo {ENV_END}; sleep {run_s}"
    worker = container("worker", limits)
    worker["command"] = ["/bin/sh", "-c", command]
    spec = pod(name, namespace, [worker], scheduler=SCHEDULER)["spec"]
    spec["terminationGracePeriodSeconds"] = 0
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 0,
            "template": {"spec": spec},
        },
    }


def workload(cluster: Cluster, namespace: str, job_name: str) -> dict[str, Any]:
    """The Workload Kueue made for the Job (owned by it); {} until it exists."""
    for w in cluster.get(WORKLOADS, "-n", namespace)["items"]:
        owners = w["metadata"].get("ownerReferences", [])
        if any(o["kind"] == "Job" and o["name"] == job_name for o in owners):
            return dict(w)
    return {}


def wait_workload(
    cluster: Cluster, namespace: str, job_name: str, kind: str, status: str, timeout: float = 60
) -> dict[str, Any]:
    """The Workload once its condition ``kind`` has ``status``."""
    found: dict[str, Any] = cluster.wait_for(
        f"Workload of Job {namespace}/{job_name} with {kind}={status}",
        lambda: (
            (w := workload(cluster, namespace, job_name))
            and _condition(w, kind).get("status") == status
            and w
        ),
        timeout=timeout,
    )
    return found


def job_pods(cluster: Cluster, namespace: str, job_name: str) -> list[dict[str, Any]]:
    return list(cluster.get("pods", "-n", namespace, "-l", f"{JOB_NAME_LABEL}={job_name}")["items"])


def wait_gang_running(
    cluster: Cluster, namespace: str, job_name: str, pods: int, timeout: float = 120
) -> list[dict[str, Any]]:
    """All ``pods`` of the Job Running together, bound to the node, each container having
    printed its environment; the pods as the API server has them."""

    def running() -> list[dict[str, Any]] | None:
        items = [
            p
            for p in job_pods(cluster, namespace, job_name)
            if p["status"].get("phase") == "Running"
        ]
        if len(items) != pods:
            return None
        if not all(
            container_env(cluster, namespace, p["metadata"]["name"], "worker") for p in items
        ):
            return None
        return items

    try:
        found: list[dict[str, Any]] = cluster.wait_for(
            f"the {pods} pods of Job {namespace}/{job_name} Running", running, timeout=timeout
        )
    except AssertionError as error:
        described = cluster.kubectl("describe", "pods", "-n", namespace, check=False).stdout
        raise AssertionError(f"{error}\n{described[-4000:]}") from None
    return found


def usage(w: dict[str, Any]) -> dict[str, Decimal]:
    """What Kueue charged the ClusterQueue for the Workload's one PodSet (the API server
    writes quantities in canonical form: 1000 is "1k")."""
    (assignment,) = w["status"]["admission"]["podSetAssignments"]
    return {k: parse_quantity(v) for k, v in assignment["resourceUsage"].items()}


def reserved(cluster: Cluster) -> dict[str, Decimal]:
    """The ClusterQueue's reserved quota per resource (its one flavor), as it reports it."""
    out: dict[str, Decimal] = {}
    for flavor in _cluster_queue(cluster).get("status", {}).get("flavorsReservation", []):
        for r in flavor["resources"]:
            out[r["name"]] = parse_quantity(r["total"])
    return out


def job_created_pods(cluster: Cluster, namespace: str, job_name: str) -> list[str]:
    """The Job controller's SuccessfulCreate events for the Job: every pod it ever made."""
    events = cluster.get(
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.kind=Job,involvedObject.name={job_name}",
    )["items"]
    return [e["message"] for e in events if e["reason"] == "SuccessfulCreate"]


# ---------------------------------------------------------------------------- scenarios
def test_the_example_is_accepted_by_the_api_server_and_kueues_webhooks(
    cluster: Cluster, kueue: Kueue
) -> None:
    # What an admin applies (`kubectl apply --server-side -k deploy/examples/kueue`), as a
    # server-side dry run: CRD validation and Kueue's own validating and mutating webhooks
    # (which accept dry runs) see every object, the Job included. Its namespace exists on the
    # admin's cluster; here it is made for the check.
    made = cluster.kubectl("get", "namespace", "team-a", check=False).returncode != 0
    if made:
        cluster.kubectl("create", "namespace", "team-a")
    try:
        result = cluster.kubectl(
            "apply", "--dry-run=server", "--server-side", "-k", str(EXAMPLE), check=False
        )
    finally:
        if made:
            cluster.kubectl("delete", "namespace", "team-a", "--wait=false")
    assert result.returncode == 0, result.stderr
    applied = [line for line in result.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == 4, result.stdout


def test_the_example_gang_of_four_shares_is_admitted_whole_and_all_four_run(
    cluster: Cluster, queue: str, namespace: str
) -> None:
    # deploy/examples/kueue/job.yaml, with only what this cluster needs changed: the
    # namespace, the image (no registry is reachable) and a command that prints the share.
    manifest = example("job.yaml")
    manifest["metadata"]["namespace"] = namespace
    assert manifest["metadata"]["labels"][QUEUE_LABEL] == queue
    spec = manifest["spec"]["template"]["spec"]
    (worker,) = spec["containers"]
    worker.update(
        {
            "image": WORKLOAD_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", PRINT_ENV_AND_IDLE],
        }
    )
    spec.update(
        {
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "dnsPolicy": "Default",
        }
    )
    name, pods = manifest["metadata"]["name"], manifest["spec"]["parallelism"]
    limits = worker["resources"]["limits"]
    create(cluster, manifest)

    w = wait_workload(cluster, namespace, name, "Admitted", "True")
    assert _condition(w, "QuotaReserved")["status"] == "True"
    # Kueue charged the whole gang at once, in kubegpu's own units.
    charged = usage(w)
    requests = {**limits, **worker["resources"]["requests"]}
    for resource, per_pod in requests.items():
        assert charged[resource] == pods * parse_quantity(per_pod), (resource, charged)
    assert w["status"]["admission"]["podSetAssignments"][0]["count"] == pods
    cluster.wait_for(
        "the ClusterQueue to report the gang's reservation",
        lambda: all(reserved(cluster).get(r) == charged[r] for r in limits),
        timeout=30,
    )
    assert cluster.get("job", "-n", namespace, name)["spec"]["suspend"] is False

    running = wait_gang_running(cluster, namespace, name, pods)
    for p in running:
        assert p["spec"]["nodeName"] == NODE_NAME
        env = container_env(cluster, namespace, p["metadata"]["name"], "worker")
        assert int(env["KUBEGPU_GPU_MEMORY_LIMIT_MIB"]) == int(limits["kubegpu.io/gpu-memory"])
        assert int(env["KUBEGPU_GPU_COMPUTE_MILLI"]) == int(limits["kubegpu.io/gpu-compute"])
    for card, (memory, compute) in card_totals(cluster, [namespace]).items():
        assert memory <= CARD_MEMORY_MIB and compute <= CARD_COMPUTE_MILLI, card
    wait_workload(cluster, namespace, name, "PodsReady", "True")


def test_a_gang_of_whole_gpus_is_admitted_whole_and_runs_on_distinct_cards(
    cluster: Cluster, queue: str, namespace: str
) -> None:
    per_pod = int(QUOTA[WHOLE]) // 2
    create(cluster, job("whole", namespace, queue, 2, {WHOLE: str(per_pod)}))
    w = wait_workload(cluster, namespace, "whole", "Admitted", "True")
    assert usage(w)[WHOLE] == parse_quantity(QUOTA[WHOLE])

    seen: set[str] = set()
    for p in wait_gang_running(cluster, namespace, "whole", 2):
        assert p["spec"]["nodeName"] == NODE_NAME
        env = container_env(cluster, namespace, p["metadata"]["name"], "worker")
        devices = {d for d in env["NVIDIA_VISIBLE_DEVICES"].split(",") if d}
        assert len(devices) == per_pod, env["NVIDIA_VISIBLE_DEVICES"]
        assert not devices & seen, "two pods of the gang were handed the same card"
        seen |= devices


def test_a_gang_over_quota_stays_queued_whole_with_no_pod_created(
    cluster: Cluster, queue: str, namespace: str
) -> None:
    # Both fit the node's free cards (8 idle A100s); neither fits the queue's quota, though a
    # part of each would: 3 x 2 cards against 4, 4 x 50,000 MiB against 163,840.
    create(
        cluster,
        job("whole-over", namespace, queue, 3, {WHOLE: "2"}),
        job("shares-over", namespace, queue, 4, share(50000, 200)),
    )
    for name, resource in (("whole-over", WHOLE), ("shares-over", "kubegpu.io/gpu-memory")):
        w = wait_workload(cluster, namespace, name, "QuotaReserved", "False")
        condition = _condition(w, "QuotaReserved")
        assert condition["reason"] == "Pending", condition
        assert f"insufficient quota for {resource} in flavor default-flavor" in condition["message"]
        assert _condition(w, "Admitted").get("status") != "True"
        assert "admission" not in w["status"]
    # Kueue's webhook suspended them at creation, and nothing has let them go since.
    for name in ("whole-over", "shares-over"):
        obj = cluster.get("job", "-n", namespace, name)
        assert obj["spec"]["suspend"] is True
        assert obj["status"].get("active", 0) == 0
        assert job_pods(cluster, namespace, name) == []
        assert job_created_pods(cluster, namespace, name) == []
    assert not any(reserved(cluster).values())


def test_a_queued_gang_is_admitted_when_the_one_before_it_finishes(
    cluster: Cluster, queue: str, namespace: str
) -> None:
    # The first gang takes all the share memory and compute of the quota for a few seconds.
    memory = int(QUOTA["kubegpu.io/gpu-memory"]) // 4
    compute = int(QUOTA["kubegpu.io/gpu-compute"]) // 4
    create(cluster, job("first", namespace, queue, 4, share(memory, compute), run_s=12))
    wait_workload(cluster, namespace, "first", "Admitted", "True")
    create(cluster, job("second", namespace, queue, 2, share(memory // 2, compute // 2), run_s=1))

    queued = wait_workload(cluster, namespace, "second", "QuotaReserved", "False")
    assert (
        "insufficient unused quota for kubegpu.io/gpu-memory"
        in _condition(queued, "QuotaReserved")["message"]
    )
    assert cluster.get("job", "-n", namespace, "first")["status"].get("completionTime") is None
    assert cluster.get("job", "-n", namespace, "second")["spec"]["suspend"] is True
    assert job_pods(cluster, namespace, "second") == []

    wait_gang_running(cluster, namespace, "first", 4)
    finished = cluster.wait_for(
        "the first Job Complete",
        lambda: (
            (j := cluster.get("job", "-n", namespace, "first"))["status"].get("completionTime")
            and j
        ),
        timeout=90,
    )
    admitted = wait_workload(cluster, namespace, "second", "Admitted", "True", timeout=60)
    done_at = _time(finished["status"]["completionTime"])
    assert _time(_condition(admitted, "Admitted")["lastTransitionTime"]) >= done_at
    # Its pods were made only then, and run to completion.
    complete = cluster.wait_for(
        "the second Job Complete",
        lambda: (
            (j := cluster.get("job", "-n", namespace, "second"))["status"].get("succeeded") == 2
            and j
        ),
        timeout=90,
    )
    assert _time(complete["status"]["startTime"]) >= done_at
    assert len(job_created_pods(cluster, namespace, "second")) == 2


def test_a_gang_admitted_by_quota_but_not_placeable_on_cards_is_evicted_and_requeued(
    cluster: Cluster, queue: str, namespace: str
) -> None:
    # Seven of the eight cards taken by a pod outside Kueue: the gang's two 1-card pods fit
    # the quota (4 cards) but only one fits the node.
    create(
        cluster, pod("filler", namespace, [container("main", {WHOLE: "7"})], scheduler=SCHEDULER)
    )
    wait_running(cluster, namespace, "filler", timeout=120)  # says why not (kubectl describe)
    create(cluster, job("gang", namespace, queue, 2, {WHOLE: "1"}))
    wait_workload(cluster, namespace, "gang", "Admitted", "True")
    # One pod runs, the other waits for a card, with the scheduler's words.
    cluster.wait_for(
        "one pod of the gang Running and one Pending with the scheduler's reason",
        lambda: (
            sorted(
                (
                    p["status"].get("phase"),
                    bool(pending_reason(cluster, namespace, p["metadata"]["name"])),
                )
                for p in job_pods(cluster, namespace, "gang")
            )
            == [("Pending", True), ("Running", False)]
        ),
        timeout=60,
    )

    evicted = wait_workload(
        cluster, namespace, "gang", "Evicted", "True", timeout=PODS_READY_TIMEOUT_S + 60
    )
    assert _condition(evicted, "Evicted")["reason"] == "PodsReadyTimeout"
    # Evicted whole: the Job suspended again and both pods gone, the running one too.
    cluster.wait_for(
        "the gang's Job suspended with no pod left",
        lambda: (
            cluster.get("job", "-n", namespace, "gang")["spec"]["suspend"] is True
            and job_pods(cluster, namespace, "gang") == []
        ),
        timeout=60,
    )

    # Room on the cards: once its backoff has passed the gang is admitted again and runs whole.
    cluster.kubectl("delete", "pod", "-n", namespace, "filler", "--wait=true")
    again = cluster.wait_for(
        "the gang admitted again",
        lambda: (
            (w := workload(cluster, namespace, "gang"))
            and w["status"].get("requeueState", {}).get("count", 0) >= 1
            and _condition(w, "Admitted").get("status") == "True"
            and w
        ),
        timeout=120,
    )
    assert _time(_condition(again, "Admitted")["lastTransitionTime"]) >= _time(
        _condition(evicted, "Evicted")["lastTransitionTime"]
    )
    for p in wait_gang_running(cluster, namespace, "gang", 2):
        assert p["spec"]["nodeName"] == NODE_NAME
    wait_workload(cluster, namespace, "gang", "PodsReady", "True")


def test_kueue_leaves_jobs_without_a_queue_alone(
    cluster: Cluster, queue: str, namespace: str
) -> None:
    # manageJobsWithoutQueueName is off (Kueue's default): a Job naming no queue runs at once,
    # uncounted, even past the quota.
    plain = job("plain", namespace, queue, 1, {WHOLE: str(int(QUOTA[WHOLE]) + 1)})
    plain["metadata"]["labels"] = {}
    create(cluster, plain)
    wait_gang_running(cluster, namespace, "plain", 1)
    assert workload(cluster, namespace, "plain") == {}
    assert not any(reserved(cluster).values())
