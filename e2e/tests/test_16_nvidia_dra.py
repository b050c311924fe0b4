"""NVIDIA's own DRA examples and tests, unchanged, against kubegpu's DRA driver under NVIDIA's
naming (`--dra-naming=nvidia`, docs/migrate-nvidia.md) on the real components (issue 28).

The specs are NVIDIA's files, vendored verbatim in e2e/third_party/dra-driver-nvidia-gpu
(kubernetes-sigs/dra-driver-nvidia-gpu at NVIDIA_COMMIT, Apache-2.0): the quickstart, the bats
specs that need no NVIDIA-specific opaque config, and the Go e2e suite's templates. Each test
asserts what NVIDIA's own test of that spec asserts (named in its docstring). The only edits,
made here as the files are applied and listed in the third_party README:

* every container image (ubuntu:22.04, ubuntu:24.04, nvcr.io/nvidia/cuda) becomes the suite's
  workload image: the suite has no registry. That image runs their `bash -c` commands in
  busybox's shell and has `nvidia-smi`'s stand-in for the fake GPUs, which prints the GPUs the
  container was given in `nvidia-smi -L`'s form (kubegpu_e2e/images.py);
* the bats specs name no namespace (bats applies them to `default`): they go to the test's;
* the Go templates' values are filled as NVIDIA's suite fills them, from the published slice.

Runs on its own DRA cluster (the `dra` fixture), whose driver is restarted under NVIDIA's
naming with NVIDIA's DeviceClass (deploy/components/dra-driver/nvidia-naming) instead of ours.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubegpu_e2e.cluster import Cluster
from kubegpu_e2e.dra import COMPONENT, DRIVER, GPU_COUNT, DraDriver
from kubegpu_e2e.images import WORKLOAD_IMAGE
from kubegpu_e2e.workloads import phase

from kubegpu.sharing.resources import parse_quantity

pytestmark = pytest.mark.e2e

Dra = tuple[Cluster, DraDriver]
NVIDIA = Path(__file__).resolve().parents[1] / "third_party" / "dra-driver-nvidia-gpu"
NVIDIA_COMMIT = "95932046683719c43b6a0dd9613c2e5aad5d6703"
NVIDIA_DRIVER = "gpu.nvidia.com"
# The images of NVIDIA's specs, each replaced by the workload image (the one edit to them).
NVIDIA_IMAGES = frozenset(
    {
        "ubuntu:22.04",
        "ubuntu:24.04",
        "nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04",
        "nvcr.io/nvidia/k8s/cuda-sample:nbody-cuda11.6.0-ubuntu18.04",
    }
)
GPU_LINE = re.compile(r"^GPU \d+: .* \(UUID: (GPU-[0-9a-f-]+)\)$")
READY_S = 120.0  # NVIDIA's bats allow 8 s; a 2-core machine running a whole cluster needs more


@pytest.fixture(scope="module")
def nvidia(dra: Dra) -> Iterator[Dra]:
    """The module's DRA cluster with the driver under NVIDIA's naming: kubegpu's slices and
    classes go, NVIDIA's class comes (the component's file), the driver restarts with
    --dra-naming=nvidia."""
    cluster, driver = dra
    driver.stop()
    cluster.kubectl("delete", "resourceslices", f"--field-selector=spec.driver={DRIVER}")
    cluster.kubectl("delete", "deviceclass", "gpu.kubegpu.io", "gpu-share.kubegpu.io")
    cluster.kubectl(
        "apply", "--server-side", "-f", str(COMPONENT / "nvidia-naming" / "deviceclass.yaml")
    )
    driver.driver = NVIDIA_DRIVER
    driver.start(None, "--dra-naming=nvidia")
    yield cluster, driver


def nvidia_objects(relative: str, **values: object) -> list[dict[str, Any]]:
    """NVIDIA's spec file, its Go template values filled (``{{ .Name }}``), each image
    replaced by the workload image."""
    text = (NVIDIA / relative).read_text()
    for name, value in values.items():
        text = text.replace(f"{{{{ .{name} }}}}", str(value))
    assert "{{" not in text, f"{relative}: a template value is not filled: {text}"
    objects = [doc for doc in yaml.safe_load_all(text) if doc]
    for obj in objects:
        spec = obj.get("spec") or {}
        pod_spec = spec["template"]["spec"] if obj["kind"] in ("Job", "Deployment") else spec
        for container in pod_spec.get("containers", []) if obj["kind"] != "Namespace" else []:
            assert container["image"] in NVIDIA_IMAGES, (relative, container["image"])
            container["image"] = WORKLOAD_IMAGE
    return objects


def apply(cluster: Cluster, objects: list[dict[str, Any]], namespace: str | None) -> None:
    document = {"apiVersion": "v1", "kind": "List", "items": objects}
    where = ["-n", namespace] if namespace else []
    cluster.kubectl("apply", *where, "-f", "-", input=json.dumps(document))


def ready(cluster: Cluster, namespace: str, pod: str) -> bool:
    status = cluster.get("pod", "-n", namespace, pod)["status"]
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def wait_ready(cluster: Cluster, namespace: str, *pods: str) -> None:
    for pod in pods:
        try:
            cluster.wait_for(
                f"pod {namespace}/{pod} Ready", lambda p=pod: ready(cluster, namespace, p), READY_S
            )
        except AssertionError as error:
            described = cluster.kubectl("describe", "pod", "-n", namespace, pod, check=False)
            raise AssertionError(f"{error}\n{described.stdout[-3000:]}") from None


def gpu_lines(
    cluster: Cluster, namespace: str, pod: str, container: str | None = None
) -> list[str]:
    """The `nvidia-smi -L` lines the container printed (waiting for at least one)."""
    where = ["-c", container] if container else []

    def lines() -> list[str]:
        logs = cluster.kubectl("logs", "-n", namespace, pod, *where, check=False).stdout
        return [line for line in logs.splitlines() if GPU_LINE.match(line)]

    found: list[str] = cluster.wait_for(f"nvidia-smi -L in {namespace}/{pod}", lines, 60)
    return found


def uuids(lines: list[str]) -> list[str]:
    return [GPU_LINE.match(line).group(1) for line in lines]  # type: ignore[union-attr]


def published_gpu(driver: DraDriver) -> dict[str, Any]:
    """NVIDIA's framework.DetectGPU: the first device of the first gpu.nvidia.com slice."""
    slices = driver.slices()
    assert slices, "no ResourceSlice of gpu.nvidia.com"
    return dict(slices[0]["spec"]["devices"][0])


def claims(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return list(cluster.get("resourceclaims", "-n", namespace)["items"])


def delete_namespace(cluster: Cluster, name: str) -> None:
    cluster.kubectl("delete", "namespace", name, "--wait=true", "--timeout=180s", check=False)


# ------------------------------------------------------------------------ the slice itself
def test_the_slice_is_published_under_nvidias_names(nvidia: Dra) -> None:
    """Go e2e `[install] driver publishes a ResourceSlice with gpu.nvidia.com`: productName and
    driverVersion non-empty, memory > 0; and every GPU published (bats `ResourceSlice device
    count matches host GPU count`, against the fake node's GPU count)."""
    _, driver = nvidia
    device = published_gpu(driver)
    attributes = device["attributes"]
    assert attributes["productName"]["string"]
    assert attributes["driverVersion"]["version"]
    assert attributes["type"] == {"string": "gpu"}
    assert parse_quantity(device["capacity"]["memory"]["value"]) > 0
    gpus = [d for d in driver.devices().values() if d["attributes"]["type"]["string"] == "gpu"]
    assert len(gpus) == GPU_COUNT


# ----------------------------------------------------------------------- NVIDIA's quickstart
def test_quickstart_gpu_test1_two_pods_get_distinct_gpus(nvidia: Dra) -> None:
    """demo/specs/quickstart/v1/gpu-test1.yaml: two pods, a claim each from one template; the
    quickstart README reads both logs, which name different GPUs."""
    cluster, _ = nvidia
    try:
        apply(cluster, nvidia_objects("demo/specs/quickstart/v1/gpu-test1.yaml"), None)
        wait_ready(cluster, "gpu-test1", "pod1", "pod2")
        first = uuids(gpu_lines(cluster, "gpu-test1", "pod1"))
        second = uuids(gpu_lines(cluster, "gpu-test1", "pod2"))
        assert len(first) == len(second) == 1 and first != second, (first, second)
    finally:
        delete_namespace(cluster, "gpu-test1")


def test_quickstart_gpu_test2_two_containers_share_one_claims_gpu(nvidia: Dra) -> None:
    """gpu-test2.yaml: one pod, two containers naming one claim: the same GPU in both."""
    cluster, _ = nvidia
    try:
        apply(cluster, nvidia_objects("demo/specs/quickstart/v1/gpu-test2.yaml"), None)
        wait_ready(cluster, "gpu-test2", "pod")
        ctr0 = gpu_lines(cluster, "gpu-test2", "pod", "ctr0")
        ctr1 = gpu_lines(cluster, "gpu-test2", "pod", "ctr1")
        assert len(ctr0) == 1 and ctr0 == ctr1, (ctr0, ctr1)
    finally:
        delete_namespace(cluster, "gpu-test2")


def test_quickstart_gpu_test3_two_pods_share_one_claim(nvidia: Dra) -> None:
    """gpu-test3.yaml: two pods naming one ResourceClaim: the same GPU in both."""
    cluster, _ = nvidia
    try:
        apply(cluster, nvidia_objects("demo/specs/quickstart/v1/gpu-test3.yaml"), None)
        wait_ready(cluster, "gpu-test3", "pod1", "pod2")
        first = gpu_lines(cluster, "gpu-test3", "pod1")
        assert len(first) == 1 and first == gpu_lines(cluster, "gpu-test3", "pod2")
    finally:
        delete_namespace(cluster, "gpu-test3")


def test_quickstart_gpu_test5_gpuconfig_is_refused_not_ignored(nvidia: Dra) -> None:
    """gpu-test5.yaml: NVIDIA's opaque GpuConfig asks TimeSlicing `Long` for one request and
    MPS with a 50 % thread limit for the other. kubegpu sets no time slice, and this driver
    runs dra.enforcement: none, so both are refused at prepare with a message naming the
    config; the pod never starts unlimited (NVIDIA's README runs nbody; we assert the refusal
    instead, docs/migrate-nvidia.md)."""
    cluster, _ = nvidia
    try:
        apply(cluster, nvidia_objects("demo/specs/quickstart/v1/gpu-test5.yaml"), None)

        def refusal() -> str:
            events = cluster.get("events", "-n", "gpu-test5")["items"]
            return " ".join(
                e.get("message", "")
                for e in events
                if e.get("involvedObject", {}).get("name") == "pod0"
                and "GpuConfig" in e.get("message", "")
            )

        message = cluster.wait_for("pod0's prepare refused over GpuConfig", refusal, READY_S)
        assert "MPS" in message or "Long" in message, message
        assert phase(cluster, "gpu-test5", "pod0") == "Pending"
    finally:
        delete_namespace(cluster, "gpu-test5")


def test_a_container_naming_a_claim_of_two_requests_is_told_of_both_gpus(
    nvidia: Dra, dra_namespace: str
) -> None:
    """The DRA example driver's basic-multiple-requests shape under NVIDIA's class: one claim,
    requests `a` and `b` of one GPU each; the container naming the whole claim reaches both
    GPUs and is told of both, the one naming request `a` only its own."""
    cluster, _ = nvidia
    ns = dra_namespace
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "two-requests"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": r, "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                    for r in ("a", "b")
                ]
            }
        },
    }

    def ctr(name: str, request: str | None) -> dict[str, Any]:
        ref = {"name": "gpus", **({"request": request} if request else {})}
        return {
            "name": name,
            "image": WORKLOAD_IMAGE,
            "command": ["bash", "-c"],
            "args": ["nvidia-smi -L; trap 'exit 0' TERM; sleep 9999 & wait"],
            "resources": {"claims": [ref]},
        }

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pod-two-requests"},
        "spec": {
            "containers": [ctr("whole", None), ctr("only-a", "a")],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": "two-requests"}],
        },
    }
    apply(cluster, [claim, pod], ns)
    wait_ready(cluster, ns, "pod-two-requests")
    whole = cluster.wait_for(
        "two GPUs in the whole-claim container",
        lambda: (
            len(gpu_lines(cluster, ns, "pod-two-requests", "whole")) == 2
            and gpu_lines(cluster, ns, "pod-two-requests", "whole")
        ),
        60,
    )
    only_a = gpu_lines(cluster, ns, "pod-two-requests", "only-a")
    assert len(set(uuids(whole))) == 2 and len(only_a) == 1, (whole, only_a)
    assert uuids(only_a)[0] in uuids(whole)

    # What kubegpu tells each container matches what it can reach (the claim's own CDI
    # device for the whole claim, docs/dra.md).
    def told(container: str) -> set[str]:
        printed = cluster.kubectl(
            "exec",
            "-n",
            ns,
            "pod-two-requests",
            "-c",
            container,
            "--",
            "sh",
            "-c",
            "echo $NVIDIA_VISIBLE_DEVICES",
        ).stdout.strip()
        return set(printed.split(","))

    assert told("whole") == set(uuids(whole))
    assert told("only-a") == set(uuids(only_a))


# --------------------------------------------------------------------------- the bats specs
BATS = "tests/bats/specs"


def test_bats_one_pod_one_full_gpu(nvidia: Dra, dra_namespace: str) -> None:
    """test_gpu_basic.bats `1 pod(s), 1 full GPU` and test_gpu_robustness.bats `ResourceClaim
    lifecycle`: Ready, one `UUID: GPU-` line; the claim's allocation holds devices; after the
    pod is deleted no claim is left; re-created, it gets a GPU again."""
    cluster, _ = nvidia
    ns = dra_namespace
    for attempt in (1, 2):
        apply(cluster, nvidia_objects(f"{BATS}/gpu-simple-full.yaml"), ns)
        wait_ready(cluster, ns, "pod-full-gpu")
        assert len(gpu_lines(cluster, ns, "pod-full-gpu")) == 1
        (claim,) = claims(cluster, ns)
        assert claim["status"]["allocation"]["devices"]["results"], claim["status"]
        assert claim["status"]["allocation"]["devices"]["results"][0]["driver"] == NVIDIA_DRIVER
        cluster.kubectl("delete", "pod", "-n", ns, "pod-full-gpu", "--wait=true")
        cluster.wait_for(f"no claim left ({attempt})", lambda: not claims(cluster, ns), 60)


def test_bats_two_pods_one_full_gpu_each_are_distinct(nvidia: Dra, dra_namespace: str) -> None:
    """test_gpu_basic.bats `2 pod(s), 1 full GPU each` (multi-gpu): the two lines differ."""
    cluster, _ = nvidia
    ns = dra_namespace
    apply(cluster, nvidia_objects(f"{BATS}/gpu-2pods-2gpus.yaml"), ns)
    names = [
        o["metadata"]["name"]
        for o in nvidia_objects(f"{BATS}/gpu-2pods-2gpus.yaml")
        if o["kind"] == "Pod"
    ]
    wait_ready(cluster, ns, *names)
    lines = [gpu_lines(cluster, ns, name) for name in names]
    assert len(lines) == 2 and lines[0] != lines[1], lines


def test_bats_two_pods_share_one_claim(nvidia: Dra, dra_namespace: str) -> None:
    """test_gpu_basic.bats `2 pod(s), 1 full GPU (shared, 1 RC)`: both lines equal."""
    cluster, _ = nvidia
    ns = dra_namespace
    apply(cluster, nvidia_objects(f"{BATS}/gpu-2pods-1gpu.yaml"), ns)
    wait_ready(cluster, ns, "pod1", "pod2")
    first = gpu_lines(cluster, ns, "pod1")
    assert len(first) == 1 and first == gpu_lines(cluster, ns, "pod2")


def test_bats_two_containers_share_one_claim(nvidia: Dra, dra_namespace: str) -> None:
    """test_gpu_basic.bats `1 pod(s), 2 cntrs, 1 full GPU (shared, 1 RCT)`: the logs of ctr0
    and ctr1 are equal."""
    cluster, _ = nvidia
    ns = dra_namespace
    apply(cluster, nvidia_objects(f"{BATS}/gpu-1pod-2cnt-1gpu.yaml"), ns)
    wait_ready(cluster, ns, "pod1")
    ctr0 = gpu_lines(cluster, ns, "pod1", "ctr0")
    assert len(ctr0) == 1 and ctr0 == gpu_lines(cluster, ns, "pod1", "ctr1")


def test_bats_two_claims_in_one_pod_get_two_distinct_gpus(nvidia: Dra, dra_namespace: str) -> None:
    """test_gpu_robustness.bats `pod with two ResourceClaimTemplates gets two distinct GPUs`:
    at least two `UUID: GPU-` lines (and here: two different ones)."""
    cluster, _ = nvidia
    ns = dra_namespace
    apply(cluster, nvidia_objects(f"{BATS}/gpu-two-claims-one-pod.yaml"), ns)
    wait_ready(cluster, ns, "pod-two-claims")
    seen = cluster.wait_for(
        "two GPU lines",
        lambda: (
            len(gpu_lines(cluster, ns, "pod-two-claims")) >= 2
            and gpu_lines(cluster, ns, "pod-two-claims")
        ),
        60,
    )
    assert len(set(uuids(seen))) == 2, seen


def test_bats_cel_on_a_product_that_does_not_exist_stays_pending(
    nvidia: Dra, dra_namespace: str
) -> None:
    """test_gpu_robustness.bats `CEL selector rejects non-matching productName`: Pending after
    5 s (here 10 s)."""
    cluster, _ = nvidia
    ns = dra_namespace
    apply(cluster, nvidia_objects(f"{BATS}/gpu-cel-nomatch.yaml"), ns)
    time.sleep(10)
    assert phase(cluster, ns, "pod-cel-nomatch") == "Pending"


def test_bats_cel_on_the_published_architecture_matches(nvidia: Dra, dra_namespace: str) -> None:
    """test_gpu_robustness.bats `CEL selector matches GPU by architecture attribute`: the value
    read from the slice, a claim template selecting on it, the pod Succeeds with a GPU line.
    Their spec is inline in the bats file; this is it, with the workload image."""
    cluster, driver = nvidia
    ns = dra_namespace
    architecture = published_gpu(driver)["attributes"]["architecture"]["string"]
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "rct-arch"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.nvidia.com",
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": 'device.attributes["gpu.nvidia.com"]'
                                            f'.architecture == "{architecture}"'
                                        }
                                    }
                                ],
                            },
                        }
                    ]
                }
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pod-arch"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "ctr",
                    "image": WORKLOAD_IMAGE,
                    "command": ["nvidia-smi", "-L"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "rct-arch"}],
        },
    }
    apply(cluster, [template, pod], ns)
    cluster.wait_for(
        "pod-arch Succeeded", lambda: phase(cluster, ns, "pod-arch") == "Succeeded", READY_S
    )
    assert gpu_lines(cluster, ns, "pod-arch")


def test_bats_a_job_from_a_claim_template_completes(nvidia: Dra, dra_namespace: str) -> None:
    """test_gpu_cuda_workloads.bats `Job with ResourceClaimTemplate allocates GPUs to
    completions`: Complete, succeeded == 2, every pod's log has `UUID: GPU-`."""
    cluster, _ = nvidia
    ns = dra_namespace
    apply(cluster, nvidia_objects(f"{BATS}/gpu-job-rct.yaml"), ns)

    def complete() -> bool:
        status = cluster.get("job", "-n", ns, "gpu-job-rct").get("status", {})
        return any(
            c["type"] == "Complete" and c["status"] == "True" for c in status.get("conditions", [])
        )

    cluster.wait_for("Job gpu-job-rct Complete", complete, 240)
    assert cluster.get("job", "-n", ns, "gpu-job-rct")["status"]["succeeded"] == 2
    pods = cluster.get("pods", "-n", ns, "-l", "job-name=gpu-job-rct")["items"]
    assert len(pods) >= 2
    for pod in pods:
        logs = cluster.kubectl("logs", "-n", ns, pod["metadata"]["name"]).stdout
        assert "UUID: GPU-" in logs, logs


def test_bats_consumable_shares_by_memory_share_one_gpu(nvidia: Dra, dra_namespace: str) -> None:
    """test_gpu_consumable_shares.bats `memory mode with 2 independent pods`: both Ready, the
    same `nvidia-smi -L` line; each claim asked 2Gi of it."""
    cluster, _ = nvidia
    ns = dra_namespace
    apply(cluster, nvidia_objects(f"{BATS}/gpu-consumable-shares-memory.yaml"), ns)
    wait_ready(cluster, ns, "pod-share-memory-0", "pod-share-memory-1")
    first = gpu_lines(cluster, ns, "pod-share-memory-0")
    assert len(first) == 1 and first == gpu_lines(cluster, ns, "pod-share-memory-1")
    for claim in claims(cluster, ns):
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert parse_quantity(result["consumedCapacity"]["memory"]) == 2 * 2**30, result


def test_bats_a_plain_nvidia_gpu_pod_is_served_through_the_class(
    nvidia: Dra, dra_namespace: str
) -> None:
    """test_gpu_extres.bats `handle legacy 'nvidia.com/gpu: 1' (with DRAExtendedResource)`: no
    device plugin on the node; Ready; the log has `GPU-`; kube-scheduler's claim for the pod
    is annotated resource.kubernetes.io/extended-resource-claim=true and its result's driver
    is gpu.nvidia.com. Their pod is inline in the bats file; this is it, with the image."""
    cluster, _ = nvidia
    ns = dra_namespace
    node = cluster.get("nodes")["items"][0]
    assert node["status"].get("capacity", {}).get("nvidia.com/gpu", "0") in ("0", None)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pod-extres"},
        "spec": {
            "containers": [
                {
                    "name": "ctr",
                    "image": WORKLOAD_IMAGE,
                    "command": ["bash", "-c"],
                    "args": ["nvidia-smi -L && sleep infinity"],
                    "resources": {
                        "limits": {"nvidia.com/gpu": "1"},
                        "requests": {"nvidia.com/gpu": "1"},
                    },
                }
            ]
        },
    }
    apply(cluster, [pod], ns)
    wait_ready(cluster, ns, "pod-extres")
    assert gpu_lines(cluster, ns, "pod-extres")
    (claim,) = [
        c
        for c in claims(cluster, ns)
        if c["metadata"]["name"].startswith("pod-extres-extended-resources-")
    ]
    annotations = claim["metadata"].get("annotations", {})
    assert annotations.get("resource.kubernetes.io/extended-resource-claim") == "true", claim
    assert claim["status"]["allocation"]["devices"]["results"][0]["driver"] == NVIDIA_DRIVER


# ------------------------------------------------------------------ the Go e2e suite's specs
GO = "test/e2e/framework/specs"


def run_go_template(cluster: Cluster, ns: str, template: str, pod: str, **values: object) -> None:
    """NVIDIA's Go suite's `Render` + `ApplyYAML` + `WaitForPodPhase(Running, Succeeded)`."""
    apply(cluster, nvidia_objects(f"{GO}/{template}.yaml.tmpl", Namespace=ns, **values), None)
    cluster.wait_for(
        f"{pod} Running or Succeeded",
        lambda: phase(cluster, ns, pod) in ("Running", "Succeeded"),
        READY_S,
    )


def test_go_cel_product_name_regex(nvidia: Dra, dra_namespace: str) -> None:
    """gpu_allocation_test.go `[cel/productName]`: ProductPattern = LowerKebab(productName);
    pod1 Running or Succeeded, its claim allocated.

    LowerKebab turns hyphens into spaces (it was written for GFD's label form), so for a name
    with hyphens, as NVML's "NVIDIA A100-SXM4-80GB" of the fake node, the regex cannot match
    the name it came from, on NVIDIA's driver as on ours: the pod stays Pending, which is
    asserted. The same template with the name lower-cased but its hyphens kept (what the test
    means) runs."""
    cluster, driver = nvidia
    ns = dra_namespace
    product = published_gpu(driver)["attributes"]["productName"]["string"]
    kebab = product.replace("-", " ").lower()
    if kebab != product.lower():
        objects = nvidia_objects(f"{GO}/product-type.yaml.tmpl", Namespace=ns, ProductPattern=kebab)
        apply(cluster, objects, None)
        time.sleep(10)
        assert phase(cluster, ns, "pod1") == "Pending"
        cluster.kubectl("delete", "pod", "-n", ns, "pod1", "--wait=true")
        cluster.kubectl("delete", "resourceclaimtemplate", "-n", ns, "single-gpu")
    pattern = product.lower()
    assert re.fullmatch(r"[a-z0-9 -]+", pattern), pattern  # nothing a regex reads specially
    run_go_template(cluster, ns, "product-type", "pod1", ProductPattern=pattern)
    assert claims(cluster, ns)[0]["status"].get("allocation")


def test_go_cel_driver_version_semver(nvidia: Dra, dra_namespace: str) -> None:
    """`[cel/driverVersion]`: compareTo(semver(<the published driverVersion>)) >= 0; the pod
    Running or Succeeded."""
    cluster, driver = nvidia
    version = published_gpu(driver)["attributes"]["driverVersion"]["version"]
    run_go_template(
        cluster, dra_namespace, "driver-version", "test-gpu-driver-version", DriverVersion=version
    )


def test_go_cel_memory_quantity(nvidia: Dra, dra_namespace: str) -> None:
    """`[cel/memory]`: memory.compareTo(quantity("<90 % of the GiB>Gi")) >= 0; Running."""
    cluster, driver = nvidia
    memory_gib = parse_quantity(published_gpu(driver)["capacity"]["memory"]["value"]) // 2**30
    threshold = memory_gib * 9 // 10
    assert threshold >= 1
    run_go_template(
        cluster, dra_namespace, "memory-size", "test-gpu-memory", RequiredMemoryGi=threshold
    )


def test_go_n_pods_share_one_claim(nvidia: Dra, dra_namespace: str) -> None:
    """`[sharing] N pods share one ResourceClaim`: 4 replicas Ready; the claim reserved for 4."""
    cluster, _ = nvidia
    ns = dra_namespace
    apply(cluster, nvidia_objects(f"{GO}/timeslicing.yaml.tmpl", Namespace=ns, Replicas=4), None)

    def ready_replicas() -> bool:
        status = cluster.get("deployment", "-n", ns, "gpu-test").get("status", {})
        return status.get("readyReplicas") == 4

    cluster.wait_for("4 replicas Ready", ready_replicas, 240)
    claim = cluster.get("resourceclaim", "-n", ns, "gpu-device")
    assert claim["status"].get("allocation")
    assert len(claim["status"]["reservedFor"]) == 4


def test_go_no_matching_device_stays_pending_unschedulable(nvidia: Dra, dra_namespace: str) -> None:
    """`[negative] pod stays Pending when no device matches (h300)`: after 30 s Pending,
    PodScheduled False/Unschedulable with a message naming `allocate`; no claim allocated."""
    cluster, _ = nvidia
    ns = dra_namespace
    apply(cluster, nvidia_objects(f"{GO}/error-handling.yaml.tmpl", Namespace=ns), None)
    time.sleep(30)
    pod = cluster.get("pod", "-n", ns, "test-unavailable-gpu")
    assert pod["status"]["phase"] == "Pending"
    (scheduled,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert "allocate" in scheduled["message"].lower(), scheduled
    assert all(not c["status"].get("allocation") for c in claims(cluster, ns))


def test_go_consumable_shares_by_memory_land_on_one_device(nvidia: Dra, dra_namespace: str) -> None:
    """`[consumable-shares/memory]`: runs because our devices allow multiple allocations;
    pod1 and pod2 Running; both claims' results[0].device equal."""
    cluster, driver = nvidia
    ns = dra_namespace
    assert any(d.get("allowMultipleAllocations") for d in driver.devices().values())
    apply(cluster, nvidia_objects(f"{GO}/consumable-shares-memory.yaml.tmpl", Namespace=ns), None)
    for pod in ("pod1", "pod2"):
        cluster.wait_for(
            f"{pod} Running",
            lambda p=pod: phase(cluster, ns, p) in ("Running", "Succeeded"),
            READY_S,
        )
    found = claims(cluster, ns)
    assert len(found) == 2
    devices = {c["status"]["allocation"]["devices"]["results"][0]["device"] for c in found}
    assert len(devices) == 1, found
