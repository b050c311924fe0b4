"""The Helm chart (deploy/helm/kubegpu) with the real helm, built from its Go module
(e2e/components/helm/build.sh; e2e/run exports it as KUBEGPU_E2E_HELM).

One source of truth: for every values combination that has a kustomize counterpart, the chart
renders exactly the objects the overlays render with the real kubectl (parsed and compared
object by object). The one normalisation: Helm's four standard labels (app.kubernetes.io/
managed-by, /instance, /version and helm.sh/chart) are dropped from each object's
metadata.labels before comparing, and the pod spec's containers, volumes and volumeMounts are
compared in name order, since kustomize's strategic merge patch (deploy/components/nfd-labels)
puts the items it patches first and Kubernetes gives these lists' order no meaning (env and
args, whose order does matter, are compared as they are). Nothing else is touched, ConfigMap
names with their content hash included. The render, lint and schema tests need no cluster;
the last scenario installs, upgrades and uninstalls a release against the real API server."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubegpu_e2e.cluster import Cluster
from kubegpu_e2e.processes import built
from kubegpu_e2e.release import helm_binary

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "kubegpu"
DEPLOY = REPO / "deploy"
COMPONENTS = REPO / "e2e" / "components"
HELM_LABELS = (
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "helm.sh/chart",
)

Obj = dict[str, Any]
Key = tuple[str, str, str, str]

# (name, helm --set values, the kustomizations under deploy/ whose objects together are the
# same install). These are the combinations docs/install.md documents.
COMBINATIONS: list[tuple[str, list[str], list[str]]] = [
    ("defaults", [], ["overlays/second-scheduler"]),
    ("default-scheduler", ["scheduler.mode=default-scheduler"], ["overlays/default-scheduler"]),
    (
        "monitoring",
        ["monitoring.enabled=true"],
        ["overlays/second-scheduler", "overlays/monitoring"],
    ),
    (
        "default-scheduler-monitoring",
        ["scheduler.mode=default-scheduler", "monitoring.enabled=true"],
        ["overlays/default-scheduler", "overlays/monitoring"],
    ),
    ("nfd-labels", ["nodeAgent.labeller.sink=nfd"], ["examples/nfd-labels"]),
    ("dra-driver", ["draDriver.enabled=true"], ["examples/dra"]),
    (
        "dra-extended-resource",
        ["draDriver.enabled=true", "draDriver.extendedResource=true"],
        ["examples/dra-extended-resource"],
    ),
    (
        "dra-nvidia-naming",
        ["draDriver.enabled=true", "draDriver.naming=nvidia"],
        ["examples/dra-nvidia-naming"],
    ),
    ("peer-compat", ["peerCompat.enabled=true"], ["examples/peer-compat"]),
    ("claim-budget", ["claimBudget.enabled=true"], ["examples/claim-budget"]),
    (
        "quota-example",
        ["quotaExample.enabled=true"],
        ["overlays/second-scheduler", "examples/quota"],
    ),
]


@pytest.fixture(scope="module")
def helm() -> str:
    path = helm_binary()
    assert Path(path).is_file(), f"helm not found at {path}"
    return path


@pytest.fixture(scope="module")
def kubectl() -> str:
    return str(built("KUBEGPU_E2E_BIN", COMPONENTS / "build.sh") / "kubectl")


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # helm's cache, config and data folders in the test's own temp dir, not the user's home.
    home = tmp_path_factory.mktemp("helm-home")
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def run(argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, env=env)


def sets(values: Sequence[str]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


def render_chart(helm: str, env: dict[str, str], values: Sequence[str]) -> list[Obj]:
    done = run([helm, "template", "kubegpu", str(CHART), *sets(values)], env)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def render_kustomize(kubectl: str, relative: str) -> list[Obj]:
    done = run([kubectl, "kustomize", str(DEPLOY / relative)])
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def key(obj: Obj) -> Key:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def without_helm_labels(obj: Obj) -> Obj:
    labels = {k: v for k, v in obj["metadata"].get("labels", {}).items() if k not in HELM_LABELS}
    metadata = {k: v for k, v in obj["metadata"].items() if k != "labels"}
    if labels:
        metadata["labels"] = labels
    return {**obj, "metadata": metadata}


# Lists of named items whose order means nothing to Kubernetes (see the module's docstring).
UNORDERED = ("containers", "volumes", "volumeMounts")


def unordered_lists_sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: (
                sorted((unordered_lists_sorted(i) for i in v), key=lambda i: str(i.get("name")))
                if k in UNORDERED and isinstance(v, list)
                else unordered_lists_sorted(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [unordered_lists_sorted(i) for i in value]
    return value


def by_key(objects: Sequence[Obj]) -> dict[Key, Obj]:
    found: dict[Key, Obj] = {}
    for obj in objects:
        assert key(obj) not in found, f"rendered twice: {key(obj)}"
        found[key(obj)] = obj
    return found


# -------------------------------------------------------------------------- no cluster


def test_helm_is_the_real_pinned_release(helm: str) -> None:
    pinned = next(
        line.split()[-1]
        for line in (COMPONENTS / "helm" / "go.mod").read_text().splitlines()
        if line.strip().startswith("require helm.sh/helm/v3")
    )
    done = run([helm, "version", "--short"])
    assert done.stdout.startswith(pinned), done.stdout


@pytest.mark.parametrize(
    ("values", "kustomizations"),
    [(v, k) for _, v, k in COMBINATIONS],
    ids=[name for name, _, _ in COMBINATIONS],
)
def test_chart_renders_the_same_objects_as_the_kustomize_overlays(
    helm: str, kubectl: str, helm_env: dict[str, str], values: list[str], kustomizations: list[str]
) -> None:
    chart = by_key(
        [
            unordered_lists_sorted(without_helm_labels(o))
            for o in render_chart(helm, helm_env, values)
        ]
    )
    overlays = by_key(
        [unordered_lists_sorted(o) for k in kustomizations for o in render_kustomize(kubectl, k)]
    )
    assert sorted(chart) == sorted(overlays)
    differing = [k for k in chart if chart[k] != overlays[k]]
    assert differing == [], "\n".join(
        f"{k}:\n--- helm\n{yaml.safe_dump(chart[k])}\n--- kustomize\n{yaml.safe_dump(overlays[k])}"
        for k in differing
    )


def test_every_object_carries_the_release_labels(helm: str, helm_env: dict[str, str]) -> None:
    # What `helm uninstall` and the admin's label selectors rely on (and all the comparison
    # above drops).
    for values in [v for _, v, _ in COMBINATIONS]:
        for obj in render_chart(helm, helm_env, values):
            labels = obj["metadata"].get("labels", {})
            assert labels.get("app.kubernetes.io/instance") == "kubegpu", key(obj)
            assert labels.get("app.kubernetes.io/managed-by") == "Helm", key(obj)


@pytest.mark.parametrize(
    "values", [v for _, v, _ in COMBINATIONS], ids=[n for n, _, _ in COMBINATIONS]
)
def test_helm_lint_strict_passes(helm: str, helm_env: dict[str, str], values: list[str]) -> None:
    done = run([helm, "lint", "--strict", str(CHART), *sets(values)], helm_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("monitorng.enabled=true", "monitorng"),  # misspelt top-level key
        ("nodeAgent.labeler.sink=nfd", "labeler"),  # misspelt nested key
        ("scheduler.mode=second", "scheduler.mode"),  # not one of the modes
        ("nodeAgent.mode=dra", "nodeAgent.mode"),  # DRA is draDriver.enabled, not a mode
        ("draDriver.enabld=true", "enabld"),
        ("extender.policy=best", "extender.policy"),
        ("image.digest=latest", "image.digest"),
    ],
)
def test_schema_rejects_a_bad_value_naming_it(
    helm: str, helm_env: dict[str, str], value: str, named: str
) -> None:
    for command in ("template", "lint"):
        name = ["kubegpu"] if command == "template" else []
        done = run([helm, command, *name, str(CHART), "--set", value], helm_env)
        assert done.returncode != 0, f"helm {command} accepted {value}"
        output = done.stdout + done.stderr
        assert "schema" in output and named.split(".")[-1] in output, output


def test_values_without_a_kustomize_counterpart_land_where_they_should(
    helm: str, helm_env: dict[str, str]
) -> None:
    digest = "sha256:" + "ab" * 32
    objects = render_chart(
        helm,
        helm_env,
        [
            "namePrefix=gpu",
            "namespace.name=gpu-system",
            f"image.digest={digest}",
            "extender.policy=binpack",
            "extender.preemption=false",
            "scheduler.kubeSchedulerImage.tag=v1.33.5",
            "nodeAgent.nodeSelector.pool=a100",
            "nodeAgent.runtimeClassName=nvidia",
            "criticalPodsQuota.enabled=false",
            "testing.fakeGpus=2xA100-80GB",
        ],
    )
    names = {key(o) for o in objects}
    assert all(name.startswith("gpu-") for (_, _, _, name) in names), names
    assert {ns for (_, _, ns, _) in names} == {"", "gpu-system", "kube-system"}
    assert not any(kind == "ResourceQuota" for (_, kind, _, _) in names)
    workloads = {
        o["metadata"]["name"]: o for o in objects if o["kind"] in ("DaemonSet", "Deployment")
    }
    containers = {
        c["name"]: c
        for w in workloads.values()
        for c in w["spec"]["template"]["spec"]["containers"]
    }
    assert containers["device-plugin"]["image"] == f"ghcr.io/kubegpu/kubegpu@{digest}"
    assert containers["kube-scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.33.5"
    env = {e["name"]: e.get("value") for e in containers["extender"]["env"]}
    assert env["KUBEGPU_EXTENDER_SCHEDULER_VERSION"] == "v1.33.5"
    # testing.fakeGpus: both roles that read GPUs get the fake backend, nothing else does.
    for name in ("device-plugin", "labels"):
        assert containers[name]["args"][-2:] == ["--backend=fake", "--fake-gpus=2xA100-80GB"]
    assert not any("--backend=fake" in c.get("args", []) for c in [containers["extender"]])
    assert workloads["gpu-node-agent"]["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert workloads["gpu-node-agent"]["spec"]["template"]["spec"]["nodeSelector"] == {
        "pool": "a100"
    }
    extender_cm = next(
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("gpu-extender-config-")
    )
    settings = yaml.safe_load(extender_cm["data"]["config.yaml"])["settings"]
    assert (settings["policy"], settings["preemption"]) == ("binpack", False)
    # Without its own preemption the extender keeps no right to evict.
    role = next(
        o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "gpu-extender"
    )
    assert not any("delete" in rule["verbs"] for rule in role["rules"]), role["rules"]
    volumes = {
        v["name"]: v for v in workloads["gpu-scheduler"]["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes["extender-config"]["configMap"]["name"] == extender_cm["metadata"]["name"]


def test_node_agent_config_value_replaces_the_shipped_file(
    helm: str, helm_env: dict[str, str]
) -> None:
    config = "version: v1\nsharing:\n  gpuShare:\n    enabled: false\n"
    done = run(
        [helm, "template", "kubegpu", str(CHART), "--set-string", f"nodeAgent.config={config}"],
        helm_env,
    )
    assert done.returncode == 0, done.stderr
    objects = [d for d in yaml.safe_load_all(done.stdout) if d]
    cm = next(o for o in objects if o["metadata"]["name"].startswith("kubegpu-node-agent-config-"))
    assert cm["data"]["config.yaml"] == config
    default = next(
        o
        for o in render_chart(helm, helm_env, [])
        if o["metadata"]["name"].startswith("kubegpu-node-agent-config-")
    )
    # Another config, another name: the DaemonSet's pods roll.
    assert cm["metadata"]["name"] != default["metadata"]["name"]


# -------------------------------------------------------------------------- real API server

RELEASE = "kubegpu-helm-e2e"
PREFIX = "kubegpu-helm-e2e"
NAMESPACE = "kubegpu-helm-e2e"
# The host-process roles (kubegpu_e2e.kubegpu) use the default names in namespace kubegpu;
# this release has its own prefix and namespace beside them, and its pods match no node: their
# image is not in this cluster (the objects are what is checked, not the pods).
INSTALL_VALUES = [
    f"namePrefix={PREFIX}",
    f"namespace.name={NAMESPACE}",
    "nodeAgent.nodeSelector.kubegpu\\.io/e2e-no-such-node=yes",
    "scheduler.nodeSelector.kubegpu\\.io/e2e-no-such-node=yes",
]
# Every kind the chart can create, for the search for leftovers.
KINDS = (
    "namespaces,serviceaccounts,configmaps,secrets,services,resourcequotas,daemonsets,"
    "deployments,roles,rolebindings,clusterroles,clusterrolebindings"
)


@pytest.fixture
def helm_cluster(
    cluster: Cluster, helm: str, helm_env: dict[str, str]
) -> Iterator[tuple[Cluster, list[str]]]:
    base = [helm, "--kubeconfig", str(cluster.admin), "--namespace", "default"]
    try:
        yield cluster, base
    finally:
        run([*base, "uninstall", RELEASE, "--wait", "--timeout=120s"], helm_env)
        cluster.kubectl(
            "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", check=False
        )


def _labelled(cluster: Cluster) -> list[str]:
    found = cluster.kubectl(
        "get",
        KINDS,
        "--all-namespaces",
        "-l",
        f"app.kubernetes.io/instance={RELEASE}",
        "-o",
        "name",
    ).stdout.split()
    return sorted(found)


def test_helm_install_upgrade_uninstall_against_the_real_api_server(
    helm_cluster: tuple[Cluster, list[str]], helm_env: dict[str, str]
) -> None:
    cluster, helm = helm_cluster
    done = run(
        [*helm, "install", RELEASE, str(CHART), "--wait=false", *sets(INSTALL_VALUES)], helm_env
    )
    assert done.returncode == 0, done.stderr
    # NOTES tell the admin what to check next, with this release's names.
    notes = done.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {NAMESPACE} get daemonset {PREFIX}-node-agent" in notes, notes
    assert f"kubectl -n {NAMESPACE} get deployment {PREFIX}-scheduler" in notes, notes
    assert "schedulerName: kubegpu-scheduler" in notes, notes

    # Every object of the release's manifest exists, as the API server validated and stored it.
    manifest = run([*helm, "get", "manifest", RELEASE], helm_env)
    assert manifest.returncode == 0, manifest.stderr
    objects = [d for d in yaml.safe_load_all(manifest.stdout) if d]
    kinds = {o["kind"] for o in objects}
    assert {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Secret",
        "Service",
        "DaemonSet",
        "Deployment",
        "ResourceQuota",
    } <= kinds, kinds
    for obj in objects:
        meta = obj["metadata"]
        where = ["-n", meta["namespace"]] if meta.get("namespace") else []
        stored = cluster.get(obj["kind"].lower(), *where, meta["name"])
        assert stored["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert set(_labelled(cluster)) >= {
        f"namespace/{NAMESPACE}",
        f"daemonset.apps/{PREFIX}-node-agent",
    }

    # The chart's RBAC works as intended, for the release's own accounts: the token controller
    # filled the extender's token Secret, and the accounts have their rights and no more.
    cluster.wait_for(
        "the extender token Secret filled",
        lambda: (
            "token"
            in (
                cluster.get("secret", "-n", NAMESPACE, f"{PREFIX}-extender-token").get("data") or {}
            )
        ),
        timeout=60,
    )
    extender = f"system:serviceaccount:{NAMESPACE}:{PREFIX}-extender"
    agent = f"system:serviceaccount:{NAMESPACE}:{PREFIX}-node-agent"
    for who, verb, resource, allowed in (
        (extender, "create", "pods --subresource=binding", "yes"),
        # Its own preemption (docs/sharing.md, section 8) deletes victims and nominates.
        (extender, "delete", "pods", "yes"),
        (extender, "patch", "pods --subresource=status", "yes"),
        (extender, "list", "poddisruptionbudgets.policy", "yes"),
        (extender, "create", "pods", "no"),
        (extender, "delete", "nodes", "no"),
        (agent, "patch", "nodes", "yes"),
        (agent, "delete", "nodes", "no"),
    ):
        argv = ["auth", "can-i", verb, *resource.split(), f"--as={who}"]
        answer = cluster.kubectl(*argv, check=False)
        assert answer.stdout.strip() == allowed, (who, verb, resource, answer.stdout)

    def extender_policy() -> str:
        deployment = cluster.get("deployment", "-n", NAMESPACE, f"{PREFIX}-scheduler")
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        cm = cluster.get(
            "configmap", "-n", NAMESPACE, volumes["extender-config"]["configMap"]["name"]
        )
        return str(yaml.safe_load(cm["data"]["config.yaml"])["settings"]["policy"])

    assert extender_policy() == "kubegpu"

    # An upgrade changing one value lands in the cluster: a new extender ConfigMap, and the
    # scheduler Deployment pointing at it.
    done = run(
        [
            *helm,
            "upgrade",
            RELEASE,
            str(CHART),
            "--wait=false",
            "--reuse-values",
            "--set",
            "extender.policy=binpack",
        ],
        helm_env,
    )
    assert done.returncode == 0, done.stderr
    assert extender_policy() == "binpack"
    status = run([*helm, "status", RELEASE, "-o", "json"], helm_env)
    assert '"version":2' in status.stdout.replace(" ", ""), status.stdout

    # Uninstall leaves nothing with the release's label behind, the namespace included.
    done = run([*helm, "uninstall", RELEASE, "--wait", "--timeout=120s"], helm_env)
    assert done.returncode == 0, done.stderr
    cluster.wait_for(
        "nothing labelled with the release left",
        lambda: _labelled(cluster) == [],
        timeout=120,
    )
    assert cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0
    assert run([*helm, "status", RELEASE], helm_env).returncode != 0


NVIDIA_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {
        "name": "gpu.nvidia.com",
        # What NVIDIA's chart leaves on it (its release, installed by helm).
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {
            "meta.helm.sh/release-name": "nvidia-dra-driver-gpu",
            "meta.helm.sh/release-namespace": "nvidia-dra-driver-gpu",
        },
    },
    "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
}


def test_nvidia_naming_is_refused_while_nvidias_driver_is_installed(
    helm_cluster: tuple[Cluster, list[str]], helm_env: dict[str, str]
) -> None:
    """Two drivers named gpu.nvidia.com cannot share a cluster: with NVIDIA's DeviceClass
    present (from its release), installing with draDriver.naming=nvidia fails naming it; once
    it is gone the same install goes through (a server-side dry run: the chart's lookup asks
    the real API server)."""
    cluster, helm = helm_cluster
    nvidia = [*sets(INSTALL_VALUES), "--set", "draDriver.enabled=true"]
    nvidia += ["--set", "draDriver.naming=nvidia"]
    install = [*helm, "install", RELEASE, str(CHART), "--dry-run=server", *nvidia]
    cluster.kubectl("create", "-f", "-", input=json.dumps(NVIDIA_CLASS))
    try:
        done = run(install, helm_env)
        assert done.returncode != 0, done.stdout[-2000:]
        assert "the DeviceClass gpu.nvidia.com already exists" in done.stderr, done.stderr
        assert '"nvidia-dra-driver-gpu"' in done.stderr, done.stderr
    finally:
        cluster.kubectl("delete", "deviceclass", "gpu.nvidia.com", "--wait=true")
    done = run(install, helm_env)
    assert done.returncode == 0, done.stderr
    assert "name: gpu.nvidia.com" in done.stdout
