"""What the scenarios create and how they read the real components back: pod manifests for the
busybox workload (prints its environment, then idles), container logs through the real kubectl,
and the real kubelet's PodResources API."""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from kubegpu.kubelet.api.podresources.v1 import api_pb2 as pr
from kubegpu.kubelet.api.podresources.v1 import api_pb2_grpc as pr_grpc
from kubegpu_e2e.cluster import Cluster
from kubegpu_e2e.images import WORKLOAD_IMAGE
from kubegpu_e2e.kubegpu import tool_path

ENV_END = "KUBEGPU-E2E-ENV-END"
# PID 1 in the container ignores SIGTERM unless it traps it: deletion would wait the whole grace.
PRINT_ENV_AND_IDLE = f'trap "exit 0" TERM; env | sort; echo {ENV_END}; while :; do sleep 1; done'
PRINT_ENV_AND_EXIT = f"env | sort; echo {ENV_END}"

SHARED = "kubegpu.io/gpu-shared"
MEMORY = "kubegpu.io/gpu-memory"
COMPUTE = "kubegpu.io/gpu-compute"
WHOLE = "nvidia.com/gpu"
SCHEDULER = "kubegpu-scheduler"
# One card of the fake 8xA100-80GB-NVLink node.
CARD_MEMORY_MIB = 81920
CARD_COMPUTE_MILLI = 1000


def container(name: str, limits: dict[str, str] | None = None, idle: bool = True) -> dict[str, Any]:
    return {
        "name": name,
        "image": WORKLOAD_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", PRINT_ENV_AND_IDLE if idle else PRINT_ENV_AND_EXIT],
        "resources": {"limits": limits or {}},
    }


def share(memory_mib: int, compute_milli: int) -> dict[str, str]:
    return {MEMORY: str(memory_mib), COMPUTE: str(compute_milli), SHARED: "1"}


def pod(
    name: str,
    namespace: str,
    containers: list[dict[str, Any]],
    *,
    init_containers: list[dict[str, Any]] | None = None,
    scheduler: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": containers,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 2,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # No cluster DNS here, and the kubelet gives pods no resolv.conf (resolvConf: "").
        "dnsPolicy": "Default",
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def priority_class(name: str, value: int) -> dict[str, Any]:
    """A PriorityClass for a preemption scenario (cluster-scoped: delete it afterwards)."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "description": "kubegpu e2e preemption scenarios",
    }


def create(cluster: Cluster, *objects: dict[str, Any]) -> None:
    document = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("create", "-f", "-", input=json.dumps(document))


def phase(cluster: Cluster, namespace: str, name: str) -> str:
    return str(cluster.get("pod", "-n", namespace, name)["status"].get("phase", ""))


def wait_running(cluster: Cluster, namespace: str, *names: str, timeout: float = 180) -> None:
    for name in names:
        try:
            cluster.wait_for(
                f"pod {namespace}/{name} Running",
                lambda name=name: (
                    phase(cluster, namespace, name) == "Running"
                    and container_env(
                        cluster, namespace, name, first_container(cluster, namespace, name)
                    )
                ),
                timeout=timeout,
            )
        except AssertionError as error:
            described = cluster.kubectl("describe", "pod", "-n", namespace, name, check=False)
            raise AssertionError(f"{error}\n{described.stdout[-3000:]}") from None


def first_container(cluster: Cluster, namespace: str, name: str) -> str:
    return str(cluster.get("pod", "-n", namespace, name)["spec"]["containers"][0]["name"])


def container_env(
    cluster: Cluster, namespace: str, pod_name: str, container_name: str
) -> dict[str, str]:
    """The environment the container printed, read back through kubectl logs (API server to
    the real kubelet). Empty until the container has printed all of it."""
    result = cluster.kubectl("logs", "-n", namespace, pod_name, "-c", container_name, check=False)
    if result.returncode != 0:
        return {}
    lines = result.stdout.splitlines()
    if ENV_END not in lines:
        return {}
    lines = lines[: lines.index(ENV_END)]
    env = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value
    return env


def pending_reason(cluster: Cluster, namespace: str, name: str) -> str:
    """The PodScheduled condition's message: what the real kube-scheduler said."""
    for condition in cluster.get("pod", "-n", namespace, name)["status"].get("conditions", []):
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return str(condition.get("message", ""))
    return ""


@dataclass(frozen=True)
class ContainerDevices:
    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def pod_resources(socket: Path) -> list[ContainerDevices]:
    """Every device the real kubelet says it handed to a container (PodResources v1 List)."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = pr_grpc.PodResourcesListerStub(channel)
        answer = stub.List(pr.ListPodResourcesRequest(), timeout=10)
    found = []
    for p in answer.pod_resources:
        for c in p.containers:
            for d in c.devices:
                found.append(
                    ContainerDevices(
                        p.namespace, p.name, c.name, d.resource_name, tuple(d.device_ids)
                    )
                )
    return found


def card_totals(cluster: Cluster, namespaces: list[str]) -> dict[str, list[int]]:
    """Memory and compute per card, summed over running app containers from what each
    container's own environment says, for the containers PodResources says hold a slot.
    Terminating pods count while their containers still answer: their share is still in use."""
    holders = {
        (e.namespace, e.pod, e.container)
        for e in pod_resources(cluster.pod_resources_socket)
        if e.resource == SHARED and e.namespace in namespaces
    }
    pods = {
        (namespace, p["metadata"]["name"]): p
        for namespace in namespaces
        for p in cluster.get("pods", "-n", namespace)["items"]
    }
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for namespace, pod_name, container_name in holders:
        obj = pods.get((namespace, pod_name))
        if obj is None or obj["status"].get("phase") != "Running":
            continue  # gone, or not started: nothing of its share is in use
        if container_name not in {c["name"] for c in obj["spec"]["containers"]}:
            continue  # init containers have finished: their share is no longer in use
        env = container_env(cluster, namespace, pod_name, container_name)
        if not env:
            continue  # deleted since the listing
        card = env["KUBEGPU_GPU_UUID"]
        totals[card][0] += int(env["KUBEGPU_GPU_MEMORY_LIMIT_MIB"])
        totals[card][1] += int(env["KUBEGPU_GPU_COMPUTE_MILLI"])
    return dict(totals)


def kubelet_card_view(cluster: Cluster, namespace: str) -> dict[str, set[str]]:
    """card UUID -> pods of `namespace` on it, from PodResources (whole cards by device id;
    shares by the slot the kubelet handed out, whose card the container's own environment
    names)."""
    cards: dict[str, set[str]] = {}
    for entry in pod_resources(cluster.pod_resources_socket):
        if entry.namespace != namespace:
            continue
        if entry.resource == WHOLE:
            for uuid in entry.device_ids:
                cards.setdefault(uuid, set()).add(entry.pod)
        elif entry.resource == SHARED:
            env = container_env(cluster, namespace, entry.pod, entry.container)
            cards.setdefault(env["KUBEGPU_GPU_UUID"], set()).add(entry.pod)
    return cards


def kubectl_gpu_inspect(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl gpu inspect ARGS` through the real kubectl's plugin lookup: our kubectl first on
    PATH, then the venv holding the kubectl-gpu plugin."""
    env = {**cluster.env, "PATH": tool_path(cluster), "KUBECONFIG": str(cluster.admin)}
    env.pop("KUBEGPU_E2E_BIN", None)
    return subprocess.run(
        [str(cluster.bin_dir / "kubectl"), "gpu", "inspect", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def inspected_card_view(
    cluster: Cluster, node: str, namespace: str, *args: str
) -> dict[str, set[str]]:
    """card UUID -> pods of `namespace` on it, as `kubectl gpu inspect -o json` says."""
    result = kubectl_gpu_inspect(cluster, "-o", "json", "-n", namespace, *args)
    assert result.returncode == 0, result.stderr
    (found,) = [n for n in json.loads(result.stdout)["nodes"] if n["name"] == node]
    cards = {
        card["uuid"]: {p["name"] for p in card["pods"] if p["namespace"] == namespace}
        for card in found["cards"]
    }
    return {uuid: pods for uuid, pods in cards.items() if pods}
