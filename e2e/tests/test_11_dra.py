"""`kubegpu dra-driver` on the real kubelet, kube-scheduler, kube-controller-manager and API
server (DRA v1 with DRAConsumableCapacity and DRADeviceTaints on), with containerd v2 applying
the driver's CDI specs: each container's own view (its environment and its /dev) shows exactly
the card and share its claim was allocated; the scheduler's allocator never puts more on a card
than its slice offers. Runs on its own cluster (the `dra` fixture), after every other module."""

from __future__ import annotations

import http.client
import json
import os
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import record_install
from kubegpu_e2e.cluster import NODE_NAME, Cluster
from kubegpu_e2e.devices import (
    assert_isolated,
    device_view,
    host_nodes,
    minors_by_uuid,
    probe_command,
)
from kubegpu_e2e.dra import COMPONENT, DRIVER, FAKE_GPUS, DraDriver
from kubegpu_e2e.images import WORKLOAD_IMAGE
from kubegpu_e2e.kubegpu import KubegpuRoles
from kubegpu_e2e.release import (
    Release,
    archive_tag,
    helm_binary,
    image_archive,
    kubernetes_version,
    prepare,
)
from kubegpu_e2e.workloads import (
    ENV_END,
    container_env,
    pending_reason,
    priority_class,
    wait_running,
)

from kubegpu.config.extender import load_workload
from kubegpu.dra.steering import card_free_milli, steered_order
from kubegpu.inventory.fake import send_fake_gpu_command
from kubegpu.inventory.select import open_backend
from kubegpu.kube.resource_claims import pool_devices_from_claims
from kubegpu.sharing.resources import parse_quantity

pytestmark = pytest.mark.e2e

Dra = tuple[Cluster, DraDriver]
WHOLE_CLASS = "gpu.kubegpu.io"
SHARE_CLASS = "gpu-share.kubegpu.io"
# The container prints its environment and the NVIDIA device nodes it was given, then idles.
PRINT_ENV_DEVICES_AND_IDLE = (
    'trap "exit 0" TERM; env | sort; '
    "echo KUBEGPU_E2E_DEV=$(ls /dev | grep nvidia | sort | tr '\\n' ' '); "
    f"echo {ENV_END}; while :; do sleep 1; done"
)


def workload(name: str, claims: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": WORKLOAD_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", PRINT_ENV_DEVICES_AND_IDLE],
        "resources": {"claims": [{"name": c} for c in claims]},
    }


def claim_pod(
    name: str,
    namespace: str,
    *,
    template: str | None = None,
    claim: str | None = None,
    containers: int = 1,
) -> dict[str, Any]:
    source = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [workload(f"c{i}", ["gpu"]) for i in range(containers)],
            "resourceClaims": [{"name": "gpu", **source}],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "dnsPolicy": "Default",
        },
    }


def request_spec(
    device_class: str, *, cel: str | None = None, capacity: dict[str, str] | None = None
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def claim_object(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def template_object(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": spec},
    }


def create(cluster: Cluster, *objects: dict[str, Any]) -> None:
    for o in objects:
        cluster.kubectl("create", "-f", "-", input=json.dumps(o))


def pod_claim(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any]:
    """The claim a pod's `gpu` entry resolved to (for a template: the one the
    controller-manager made)."""
    status = cluster.get("pod", "-n", namespace, pod)["status"]
    for entry in status.get("resourceClaimStatuses", []):
        if entry["name"] == "gpu":
            return dict(cluster.get("resourceclaim", "-n", namespace, entry["resourceClaimName"]))
    spec = cluster.get("pod", "-n", namespace, pod)["spec"]
    name = spec["resourceClaims"][0]["resourceClaimName"]
    return dict(cluster.get("resourceclaim", "-n", namespace, name))


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    allocation = claim.get("status", {}).get("allocation") or {}
    return list(allocation.get("devices", {}).get("results", []))


def env_of(cluster: Cluster, namespace: str, pod: str, container: str = "c0") -> dict[str, str]:
    env = container_env(cluster, namespace, pod, container)
    assert env, f"{namespace}/{pod}/{container} printed no environment"
    return env


def nvidia_cards(env: dict[str, str]) -> list[str]:
    """The card nodes (/dev/nvidiaN) the container was given, control nodes left out."""
    return [n for n in env.get("KUBEGPU_E2E_DEV", "").split() if n[len("nvidia") :].isdigit()]


def assert_sees_exactly(driver: DraDriver, env: dict[str, str], device: str, where: str) -> None:
    published = driver.devices()[device]
    attributes = published["attributes"]
    uuid = attributes["uuid"]["string"]
    index = attributes["index"]["int"]
    assert env.get("NVIDIA_VISIBLE_DEVICES") == uuid, (where, env.get("NVIDIA_VISIBLE_DEVICES"))
    assert env.get("KUBEGPU_GPU_UUID") == uuid, where
    # The runtime applied the CDI spec: the card's node and the control nodes, nothing else.
    assert nvidia_cards(env) == [f"nvidia{index}"], (where, env.get("KUBEGPU_E2E_DEV"))
    assert "nvidiactl" in env["KUBEGPU_E2E_DEV"].split(), where


def assert_no_card_overcommitted(cluster: Cluster, driver: DraDriver) -> None:
    """Every allocated claim in the cluster against the slice: per card, the consumed memory
    and compute sum to at most what the card offers (a result without consumed capacity is
    the whole card)."""
    devices = driver.devices()
    used: dict[str, list[Decimal]] = {name: [Decimal(0), Decimal(0)] for name in devices}
    for claim in cluster.get("resourceclaims", "-A")["items"]:
        for r in results(claim):
            if r["driver"] != DRIVER:
                continue
            capacity = devices[r["device"]]["capacity"]
            consumed = r.get("consumedCapacity") or {
                k: capacity[k]["value"] for k in ("memory", "compute")
            }
            used[r["device"]][0] += parse_quantity(consumed.get("memory", "0"))
            used[r["device"]][1] += parse_quantity(consumed.get("compute", "0"))
    for name, (memory, compute) in used.items():
        capacity = devices[name]["capacity"]
        assert memory <= parse_quantity(capacity["memory"]["value"]), (name, memory)
        assert compute <= parse_quantity(capacity["compute"]["value"]), (name, compute)


def cdi_spec(cluster: Cluster, claim_uid: str) -> Path:
    return cluster.cdi_dir / f"kubegpu-dra-{claim_uid}.json"


def delete_pod(cluster: Cluster, namespace: str, name: str) -> None:
    cluster.kubectl("delete", "pod", "-n", namespace, name, "--wait=true", "--timeout=120s")


def wait_pending_with_reason(cluster: Cluster, namespace: str, pod: str) -> str:
    reason: str = cluster.wait_for(
        f"{namespace}/{pod} refused by kube-scheduler",
        lambda: pending_reason(cluster, namespace, pod),
        timeout=60,
    )
    assert cluster.get("pod", "-n", namespace, pod)["status"].get("phase") == "Pending"
    return reason


# ------------------------------------------------------------------------------ scenarios
def test_driver_registers_and_publishes_its_gpus(dra: Dra) -> None:
    cluster, driver = dra
    devices = driver.devices()
    assert sorted(devices) == [f"gpu-{i}" for i in range(8)]
    uuids = set()
    for name, device in devices.items():
        attributes = device["attributes"]
        assert "A100" in attributes["productName"]["string"], name
        assert attributes["index"]["int"] == int(name.split("-")[1])
        uuids.add(attributes["uuid"]["string"])
        # Kept by the API server only with DRAConsumableCapacity on (it drops a disabled
        # gate's fields): the gate reached kube-apiserver.
        assert device.get("allowMultipleAllocations") is True, device
        assert parse_quantity(device["capacity"]["memory"]["value"]) >= 80 * 2**30 * 99 // 100
        assert "requestPolicy" in device["capacity"]["memory"], device["capacity"]
    assert len(uuids) == 8
    # The kubelet's plugin watcher took the registration (the DRA socket is what it dials).
    kubelet_log = (cluster.logs / "kubelet.log").read_text()
    assert DRIVER in kubelet_log


def test_whole_gpu_claim_from_a_template(dra: Dra, dra_namespace: str) -> None:
    cluster, driver = dra
    ns = dra_namespace
    create(
        cluster,
        template_object("one-gpu", ns, request_spec(WHOLE_CLASS)),
        claim_pod("whole", ns, template="one-gpu"),
    )
    wait_running(cluster, ns, "whole", timeout=120)
    claim = pod_claim(cluster, ns, "whole")
    # The controller-manager made the claim from the template, for this pod.
    owners = claim["metadata"].get("ownerReferences", [])
    assert [o["name"] for o in owners] == ["whole"], owners
    (result,) = results(claim)
    env = env_of(cluster, ns, "whole")
    assert_sees_exactly(driver, env, result["device"], "whole")
    # The allocator records the policies' defaults (the whole card) as consumed capacity:
    # the container is told of a whole GPU, with no share limits.
    print(f"whole claim's consumed capacity: {result.get('consumedCapacity')}")
    assert not {"KUBEGPU_GPU_MEMORY_LIMIT_MIB", "KUBEGPU_GPU_COMPUTE_MILLI"} & env.keys(), env
    spec = cdi_spec(cluster, claim["metadata"]["uid"])
    assert spec.exists()
    assert_no_card_overcommitted(cluster, driver)
    # Pod deletion unprepares: the kubelet calls NodeUnprepareResources, the spec goes.
    delete_pod(cluster, ns, "whole")
    cluster.wait_for(f"{spec} removed", lambda: not spec.exists(), timeout=60)


def test_shares_by_memory_fill_one_card_and_the_next_waits(dra: Dra, dra_namespace: str) -> None:
    cluster, driver = dra
    ns = dra_namespace
    on_card_3 = 'device.attributes["gpu.kubegpu.io"].index == 3'
    share = request_spec(SHARE_CLASS, cel=on_card_3, capacity={"memory": "20Gi", "compute": "250"})
    create(cluster, template_object("quarter", ns, share))
    names = [f"share-{i}" for i in range(4)]
    create(cluster, *(claim_pod(n, ns, template="quarter") for n in names))
    wait_running(cluster, ns, *names, timeout=180)
    share_ids = set()
    for n in names:
        (result,) = results(pod_claim(cluster, ns, n))
        assert result["device"] == "gpu-3"
        env = env_of(cluster, ns, n)
        assert_sees_exactly(driver, env, "gpu-3", n)
        assert env.get("KUBEGPU_GPU_MEMORY_LIMIT_MIB") == "20480", (n, env)
        assert env.get("KUBEGPU_GPU_COMPUTE_MILLI") == "250", (n, env)
        share_ids.add(env.get("KUBEGPU_DRA_SHARE_ID"))
    assert len(share_ids) == 4 and None not in share_ids, share_ids
    assert_no_card_overcommitted(cluster, driver)
    create(cluster, claim_pod("share-4", ns, template="quarter"))
    reason = wait_pending_with_reason(cluster, ns, "share-4")
    assert "claim" in reason, reason
    print(f"kube-scheduler on the fifth share: {reason}")
    assert_no_card_overcommitted(cluster, driver)


def test_cel_selector_on_model_and_memory(dra: Dra, dra_namespace: str) -> None:
    cluster, driver = dra
    ns = dra_namespace
    a100 = (
        'device.attributes["gpu.kubegpu.io"].productName.contains("A100") && '
        'device.capacity["gpu.kubegpu.io"].memory.compareTo(quantity("40Gi")) >= 0'
    )
    h100 = 'device.attributes["gpu.kubegpu.io"].productName.contains("H100")'
    capacity = {"memory": "4Gi", "compute": "100"}
    create(
        cluster,
        claim_object("a100", ns, request_spec(SHARE_CLASS, cel=a100, capacity=capacity)),
        claim_object("h100", ns, request_spec(SHARE_CLASS, cel=h100, capacity=capacity)),
        claim_pod("on-a100", ns, claim="a100"),
        claim_pod("on-h100", ns, claim="h100"),
    )
    wait_running(cluster, ns, "on-a100", timeout=120)
    (result,) = results(pod_claim(cluster, ns, "on-a100"))
    env = env_of(cluster, ns, "on-a100")
    assert_sees_exactly(driver, env, result["device"], "on-a100")
    assert env.get("KUBEGPU_GPU_MEMORY_LIMIT_MIB") == "4096"
    reason = wait_pending_with_reason(cluster, ns, "on-h100")
    print(f"kube-scheduler on the H100 selector: {reason}")
    assert not results(cluster.get("resourceclaim", "-n", ns, "h100"))
    assert_no_card_overcommitted(cluster, driver)


def test_two_gpus_of_one_nvlink_island_by_constraint_and_peer_selector(
    dra: Dra, dra_namespace: str
) -> None:
    """The NVLink attributes go through the real API server (string, int) and the real
    allocator: a claim for two whole GPUs that must share one NVLink island (matchAttribute on
    nvlinkDomain) and be NVLink peers of GPU 0 (CEL split on nvlinkPeers) gets two cards
    other than gpu-0, and each container sees them."""
    cluster, driver = dra
    ns = dra_namespace
    # The preset joins every pair by NVLink (NVSwitch): one island, seven peers per GPU.
    for name, device in driver.devices().items():
        attributes = device["attributes"]
        index = attributes["index"]["int"]
        assert attributes["nvlinkDomain"] == {"int": 0}, name
        assert attributes["nvlinkPeerCount"] == {"int": 7}, name
        peers = attributes["nvlinkPeers"]["string"].split(",")
        assert peers == [str(i) for i in range(8) if i != index], name
    peer_of_0 = '"0" in device.attributes["gpu.kubegpu.io"].nvlinkPeers.split(",")'
    spec = request_spec(WHOLE_CLASS, cel=peer_of_0)
    spec["devices"]["requests"][0]["exactly"]["count"] = 2
    spec["devices"]["constraints"] = [
        {"requests": ["gpu"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}
    ]
    create(cluster, claim_object("pair", ns, spec), claim_pod("pair", ns, claim="pair"))
    wait_running(cluster, ns, "pair", timeout=120)
    devices = sorted(r["device"] for r in results(pod_claim(cluster, ns, "pair")))
    assert len(devices) == 2 and "gpu-0" not in devices, devices
    env = env_of(cluster, ns, "pair")
    published = driver.devices()
    uuids = {published[d]["attributes"]["uuid"]["string"] for d in devices}
    assert set(env.get("NVIDIA_VISIBLE_DEVICES", "").split(",")) == uuids, env
    cards = sorted(f"nvidia{published[d]['attributes']['index']['int']}" for d in devices)
    assert sorted(nvidia_cards(env)) == cards, env.get("KUBEGPU_E2E_DEV")
    assert_no_card_overcommitted(cluster, driver)


def test_one_claim_shared_by_two_containers_is_one_share(dra: Dra, dra_namespace: str) -> None:
    cluster, driver = dra
    ns = dra_namespace
    capacity = {"memory": "8Gi", "compute": "100"}
    create(
        cluster,
        claim_object("pair", ns, request_spec(SHARE_CLASS, capacity=capacity)),
        claim_pod("pair", ns, claim="pair", containers=2),
    )
    wait_running(cluster, ns, "pair", timeout=120)
    claim = cluster.get("resourceclaim", "-n", ns, "pair")
    (result,) = results(claim)
    first, second = env_of(cluster, ns, "pair", "c0"), env_of(cluster, ns, "pair", "c1")
    for name, env in (("c0", first), ("c1", second)):
        assert_sees_exactly(driver, env, result["device"], name)
        assert env.get("KUBEGPU_GPU_MEMORY_LIMIT_MIB") == "8192", (name, env)
    assert first["KUBEGPU_DRA_SHARE_ID"] == second["KUBEGPU_DRA_SHARE_ID"]
    # Prepared once: one CDI spec for the claim, whatever the number of containers.
    specs = sorted(p.name for p in cluster.cdi_dir.glob("kubegpu-dra-*.json"))
    assert f"kubegpu-dra-{claim['metadata']['uid']}.json" in specs
    assert_no_card_overcommitted(cluster, driver)


def test_each_container_sees_only_the_gpus_of_the_claims_it_names(
    dra: Dra, dra_namespace: str
) -> None:
    """Accelerator isolation on the DRA path (issue 28; kubegpu_e2e/devices.py): in a pod with
    a whole-GPU claim and a share claim, the container naming the first sees and reaches its
    card's /dev/nvidiaN and the control nodes of the CDI spec, nothing else; the one naming
    the share likewise its own card; a third container naming neither, and a pod with no
    claim at all, see and reach no NVIDIA node, though the claims' specs are on the node; a
    privileged container, which the device cgroup does not confine, reaches every one."""
    cluster, driver = dra
    ns = dra_namespace
    nodes = host_nodes(driver.dev_root)
    minors = minors_by_uuid(FAKE_GPUS)

    def probe(name: str, claims: list[str]) -> dict[str, Any]:
        c = workload(name, claims)
        c["command"] = ["/bin/sh", "-c", probe_command(nodes)]
        if not claims:
            del c["resources"]
        return c

    pod = claim_pod("claims", ns, template="whole")
    pod["spec"]["resourceClaims"] = [
        {"name": "whole", "resourceClaimTemplateName": "whole"},
        {"name": "share", "resourceClaimTemplateName": "share"},
    ]
    pod["spec"]["containers"] = [
        probe("whole", ["whole"]),
        probe("share", ["share"]),
        probe("none", []),
    ]
    no_gpu = claim_pod("no-gpu", ns, template="whole")
    del no_gpu["spec"]["resourceClaims"]
    no_gpu["spec"]["containers"] = [probe("main", [])]
    # The control: a privileged container (no claim), which the device cgroup does not confine.
    control = json.loads(json.dumps(no_gpu))
    control["metadata"]["name"] = "privileged"
    control["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    capacity = {"memory": "20Gi", "compute": "250"}
    create(
        cluster,
        template_object("whole", ns, request_spec(WHOLE_CLASS)),
        template_object("share", ns, request_spec(SHARE_CLASS, capacity=capacity)),
        pod,
        no_gpu,
        control,
    )
    wait_running(cluster, ns, "claims", "no-gpu", "privileged", timeout=120)

    published = driver.devices()
    statuses = cluster.get("pod", "-n", ns, "claims")["status"]["resourceClaimStatuses"]
    held: dict[str, set[int]] = {}
    for entry in statuses:
        claim = cluster.get("resourceclaim", "-n", ns, entry["resourceClaimName"])
        devices = [r["device"] for r in results(claim)]
        assert len(devices) == 1, (entry, devices)
        uuids = [published[d]["attributes"]["uuid"]["string"] for d in devices]
        held[entry["name"]] = {minors[u] for u in uuids}
    assert set(held) == {"whole", "share"} and held["whole"] != held["share"], held
    expected = {
        ("claims", "whole"): held["whole"],
        ("claims", "share"): held["share"],
        ("claims", "none"): set(),
        ("no-gpu", "main"): set(),
    }
    for (name, container), cards in expected.items():
        where = f"{name}/{container}"
        view = device_view(env_of(cluster, ns, name, container), nodes, where)
        print(f"{where}: claims cards {sorted(cards)}; {view.summary()}")
        assert_isolated(view, cards, where)
    # The probe tells: the privileged container reaches every GPU through nodes it makes.
    view = device_view(env_of(cluster, ns, "privileged", "main"), nodes, "privileged")
    print(f"privileged/main: {view.summary()}")
    assert view.reachable == set(nodes), view.reach


def test_driver_and_kubelet_restarts_keep_prepared_claims(dra: Dra, dra_namespace: str) -> None:
    cluster, driver = dra
    ns = dra_namespace
    create(
        cluster,
        template_object("one-gpu", ns, request_spec(WHOLE_CLASS)),
        claim_pod("before", ns, template="one-gpu"),
    )
    wait_running(cluster, ns, "before", timeout=120)
    claim = pod_claim(cluster, ns, "before")
    spec = cdi_spec(cluster, claim["metadata"]["uid"])
    assert spec.exists()

    driver.stop()
    driver.start()
    assert spec.exists()
    cluster.stop_kubelet()
    cluster.start_kubelet()
    assert cluster.get("pod", "-n", ns, "before")["status"]["phase"] == "Running"
    # The restarted driver serves new claims, the kubelet reaches it again, and the claim
    # prepared before both restarts is unprepared from the checkpoint when its pod goes.
    create(cluster, claim_pod("after", ns, template="one-gpu"))
    wait_running(cluster, ns, "after", timeout=180)
    (after,) = results(pod_claim(cluster, ns, "after"))
    (before,) = results(pod_claim(cluster, ns, "before"))
    assert after["device"] != before["device"]
    assert_sees_exactly(driver, env_of(cluster, ns, "after"), after["device"], "after")
    delete_pod(cluster, ns, "before")
    cluster.wait_for(f"{spec} removed", lambda: not spec.exists(), timeout=60)
    assert_no_card_overcommitted(cluster, driver)


def test_an_xid_taints_the_gpu_and_no_new_claim_lands_on_it(dra: Dra, dra_namespace: str) -> None:
    cluster, driver = dra
    ns = dra_namespace
    reply = send_fake_gpu_command(driver.fake_control, "xid", gpu=6, xid=48)
    assert reply.get("ok"), reply

    def tainted() -> list[dict[str, Any]]:
        return list(driver.devices()["gpu-6"].get("taints", []))

    taints = cluster.wait_for("gpu-6 tainted in the ResourceSlice", tainted, timeout=30)
    assert [(t["key"], t["effect"]) for t in taints] == [
        ("gpu.kubegpu.io/unhealthy", "NoSchedule")
    ], taints
    on_card_6 = 'device.attributes["gpu.kubegpu.io"].index == 6'
    create(
        cluster,
        claim_object("six", ns, request_spec(WHOLE_CLASS, cel=on_card_6)),
        claim_pod("on-six", ns, claim="six"),
    )
    reason = wait_pending_with_reason(cluster, ns, "on-six")
    print(f"kube-scheduler on the tainted GPU: {reason}")
    time.sleep(5)  # and it stays so: no allocation appears on the tainted card
    assert not results(cluster.get("resourceclaim", "-n", ns, "six"))
    assert_no_card_overcommitted(cluster, driver)


def test_the_pod_status_shows_its_gpu_turning_unhealthy(dra: Dra, dra_namespace: str) -> None:
    """The driver's DRAResourceHealth stream reaches the real kubelet (ResourceHealthStatus
    on): a running pod's container status names its claim's device, Healthy, and Unhealthy
    once a fatal Xid hits that GPU."""
    cluster, driver = dra
    ns = dra_namespace
    on_card_5 = 'device.attributes["gpu.kubegpu.io"].index == 5'
    create(
        cluster,
        template_object("card-5", ns, request_spec(WHOLE_CLASS, cel=on_card_5)),
        claim_pod("on-five", ns, template="card-5"),
    )
    wait_running(cluster, ns, "on-five", timeout=120)
    claim = pod_claim(cluster, ns, "on-five")
    resource_id = f"{DRIVER}/claim={claim['metadata']['uid']}-gpu-5"

    def health() -> dict[str, str]:
        statuses = cluster.get("pod", "-n", ns, "on-five")["status"]["containerStatuses"]
        return {
            (entry["name"], resource["resourceID"]): resource.get("health", "")
            for status in statuses
            for entry in status.get("allocatedResourcesStatus") or []
            for resource in entry.get("resources") or []
        }

    key = ("claim:gpu", resource_id)
    cluster.wait_for(
        "the pod status to show gpu-5 Healthy", lambda: health().get(key) == "Healthy", 60
    )
    reply = send_fake_gpu_command(driver.fake_control, "xid", gpu=5, xid=48)
    assert reply.get("ok"), reply
    cluster.wait_for(
        "the pod status to show gpu-5 Unhealthy", lambda: health().get(key) == "Unhealthy", 60
    )
    print(f"on-five's allocatedResourcesStatus: {health()}")
    # The slice taints it too, and the pod keeps running (the taint is NoSchedule).
    cluster.wait_for("gpu-5 tainted", lambda: driver.devices()["gpu-5"].get("taints"), 30)
    assert cluster.get("pod", "-n", ns, "on-five")["status"]["phase"] == "Running"


# ------------------------------------------------------------------ steering (dra.steering)
# 80 % half-card shares, 20 % of 30 %: a 40 %-used card is a bad home for the common share (it
# would leave a sliver no share fits), a free one a good one (tests/dra/test_steering.py).
STEERING_WORKLOAD = {
    "pods": [
        {"cpuMilli": 1000, "gpuMilli": 500, "gpuCount": 1, "weight": 8},
        {"cpuMilli": 1000, "gpuMilli": 300, "gpuCount": 1, "weight": 2},
    ]
}


def share_capacity(milli: int) -> dict[str, str]:
    """A share of ``milli`` thousandths of an 80 GiB card, in memory and compute alike."""
    return {"memory": f"{80 * 1024 * milli // 1000}Mi", "compute": str(milli)}


def published_order(driver: DraDriver) -> list[str]:
    return list(driver.devices())


def expected_order(cluster: Cluster, workload_file: Path) -> list[str]:
    """The order the driver should publish now, from the claims the API server holds, by the
    same pure functions (the driver's CPU count is this machine's: it runs here)."""
    backend = open_backend("fake", fake_gpus=FAKE_GPUS)
    try:
        inventory = backend.snapshot()
    finally:
        backend.close()
    claims = cluster.get("resourceclaims", "-A")["items"]
    free = card_free_milli(
        inventory, NODE_NAME, pool_devices_from_claims(claims, DRIVER, NODE_NAME)
    )
    order = steered_order(
        inventory, free, load_workload(workload_file), (os.cpu_count() or 1) * 1000
    )
    return [f"gpu-{i}" for i in order]


def first_fitting(driver: DraDriver, cluster: Cluster, milli: int) -> str:
    """The first device of the published order with ``milli`` free: where DRA's first fit
    puts a share of that size."""
    used = {name: Decimal(0) for name in driver.devices()}
    for claim in cluster.get("resourceclaims", "-A")["items"]:
        for r in results(claim):
            if r["driver"] == DRIVER:
                used[r["device"]] += parse_quantity(
                    (r.get("consumedCapacity") or {}).get("compute", "1000")
                )
    return next(n for n in published_order(driver) if 1000 - used[n] >= milli)


def test_steering_orders_the_slice_so_first_fit_lands_where_our_policy_would(
    dra: Dra, dra_namespace: str
) -> None:
    cluster, driver = dra
    ns = dra_namespace
    workload_file = cluster.run_dir / "steering-workload.yaml"
    workload_file.write_text(json.dumps(STEERING_WORKLOAD))
    config = yaml.safe_load((COMPONENT / "dra-driver-config.yaml").read_text())
    config["dra"]["steering"] = {"workloadFile": str(workload_file), "intervalS": 1}
    config_file = cluster.run_dir / "dra-driver-steering.yaml"
    config_file.write_text(yaml.safe_dump(config))
    driver.stop()
    driver.start(config_file)
    try:
        # Nothing allocated: every card free, index order.
        cluster.wait_for(
            "the steered order of a free node",
            lambda: published_order(driver) == [f"gpu-{i}" for i in range(8)],
            timeout=30,
        )
        # A 40 % share pinned to gpu-0. Then first fit in index order would put the next
        # half-card share on gpu-0 (600 left), leaving a 100-milli sliver; the driver moves
        # gpu-0 behind the free cards.
        on_card_0 = 'device.attributes["gpu.kubegpu.io"].index == 0'
        create(
            cluster,
            claim_object(
                "forty", ns, request_spec(SHARE_CLASS, cel=on_card_0, capacity=share_capacity(400))
            ),
            claim_pod("forty", ns, claim="forty"),
        )
        wait_running(cluster, ns, "forty", timeout=120)
        want = expected_order(cluster, workload_file)
        assert want[0] != "gpu-0" and want[-1] == "gpu-0", want
        cluster.wait_for(
            f"the slice re-published in the steered order {want}",
            lambda: published_order(driver) == want,
            timeout=30,
        )
        # A half-card share: the real allocator's first fit takes the first device of the
        # published order, not gpu-0 (which index order would have given it).
        create(
            cluster,
            claim_object("half", ns, request_spec(SHARE_CLASS, capacity=share_capacity(500))),
            claim_pod("half", ns, claim="half"),
        )
        wait_running(cluster, ns, "half", timeout=120)
        (half,) = results(cluster.get("resourceclaim", "-n", ns, "half"))
        assert half["device"] == want[0] != "gpu-0", (half["device"], want)
        assert_sees_exactly(driver, env_of(cluster, ns, "half"), half["device"], "half")
        # The order follows the new state; a 30 % share lands on its first fitting device.
        want = expected_order(cluster, workload_file)
        cluster.wait_for(
            f"the slice re-published in the steered order {want}",
            lambda: published_order(driver) == want,
            timeout=30,
        )
        target = first_fitting(driver, cluster, 300)
        create(
            cluster,
            claim_object("thirty", ns, request_spec(SHARE_CLASS, capacity=share_capacity(300))),
            claim_pod("thirty", ns, claim="thirty"),
        )
        wait_running(cluster, ns, "thirty", timeout=120)
        (thirty,) = results(cluster.get("resourceclaim", "-n", ns, "thirty"))
        assert thirty["device"] == target, (thirty["device"], want)
        print(f"steered: orders {want}; half-card share on {half['device']}, 30 % on {target}")
        assert_no_card_overcommitted(cluster, driver)
    finally:
        driver.stop()
        driver.start()


# ------------------------------------------------- plain nvidia.com/gpu (DRAExtendedResource)
def test_a_plain_nvidia_gpu_pod_is_served_by_the_dra_driver(dra: Dra, dra_namespace: str) -> None:
    cluster, driver = dra
    ns = dra_namespace
    cluster.kubectl(
        "apply",
        "--server-side",
        "-f",
        str(COMPONENT / "extended-resource" / "deviceclass.yaml"),
    )
    try:
        mapped = cluster.get("deviceclass", "gpu-extended-resource.kubegpu.io")
        # Kept by the API server only with DRAExtendedResource on.
        assert mapped["spec"].get("extendedResourceName") == "nvidia.com/gpu", mapped["spec"]
        container = workload("c0", [])
        del container["resources"]["claims"]
        container["resources"]["limits"] = {"nvidia.com/gpu": "1"}
        pod = claim_pod("plain", ns, template="unused")
        del pod["spec"]["resourceClaims"]
        pod["spec"]["containers"] = [container]
        create(cluster, pod)
        wait_running(cluster, ns, "plain", timeout=120)
        # kube-scheduler made a claim for the pod and allocated one whole device of ours.
        status = cluster.get("pod", "-n", ns, "plain")["status"]
        extended = status.get("extendedResourceClaimStatus") or {}
        claim_name = extended.get("resourceClaimName")
        assert claim_name, status
        claim = cluster.get("resourceclaim", "-n", ns, claim_name)
        (result,) = results(claim)
        assert result["driver"] == DRIVER, result
        # A whole GPU: the request names no capacity, so it consumes the request policy's
        # default, the whole card (or, recorded without consumed capacity, the device).
        consumed = result.get("consumedCapacity") or {}
        assert parse_quantity(consumed.get("compute", "1000")) == 1000, result
        env = env_of(cluster, ns, "plain")
        assert_sees_exactly(driver, env, result["device"], "plain")
        print(f"plain nvidia.com/gpu pod: claim {claim_name} on {result['device']}")
        assert_no_card_overcommitted(cluster, driver)
        spec = cdi_spec(cluster, claim["metadata"]["uid"])
        delete_pod(cluster, ns, "plain")
        cluster.wait_for(f"{spec} removed", lambda: not spec.exists(), timeout=60)
    finally:
        cluster.kubectl("delete", "deviceclass", "gpu-extended-resource.kubegpu.io", check=False)


# ------------------------------------------------------------ the extender ranks DRA nodes
def unscheduled(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["schedulerName"] = "kubegpu-e2e-nobody"
    return pod


def test_the_extender_ranks_the_dra_node_from_the_real_slice_and_claims(
    dra: Dra, dra_namespace: str
) -> None:
    """`kubegpu extender` with the second-scheduler overlay's settings and RBAC reads the real
    API server's ResourceSlices and ResourceClaims and answers `/prioritize-dra` as
    kube-scheduler's second extender entry would ask it. (The real scheduler never asks on
    this one-node cluster: with a single feasible node it skips scoring.) The pods name a
    scheduler that does not exist, so they stay unallocated while the controller-manager still
    makes their claims from the templates."""
    cluster, _ = dra
    ns = dra_namespace
    roles = KubegpuRoles(cluster)
    roles.apply_rbac()
    roles.start_extender()
    try:
        fits = request_spec(SHARE_CLASS, capacity={"memory": "20Gi", "compute": "250"})
        too_big = request_spec(SHARE_CLASS, capacity={"memory": "200Gi", "compute": "250"})
        create(
            cluster,
            template_object("fits", ns, fits),
            template_object("too-big", ns, too_big),
            unscheduled(claim_pod("fits", ns, template="fits")),
            unscheduled(claim_pod("too-big", ns, template="too-big")),
        )

        def prioritize(pod: str) -> dict[str, int]:
            obj = cluster.get("pod", "-n", ns, pod)
            body = json.dumps({"Pod": obj, "NodeNames": [NODE_NAME, "no-such-node"]})
            connection = http.client.HTTPConnection("127.0.0.1", roles.extender_port, timeout=10)
            try:
                connection.request(
                    "POST", "/prioritize-dra", body, {"Content-Type": "application/json"}
                )
                reply = connection.getresponse()
                assert reply.status == 200, reply.read()
                return {h["Host"]: h["Score"] for h in json.loads(reply.read())}
            finally:
                connection.close()

        # Once its watches have synced and the claim exists, the node that can take the share
        # gets a score; a node without our slice gets 0.
        scores = cluster.wait_for(
            "the extender to rank the DRA node for the share that fits",
            lambda: (s := prioritize("fits"))[NODE_NAME] > 0 and s,
            timeout=60,
        )
        assert scores["no-such-node"] == 0, scores
        # 200Gi fits no 80Gi card: 0, by the same accounting.
        assert prioritize("too-big") == {NODE_NAME: 0, "no-such-node": 0}
        print(f"/prioritize-dra for the fitting share: {scores}")
    finally:
        roles.stop()


# ------------------------------------------------------------ the DRA driver from the chart
def test_kube_schedulers_preemption_frees_no_capacity_for_a_dra_share(
    dra: Dra, dra_namespace: str
) -> None:
    """Measured, not fixed (docs/dra.md, "Priorities and preemption"): two low-priority shares
    fill card 5 by capacity, then a high-priority share pinned to that card is created. At
    Kubernetes 1.35 the DRA plugin's "cannot allocate all claims" is UnschedulableAndUnresolvable
    and it has no PreFilterExtensions, so kube-scheduler never dry-runs a node for it: nothing is
    evicted and the pod waits, "Preemption is not helpful for scheduling"
    (kubernetes/enhancements#5690, DRA preemption, planned beta in 1.37)."""
    cluster, _ = dra
    ns = dra_namespace
    create(cluster, priority_class("e2e-dra-low", 10), priority_class("e2e-dra-high", 1000))
    try:
        on_card_5 = 'device.attributes["gpu.kubegpu.io"].index == 5'
        half = request_spec(
            SHARE_CLASS, cel=on_card_5, capacity={"memory": "40Gi", "compute": "500"}
        )
        create(cluster, template_object("half", ns, half))
        low = []
        for i in range(2):
            manifest = claim_pod(f"low-{i}", ns, template="half")
            manifest["spec"]["priorityClassName"] = "e2e-dra-low"
            low.append(manifest)
        create(cluster, *low)
        wait_running(cluster, ns, "low-0", "low-1", timeout=120)
        urgent = claim_pod("urgent", ns, template="half")
        urgent["spec"]["priorityClassName"] = "e2e-dra-high"
        create(cluster, urgent)
        reason = wait_pending_with_reason(cluster, ns, "urgent")
        print(f"kube-scheduler on a high-priority DRA share: {reason}")
        assert "Preemption is not helpful" in reason, reason
        # Watched through kube-scheduler's retries: still nothing evicted, still waiting.
        time.sleep(15)
        for name in ("low-0", "low-1"):
            pod = cluster.get("pod", "-n", ns, name)
            assert not pod["metadata"].get("deletionTimestamp"), name
            assert pod["status"]["phase"] == "Running", name
        assert cluster.get("pod", "-n", ns, "urgent")["status"]["phase"] == "Pending"
        assert not cluster.get("pod", "-n", ns, "urgent")["status"].get("nominatedNodeName")
    finally:
        cluster.kubectl("delete", "priorityclass", "e2e-dra-low", "e2e-dra-high", check=False)


def test_the_chart_installed_dra_driver_serves_a_share(
    dra: Dra, dra_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Last: the host-process driver gives way to the chart's DaemonSet (`draDriver.enabled`,
    the image built from the Dockerfile, the fake GPUs and their device nodes through the
    testing values), whose pod alone then prepares a share claim: it registered with the real
    kubelet from inside its pod and published its slice through its in-cluster client."""
    cluster, driver = dra
    ns = dra_namespace
    driver.stop()
    # What the host-process scenarios applied by hand (the driver's RBAC and DeviceClasses, the
    # extender's accounts): the release must own these objects, as on a cluster kubegpu is
    # installed on for the first time. examples/dra renders them all.
    rendered = cluster.kubectl("kustomize", str(COMPONENT.parents[1] / "examples" / "dra")).stdout
    cluster.kubectl(
        "delete", "--ignore-not-found", "--wait=true", "-f", "-", input=rendered, timeout=180
    )
    version = kubernetes_version()
    imported = prepare(cluster, version, node_label="kubegpu.io/gpu-allocation=dra", upgrade=False)
    release = Release(
        cluster,
        helm_binary(),
        tmp_path_factory.mktemp("helm-home-dra"),
        version,
        extra_values={"draDriver.enabled": "true", "testing.fakeDevRoot": str(driver.dev_root)},
    )
    seconds = release.install(archive_tag(image_archive()))
    pod = release.ready_pod("kubegpu-dra-driver")
    assert not pod["spec"].get("hostNetwork")
    # The node agent stays off a node moved to DRA.
    assert release.pods("kubegpu-node-agent") == []
    cluster.wait_for("the pod's slice with 8 GPUs", lambda: len(driver.devices()) == 8, 60)

    share = request_spec(SHARE_CLASS, capacity={"memory": "20Gi", "compute": "250"})
    create(cluster, template_object("chart-share", ns, share))
    create(cluster, claim_pod("chart-share", ns, template="chart-share"))
    wait_running(cluster, ns, "chart-share", timeout=180)
    (result,) = results(pod_claim(cluster, ns, "chart-share"))
    env = env_of(cluster, ns, "chart-share")
    assert_sees_exactly(driver, env, result["device"], "chart-share")
    assert env.get("KUBEGPU_GPU_MEMORY_LIMIT_MIB") == "20480", env
    assert env.get("KUBEGPU_GPU_COMPUTE_MILLI") == "250", env
    assert env.get("KUBEGPU_DRA_SHARE_ID"), env
    assert_no_card_overcommitted(cluster, driver)
    record_install(
        "dra_driver_from_the_chart",
        {
            "helm_install_until_all_ready_s": seconds,
            "ready_after_s": release.ready_times(),
            "images": sorted(imported),
            "share": {"device": result["device"], "driver_pod": pod["metadata"]["name"]},
        },
    )
    delete_pod(cluster, ns, "chart-share")
    release.uninstall()
