"""The manifests under deploy/: every kustomization renders with ``kubectl kustomize``, every
rendered object validates offline against the Kubernetes schemas in strict mode, and what the
objects say agrees with the code they run: RBAC rules, host paths, probe targets, image pins,
container arguments and the configs in the ConfigMaps."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml

import kubegpu
from kubegpu.cli.device_plugin import DEFAULT_KUBELET_DIR
from kubegpu.cli.exporter import parse_listen
from kubegpu.cli.main import SUBCOMMANDS, cli
from kubegpu.config.load import load_config
from kubegpu.config.model import Exporter, GpuShare, PluginFlags
from kubegpu.probes import LOOP_TIMEOUT_S
from kubegpu.sharing.resources import ResourceNames
from tests.deploy.manifests import (
    DEPLOY,
    INSTALL_OVERLAYS,
    SCHEMALESS,
    Obj,
    arg_value,
    container,
    container_env,
    find,
    find_prefixed,
    host_mounts,
    kustomizations,
    materialise_config_volumes,
    pod_spec,
    render,
    substitute,
    workloads,
)

# The Kubernetes version whose schemas kubernetes-validate ships (the newest in the wheel).
SCHEMA_VERSION = kubernetes_validate.latest_version()
# The oldest minor version install.md promises ("Kubernetes 1.28 or newer"): the manifests
# must validate there too, not only against the newest schemas.
OLDEST_SUPPORTED = "1.28.0"
ALL = kustomizations()
VALIDATED = [k for k in ALL if k not in SCHEMALESS]
NAMESPACE = "kubegpu"


def test_every_kustomization_is_known() -> None:
    # A new overlay is rendered and validated automatically; this names what exists so that a
    # renamed or lost one is noticed.
    assert set(ALL) == {
        "base",
        "examples/claim-budget",
        "examples/dra",
        "examples/dra-extended-resource",
        "examples/dra-nvidia-naming",
        "examples/nfd-labels",
        "examples/kueue",
        "examples/peer-compat",
        "examples/quota",
        "monitoring",
        "overlays/default-scheduler",
        "overlays/monitoring",
        "overlays/second-scheduler",
    }


# Kustomizations with the DRA driver: resource.k8s.io/v1 (DeviceClass) exists from 1.34 on, so
# they are checked against that version's schemas instead of the oldest supported one.
DRA_KUSTOMIZATIONS = frozenset(
    {"examples/dra", "examples/dra-extended-resource", "examples/dra-nvidia-naming"}
)
DRA_OLDEST = "1.34.0"


@pytest.mark.parametrize("version", [OLDEST_SUPPORTED, SCHEMA_VERSION])
@pytest.mark.parametrize("kustomization", VALIDATED)
def test_every_rendered_object_validates_against_the_kubernetes_schemas(
    kustomization: str, version: str
) -> None:
    if kustomization in DRA_KUSTOMIZATIONS and version == OLDEST_SUPPORTED:
        version = DRA_OLDEST
    objs = render(kustomization)
    assert objs
    for obj in objs:
        try:
            validated = kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{kustomization}: {obj['kind']} {obj['metadata']['name']}: {err}")
        # The wheel's own schemas for that minor version, not a newer or older stand-in.
        assert validated == kubernetes_validate.utils.major_minor(version)


def test_the_oldest_version_checked_is_the_one_install_md_promises() -> None:
    text = (DEPLOY.parent / "docs" / "install.md").read_text()
    match = re.search(r"Kubernetes (\d+\.\d+) or newer", text)
    assert match is not None
    assert f"{match.group(1)}.0" == OLDEST_SUPPORTED
    # Offline: both schema sets are in the wheel.
    assert {OLDEST_SUPPORTED, SCHEMA_VERSION} <= set(kubernetes_validate.utils.all_versions())


def test_strict_validation_refuses_a_field_kubernetes_does_not_know() -> None:
    # The check above must be able to fail: a misspelt field is an error, not ignored.
    agent = copy.deepcopy(find(render("base"), "DaemonSet", "kubegpu-node-agent"))
    pod_spec(agent)["containers"][0]["readynessProbe"] = {"exec": {"command": ["true"]}}
    with pytest.raises(kubernetes_validate.ValidationError, match="readynessProbe"):
        kubernetes_validate.validate(agent, SCHEMA_VERSION, strict=True)


def test_the_monitoring_overlay_holds_monitors_and_the_rules() -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in render("overlays/monitoring"))
    assert kinds == [
        ("PodMonitor", "kubegpu-node-agent"),
        ("PrometheusRule", "kubegpu"),
        ("ServiceMonitor", "kubegpu-extender"),
    ]


def test_the_podmonitor_scrapes_the_exporter_port_of_the_node_agent() -> None:
    monitor = find(render("overlays/monitoring"), "PodMonitor", "kubegpu-node-agent")
    agent = find(render("base"), "DaemonSet", "kubegpu-node-agent")
    labels = agent["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # The exporter runs inside the device plugin's process (--exporter).
    item = container(agent, "device-plugin")
    ports = {p["name"]: p["containerPort"] for p in item.get("ports", [])}
    _, listen_port = parse_listen(arg_value(item["args"], "--exporter-listen"))
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert ports[endpoint["port"]] == listen_port
        assert endpoint["path"] == "/metrics"


# -- RBAC ----------------------------------------------------------------------------------


def _lease_reader(name: str) -> list[dict[str, Any]]:
    """The extender's one namespaced right: get, and only get, of one Lease (leader.py reads
    it; it never lists or watches Leases)."""
    return [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [name],
            "verbs": ["get"],
        }
    ]


CLUSTER_RULES: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("ClusterRole", "kubegpu-node-agent"): [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "patch"]},
    ],
    ("ClusterRole", "kubegpu-extender"): [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
        # Its own preemption (kubegpu.extender.preemption): delete victims after marking them
        # DisruptionTarget, nominate the waiting pod, weigh disruption budgets.
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["list"]},
        # Ranking DRA nodes (/prioritize-dra): kube/dra_view.py lists and watches both.
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices", "resourceclaims"],
            "verbs": ["list", "watch"],
        },
    ],
}
# overlay -> every Role and ClusterRole it renders, with exactly these rules.
EXPECTED_RULES: dict[str, dict[tuple[str, str], list[dict[str, Any]]]] = {
    "overlays/second-scheduler": {
        **CLUSTER_RULES,
        ("Role", "kubegpu-scheduler-leader-election"): [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": ["kubegpu-scheduler"],
                "verbs": ["get", "update"],
            },
        ],
        ("Role", "kubegpu-extender-leader-lease"): _lease_reader("kubegpu-scheduler"),
    },
    "overlays/default-scheduler": {
        **CLUSTER_RULES,
        ("Role", "kubegpu-extender-leader-lease"): _lease_reader("kube-scheduler"),
    },
}
EXTENDER_ROLES = {
    ("ClusterRole", "kubegpu-extender", ""),
    ("Role", "kubegpu-extender-leader-lease", "kube-system"),
}

# overlay -> service account -> the roles bound to it (kind, name, namespace of a Role).
EXPECTED_BINDINGS: dict[str, dict[str, set[tuple[str, str, str]]]] = {
    "overlays/second-scheduler": {
        "kubegpu-node-agent": {("ClusterRole", "kubegpu-node-agent", "")},
        # The kube-scheduler container's; the extender beside it in the same pod uses its own.
        "kubegpu-scheduler": {
            ("ClusterRole", "system:kube-scheduler", ""),
            ("ClusterRole", "system:volume-scheduler", ""),
            ("Role", "extension-apiserver-authentication-reader", "kube-system"),
            ("Role", "kubegpu-scheduler-leader-election", "kube-system"),
        },
        "kubegpu-extender": EXTENDER_ROLES,
    },
    "overlays/default-scheduler": {
        "kubegpu-node-agent": {("ClusterRole", "kubegpu-node-agent", "")},
        "kubegpu-extender": EXTENDER_ROLES,
    },
}


def _roles(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if o["kind"] in ("Role", "ClusterRole")]


@pytest.mark.parametrize("kustomization", ALL)
def test_rbac_rules_have_no_wildcards(kustomization: str) -> None:
    for role in _roles(render(kustomization)):
        assert "aggregationRule" not in role
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), f"{role['metadata']['name']}: {key}: *"
                assert all("*" not in value for value in rule.get(key, []))
            assert rule["verbs"] and rule["resources"]


def test_each_role_is_defined_in_exactly_one_file_under_deploy() -> None:
    # One source per role: an overlay binds the base's ClusterRole instead of carrying a copy
    # that could drift from it. The extender's Lease reader is the exception, one per overlay,
    # each naming the Lease of that overlay's scheduler (checked against its scheduler config
    # below).
    defined: dict[tuple[str, str], list[str]] = {}
    for path in sorted(DEPLOY.rglob("*.yaml")):
        # The Helm chart's templates are Go templates, not YAML; e2e/tests/test_07_helm.py
        # renders them with the real helm and compares them with these overlays.
        if path.is_relative_to(DEPLOY / "helm") and path.parent.name == "templates":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in ("Role", "ClusterRole"):
                key = (doc["kind"], doc["metadata"]["name"])
                defined.setdefault(key, []).append(path.relative_to(DEPLOY).as_posix())
    assert defined == {
        ("ClusterRole", "kubegpu-node-agent"): ["base/node-agent-rbac.yaml"],
        # Added by the peer compat component only: patch node status for the peers' figures.
        ("ClusterRole", "kubegpu-node-agent-peer-compat"): [
            "components/peer-compat/node-agent-peer-rbac.yaml"
        ],
        ("ClusterRole", "kubegpu-extender"): ["base/extender-clusterrole.yaml"],
        ("ClusterRole", "kubegpu-dra-driver"): ["components/dra-driver/dra-driver-rbac.yaml"],
        ("ClusterRole", "kubegpu-claim-budget"): ["components/claim-budget/claim-budget-rbac.yaml"],
        ("Role", "kubegpu-scheduler-leader-election"): [
            "overlays/second-scheduler/scheduler-rbac.yaml"
        ],
        ("Role", "kubegpu-extender-leader-lease"): [
            "overlays/default-scheduler/extender-lease-rbac.yaml",
            "overlays/second-scheduler/extender-lease-rbac.yaml",
        ],
    }


@pytest.mark.parametrize("overlay", INSTALL_OVERLAYS)
def test_each_role_has_exactly_the_expected_rules(overlay: str) -> None:
    roles = {(r["kind"], r["metadata"]["name"]): r["rules"] for r in _roles(render(overlay))}
    assert roles == EXPECTED_RULES[overlay]


@pytest.mark.parametrize("overlay", INSTALL_OVERLAYS)
def test_each_service_account_is_bound_only_to_its_own_roles(overlay: str) -> None:
    objs = render(overlay)
    bound: dict[str, set[tuple[str, str, str]]] = {}
    for binding in (o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace", "") if binding["kind"] == "RoleBinding" else ""
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            assert subject["namespace"] == NAMESPACE
            bound.setdefault(subject["name"], set()).add((ref["kind"], ref["name"], where))
    accounts = {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"}
    assert set(bound) == accounts
    assert bound == EXPECTED_BINDINGS[overlay]
    for workload in workloads(objs):
        assert pod_spec(workload)["serviceAccountName"] in accounts


# Where the in-cluster client (lightkube's from_env, which kubegpu.kube.client uses) reads the
# token, CA and namespace, and where the ServiceAccount admission plugin mounts the pod's own.
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def api_identities(objs: list[Obj], workload: Obj) -> dict[str, str]:
    """container -> the service account whose token it presents to the API server: the pod's,
    unless the container mounts a service-account-token Secret at TOKEN_DIR (admission then
    leaves that container without the pod's token)."""
    spec = pod_spec(workload)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    out = {}
    for item in spec["containers"]:
        account = spec["serviceAccountName"]
        for mount in item.get("volumeMounts", []):
            if mount["mountPath"].rstrip("/") != TOKEN_DIR:
                continue
            assert mount.get("readOnly") is True
            secret = find(objs, "Secret", volumes[mount["name"]]["secret"]["secretName"])
            assert secret["type"] == "kubernetes.io/service-account-token"
            account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
        out[item["name"]] = account
    return out


@pytest.mark.parametrize("overlay", INSTALL_OVERLAYS)
def test_the_extender_talks_to_the_api_server_only_as_kubegpu_extender(overlay: str) -> None:
    objs = render(overlay)
    workload = find(objs, *EXTENDERS[overlay])
    identities = api_identities(objs, workload)
    assert identities["extender"] == "kubegpu-extender"
    assert EXPECTED_BINDINGS[overlay]["kubegpu-extender"] == EXTENDER_ROLES
    if overlay == "overlays/second-scheduler":
        # kube-scheduler keeps the pod's token (and its rights); the containers cannot reach
        # each other's files through a shared process namespace.
        assert identities["kube-scheduler"] == "kubegpu-scheduler"
        assert not pod_spec(workload).get("shareProcessNamespace")
    item = container(workload, "extender")
    # In-cluster config, not a kubeconfig that would name other credentials.
    assert not any(a.startswith("--kubeconfig") for a in item["args"])
    assert "KUBECONFIG" not in container_env(item)


def test_the_extender_token_mount_holds_the_files_the_in_cluster_client_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightkube.config.kubeconfig import SERVICE_ACCOUNT, KubeConfig

    assert SERVICE_ACCOUNT == TOKEN_DIR
    objs = render("overlays/second-scheduler")
    workload = find(objs, *EXTENDERS["overlays/second-scheduler"])
    volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
    (mount,) = [
        m for m in container(workload, "extender")["volumeMounts"] if m["mountPath"] == TOKEN_DIR
    ]
    # What the token controller writes into a kubernetes.io/service-account-token Secret, laid
    # out as the kubelet projects the volume's items.
    data = {
        "token": "extender-token",
        "ca.crt": "-----BEGIN CERTIFICATE-----\n",
        "namespace": NAMESPACE,
    }
    items = volumes[mount["name"]]["secret"]["items"]
    for entry in items:
        (tmp_path / entry["path"]).write_text(data[entry["key"]])
    assert {entry["key"] for entry in items} == set(data)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    used = KubeConfig.from_service_account(tmp_path).get()
    assert used.user.token == "extender-token"
    assert used.namespace == NAMESPACE
    assert used.cluster.certificate_auth == str(tmp_path / "ca.crt")


# -- the node agent ------------------------------------------------------------------------


def _agent() -> Obj:
    return find(render("overlays/second-scheduler"), "DaemonSet", "kubegpu-node-agent")


def test_node_agent_mounts_the_host_paths_the_code_uses_by_default() -> None:
    agent = _agent()
    plugin = host_mounts(agent, "device-plugin")
    # Same path inside as on the host: the kubelet names these paths in its own messages.
    assert plugin[DEFAULT_KUBELET_DIR] == (DEFAULT_KUBELET_DIR, False)
    cdi_dir = PluginFlags().cdi_dir
    assert plugin[cdi_dir] == (cdi_dir, False)
    assert plugin["/dev"] == ("/dev", True)
    args = container(agent, "device-plugin")["args"]
    assert arg_value(args, "--kubelet-dir") == DEFAULT_KUBELET_DIR
    # Shared mode cross-checks with the kubelet's PodResources API.
    share_socket = Path(GpuShare().pod_resources_socket)
    assert plugin[str(share_socket.parent)] == (str(share_socket.parent), True)

    # The exporter inside it asks the kubelet's PodResources at its default socket (the
    # directory is mounted, not the socket: the kubelet re-creates the socket when it
    # restarts) and reads GPU processes' cgroups under the host's /proc.
    assert not [a for a in args if a.startswith("--exporter-pod-resources-socket")]
    socket = Path(Exporter().pod_resources_socket)
    assert plugin[str(socket.parent)] == (str(socket.parent), True)
    proc_in_container, read_only = plugin["/proc"]
    assert read_only and arg_value(args, "--exporter-proc") == proc_in_container
    volumes = {v["name"]: v for v in pod_spec(agent)["volumes"]}
    assert all(v["hostPath"]["type"] for v in volumes.values() if "hostPath" in v)


def test_only_the_node_agent_touches_the_host() -> None:
    for overlay in INSTALL_OVERLAYS:
        for workload in workloads(render(overlay)):
            spec = pod_spec(workload)
            host_paths = [v for v in spec.get("volumes", []) if "hostPath" in v]
            if workload["metadata"]["name"] != "kubegpu-node-agent":
                assert not host_paths
            assert not spec.get("hostPID") and not spec.get("hostIPC")
            for item in spec["containers"]:
                context = item["securityContext"]
                assert context.get("privileged") is not True
                assert context["allowPrivilegeEscalation"] is False
                assert context["readOnlyRootFilesystem"] is True
                assert context["capabilities"]["drop"] == ["ALL"]
                assert "add" not in context["capabilities"]


# Every label that says "this node has an NVIDIA GPU", as the tools that set them spell it.
GPU_PRESENCE_LABELS = (
    # Node Feature Discovery's default: PCI labels named by class and vendor (0x10de NVIDIA);
    # data-centre GPUs are 3D controllers (0302), others VGA controllers (0300).
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
    # NFD with deviceLabelFields [vendor], as NVIDIA's GPU operator configures it.
    "feature.node.kubernetes.io/pci-10de.present",
    # By hand, or the GPU operator.
    "nvidia.com/gpu.present",
)


def selects(terms: list[Obj], labels: dict[str, str]) -> bool:
    """The API server's nodeSelectorTerms semantics: terms ORed, expressions ANDed; NotIn and
    DoesNotExist match a node without the label."""

    def matches(expression: Obj) -> bool:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        if operator == "In":
            return key in labels and labels[key] in values
        if operator == "NotIn":
            return key not in labels or labels[key] not in values
        if operator == "Exists":
            return key in labels
        if operator == "DoesNotExist":
            return key not in labels
        raise AssertionError(f"operator {operator} not modelled")

    return any(all(matches(e) for e in term["matchExpressions"]) for term in terms)


def test_node_agent_runs_on_gpu_nodes_only_and_is_node_critical() -> None:
    spec = pod_spec(_agent())
    assert spec["priorityClassName"] == "system-node-critical"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    presence = set()
    for term in terms:
        expressions = {e["key"]: (e["operator"], e["values"]) for e in term["matchExpressions"]}
        # Every term asks for a GPU and leaves out nodes kept on NVIDIA's plugin or between
        # the two plugins while migrating.
        assert expressions.pop("kubegpu.io/device-plugin") == ("NotIn", ["nvidia", "none"])
        ((key, (operator, values)),) = expressions.items()
        assert (operator, values) == ("In", ["true"])
        presence.add(key)
    assert presence == set(GPU_PRESENCE_LABELS)
    tolerated = {(t["key"], t.get("effect")) for t in spec["tolerations"]}
    assert ("nvidia.com/gpu", "NoSchedule") in tolerated


@pytest.mark.parametrize(
    ("labels", "runs"),
    [
        # What plain NFD puts on an H100/A100 node (3D controller) and on a VGA-class card.
        ({"feature.node.kubernetes.io/pci-0302_10de.present": "true"}, True),
        ({"feature.node.kubernetes.io/pci-0300_10de.present": "true"}, True),
        # The GPU operator's NFD, and a hand-set label.
        ({"feature.node.kubernetes.io/pci-10de.present": "true"}, True),
        ({"nvidia.com/gpu.present": "true"}, True),
        # A CPU node: NFD labels its (virtio, 1af4) VGA device, and an NVIDIA NIC (15b3) is
        # not a GPU.
        (
            {
                "feature.node.kubernetes.io/pci-0300_1af4.present": "true",
                "feature.node.kubernetes.io/pci-0200_15b3.present": "true",
            },
            False,
        ),
        ({}, False),
        # Kept on NVIDIA's plugin, or between the two plugins while migrating.
        (
            {
                "feature.node.kubernetes.io/pci-0302_10de.present": "true",
                "kubegpu.io/device-plugin": "nvidia",
            },
            False,
        ),
        ({"nvidia.com/gpu.present": "true", "kubegpu.io/device-plugin": "none"}, False),
        ({"nvidia.com/gpu.present": "true", "kubegpu.io/device-plugin": "kubegpu"}, True),
    ],
)
def test_the_node_agent_schedules_onto_the_nodes_nfd_or_an_admin_mark(
    labels: dict[str, str], runs: bool
) -> None:
    terms = pod_spec(_agent())["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert selects(terms, labels) is runs


def test_install_md_names_every_label_the_node_agent_selects_on() -> None:
    # An admin checks their nodes against that list; a label added here must be added there.
    text = (DEPLOY.parent / "docs" / "install.md").read_text()
    section = text.split("## Which nodes run the agent", 1)[1].split("\n## ", 1)[0]
    for key in GPU_PRESENCE_LABELS:
        assert f"`{key}`" in section, key


def test_every_node_agent_container_knows_its_node_from_the_downward_api() -> None:
    for item in pod_spec(_agent())["containers"]:
        (var,) = [v for v in item["env"] if v["name"] == "NODE_NAME"]
        assert var["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        assert arg_value(item["args"], "--node-name") == "$(NODE_NAME)"


@pytest.mark.parametrize(
    ("kustomization", "daemonset", "name"),
    [
        ("overlays/second-scheduler", "kubegpu-node-agent", "device-plugin"),
        ("examples/dra", "kubegpu-dra-driver", "dra-driver"),
    ],
)
def test_node_probes_ask_the_health_endpoints_on_the_port_the_process_listens_on(
    kustomization: str, daemonset: str, name: str
) -> None:
    # The device plugin's and the DRA driver's /healthz and /readyz (kubegpu.probes).
    item = container(find(render(kustomization), "DaemonSet", daemonset), name)
    _, port = parse_listen(arg_value(item["args"], "--health-listen"))
    ports = {p["name"]: p["containerPort"] for p in item["ports"]}
    paths = {}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        target = item[probe]["httpGet"]
        assert ports[target["port"]] == port
        paths[probe] = target["path"]
        # Longer than the agent waits for its loop, so a 503 says why before the kubelet
        # gives up on the request.
        assert item[probe]["timeoutSeconds"] > LOOP_TIMEOUT_S
    assert paths == {
        "startupProbe": "/healthz",
        "readinessProbe": "/readyz",
        "livenessProbe": "/healthz",
    }


def test_the_labeller_reads_the_device_plugins_own_config_file() -> None:
    # Its sharing labels then say what the device plugin advertises.
    agent = _agent()
    plugin, labels = container(agent, "device-plugin"), container(agent, "labels")
    path = arg_value(plugin["args"], "--config")
    assert arg_value(labels["args"], "--config") == path

    def volume_of(item: Obj) -> str:
        (mount,) = [m for m in item["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
        return str(mount["name"])

    assert volume_of(labels) == volume_of(plugin) == "config"


NFD_EXAMPLE = "examples/nfd-labels"


def test_the_nfd_component_changes_only_where_the_labeller_writes() -> None:
    plain = render("overlays/second-scheduler")
    nfd = render(NFD_EXAMPLE)
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, nfd)) == sorted(map(key, plain))
    for obj in nfd:
        if obj["kind"] != "DaemonSet":
            assert obj == find(plain, obj["kind"], obj["metadata"]["name"])
    agent, before = find(nfd, "DaemonSet", "kubegpu-node-agent"), _agent()
    assert container(agent, "device-plugin") == container(before, "device-plugin")
    labels = container(agent, "labels")
    assert arg_value(labels["args"], "--sink") == "nfd"
    assert arg_value(labels["args"], "--config") == arg_value(
        container(before, "labels")["args"], "--config"
    )
    # Root (owner of the host's features.d), still with no capabilities and no escalation.
    context = labels["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True


def test_the_nfd_labeller_writes_its_labels_into_nfd_s_features_directory(
    tmp_path: Path,
) -> None:
    from kubegpu.labels.sinks import DEFAULT_NFD_FEATURE_FILE, parse_feature_file

    objs = render(NFD_EXAMPLE)
    agent = find(objs, "DaemonSet", "kubegpu-node-agent")
    labels = container(agent, "labels")
    feature_file = Path(arg_value(labels["args"], "--nfd-file"))
    # The directory nfd-worker's local source reads, from the host, writable.
    assert feature_file.parent == DEFAULT_NFD_FEATURE_FILE.parent
    mounts = host_mounts(agent, "labels")
    assert mounts[str(feature_file.parent)] == (str(feature_file.parent), False)
    # Run the labeller with the container's arguments, the host directory and the ConfigMap
    # laid out locally, on a fake node (no NVML here).
    host_dir = tmp_path / "features.d"
    host_dir.mkdir()
    paths = materialise_config_volumes(objs, agent, "labels", tmp_path / "config")
    paths[str(feature_file.parent)] = str(host_dir)
    args = [
        *substitute(labels["args"], container_env(labels), paths),
        "--backend=fake",
        "--fake-gpus=4xT4",
        "--once",
    ]
    assert parse_with_the_real_cli(args).params["sink"] == "nfd"
    done = subprocess.run(
        [sys.executable, "-m", "kubegpu", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    written = parse_feature_file((host_dir / feature_file.name).read_text())
    assert written["nvidia.com/gpu.count"] == "4"
    assert written["nvidia.com/gpu.product"] == "Tesla-T4"


def test_the_exporter_runs_inside_the_device_plugin_on_its_metrics_port() -> None:
    agent = _agent()
    names = [item["name"] for item in pod_spec(agent)["containers"]]
    assert names == ["device-plugin", "labels"]  # no separate exporter container
    item = container(agent, "device-plugin")
    assert "--exporter" in item["args"]
    _, metrics = parse_listen(arg_value(item["args"], "--exporter-listen"))
    _, health = parse_listen(arg_value(item["args"], "--health-listen"))
    ports = {p["name"]: p["containerPort"] for p in item["ports"]}
    assert ports == {"metrics": metrics, "health": health}
    # The probes ask the agent's own endpoints, never the exporter's /healthz (stale metrics
    # must not restart the device plugin).
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert item[probe]["httpGet"]["port"] == "health"


# -- images and arguments ------------------------------------------------------------------


@pytest.mark.parametrize("overlay", INSTALL_OVERLAYS)
def test_every_image_is_pinned_to_a_version(overlay: str) -> None:
    for workload in workloads(render(overlay)):
        spec = pod_spec(workload)
        for item in spec["containers"] + spec.get("initContainers", []):
            image = item["image"]
            name, _, tag = image.split("@")[0].rpartition(":")
            assert name and tag and tag != "latest", image
            assert "/" in name, f"{image}: name the registry"
            if name.endswith("/kubegpu"):
                assert tag == kubegpu.__version__, "the manifests run the version in pyproject"


# The Kueue example's Job is a user's workload, not a kubegpu pod.
@pytest.mark.parametrize("kustomization", [k for k in kustomizations() if k != "examples/kueue"])
def test_no_kubegpu_pod_gets_service_environment_variables(kustomization: str) -> None:
    """The kubelet's Service variables (KUBEGPU_EXTENDER_METRICS_PORT=tcp://IP:9402 for the
    Service kubegpu-extender-metrics) share kubegpu's KUBEGPU_* settings prefix: the installed
    extender read one as its --metrics-port and refused to start."""
    for workload in workloads(render(kustomization)):
        assert pod_spec(workload).get("enableServiceLinks") is False, workload["metadata"]


def _configmap_text(objs: list[Obj], prefix: str) -> str:
    text: str = find_prefixed(objs, "ConfigMap", prefix)["data"]["config.yaml"]
    return text


def _kubegpu_containers(overlay: str) -> list[tuple[Obj, str]]:
    out = []
    for workload in workloads(render(overlay)):
        for item in pod_spec(workload)["containers"]:
            if item["image"].rpartition(":")[0].endswith("/kubegpu"):
                out.append((workload, item["name"]))
    return out


def parse_with_the_real_cli(args: list[str]) -> click.Context:
    """Parse a container's arguments exactly as ``kubegpu`` would, without running it."""
    split = next(i for i, arg in enumerate(args) if arg in SUBCOMMANDS)
    root = cli.make_context("kubegpu", args[: split + 1])
    command = cli.get_command(root, args[split])
    assert command is not None
    return command.make_context(args[split], args[split + 1 :], parent=root)


@pytest.mark.parametrize("overlay", INSTALL_OVERLAYS)
def test_every_kubegpu_container_s_arguments_parse_with_the_real_cli(
    overlay: str, tmp_path: Path
) -> None:
    objs = render(overlay)
    seen = set()
    for workload, name in _kubegpu_containers(overlay):
        item = container(workload, name)
        paths = materialise_config_volumes(objs, workload, name, tmp_path / name)
        args = substitute(item["args"], container_env(item), paths)
        ctx = parse_with_the_real_cli(args)
        seen.add(ctx.info_name)
        if ctx.info_name == "device-plugin":
            assert ctx.params["config_path"] is not None
            assert ctx.params["exporter"] is True
    assert {"device-plugin", "labels", "extender"} <= seen


def test_the_cli_check_refuses_an_option_the_command_does_not_have() -> None:
    with pytest.raises(click.NoSuchOption):
        parse_with_the_real_cli(["device-plugin", "--kubelet-directory=/x"])
    with pytest.raises(click.BadParameter):
        parse_with_the_real_cli(["exporter", "--pod-directory=etcd"])


@pytest.mark.parametrize("overlay", INSTALL_OVERLAYS)
def test_the_node_agent_config_is_a_valid_v1_config(overlay: str, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(_configmap_text(render(overlay), "kubegpu-node-agent-config"))
    config = load_config(path, {})
    assert config.version == "v1"
    mounts = host_mounts(_agent(), "device-plugin")
    assert config.flags.plugin.cdi_dir in mounts
    share = config.sharing.gpu_share
    assert share.enabled  # the extender is installed with it: shared pods need the slots
    assert str(Path(share.pod_resources_socket).parent) in mounts


def test_node_agent_and_extender_use_the_same_resource_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(_configmap_text(render(INSTALL_OVERLAYS[0]), "kubegpu-node-agent-config"))
    share = load_config(path, {}).sharing.gpu_share
    agent_names = ResourceNames(
        share.whole_resource_name,
        share.memory_resource_name,
        share.compute_resource_name,
        share.resource_name,
    )
    for overlay in INSTALL_OVERLAYS:
        extender = _extender_config(overlay, tmp_path / overlay.replace("/", "-"), monkeypatch)
        assert extender.names == agent_names


# overlay -> (workload kind, name) running the extender, and H7's scheduler config it serves.
EXTENDERS = {
    "overlays/second-scheduler": ("Deployment", "kubegpu-scheduler"),
    "overlays/default-scheduler": ("DaemonSet", "kubegpu-extender"),
}
SCHEDULER_CONFIGS = {
    "overlays/second-scheduler": "kubegpu-scheduler.yaml",
    "overlays/default-scheduler": "default-scheduler.yaml",
}


def _extender_config(overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The extender's resolved settings, through the real command with the container's args
    and the ConfigMap's file: everything the command does before it serves."""
    import kubegpu.cli.extender as extender_cli

    seen: list[Any] = []

    async def capture(config: Any) -> None:
        seen.append(config)

    monkeypatch.setattr(extender_cli, "_serve", capture)
    objs = render(overlay)
    workload = find(objs, *EXTENDERS[overlay])
    item = container(workload, "extender")
    paths = materialise_config_volumes(objs, workload, "extender", tmp_path)
    ctx = parse_with_the_real_cli(substitute(item["args"], container_env(item), paths))
    with ctx:
        ctx.command.invoke(ctx)
    (config,) = seen
    return config


def _scheduler_config(overlay: str) -> Obj:
    text = _configmap_text(render(overlay), "kubegpu-(default-)?scheduler-config")
    config: Obj = yaml.safe_load(text)
    return config


@pytest.mark.parametrize("overlay", INSTALL_OVERLAYS)
def test_the_scheduler_config_is_the_one_in_deploy_scheduler(overlay: str) -> None:
    # kustomize cannot read files outside an overlay, so the overlay holds a copy.
    source = DEPLOY / "scheduler" / SCHEDULER_CONFIGS[overlay]
    copy_path = DEPLOY / overlay / "kube-scheduler-config.yaml"
    assert copy_path.read_text() == source.read_text(), f"cp {source} {copy_path}"
    assert _scheduler_config(overlay) == yaml.safe_load(source.read_text())


@pytest.mark.parametrize("overlay", INSTALL_OVERLAYS)
def test_the_scheduler_calls_the_extender_where_it_listens(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _extender_config(overlay, tmp_path, monkeypatch)
    # The main entry first; the second scheduler's DRA ranking entry (prioritize-dra) calls
    # the same extender, so every entry must reach it the same way.
    entries = _scheduler_config(overlay)["extenders"]
    extender = entries[0]
    scheme = "https" if config.tls else "http"
    for entry in entries:
        assert entry["urlPrefix"].rstrip("/") == f"{scheme}://{config.host}:{config.port}"
        assert bool(entry.get("enableHTTPS")) == config.tls
        # A client certificate is sent exactly when the extender demands one.
        sends_certificate = "certFile" in entry.get("tlsConfig", {})
        assert sends_certificate == (config.client_ca_file is not None)
    names = config.names
    assert config.names == ResourceNames()
    managed = {m["name"]: m["ignoredByScheduler"] for m in extender["managedResources"]}
    # Only what nodes never advertise is left to the extender alone.
    assert managed == {
        names.whole_gpu: False,
        names.share_slot: False,
        names.gpu_memory: True,
        names.gpu_compute: True,
    }
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is False


def _container_port(item: Obj, port: int | str) -> int:
    """A probe's or Service's target port in a container: a number, or a named port."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in item.get("ports", []) if p["name"] == port]
    return int(number)


@pytest.mark.parametrize("overlay", INSTALL_OVERLAYS)
def test_the_extender_probes_ask_its_metrics_listener(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The verbs listen on loopback (and, in default-scheduler, only for clients with the
    # scheduler's certificate), where the kubelet's HTTP probes cannot go: the probes ask the
    # read-only metrics listener on the pod IP (the node's, on the host network) instead.
    config = _extender_config(overlay, tmp_path, monkeypatch)
    item = container(find(render(overlay), *EXTENDERS[overlay]), "extender")
    assert config.host == "127.0.0.1"  # loopback only, in both overlays
    assert config.metrics_port is not None and config.metrics_port != config.port
    assert config.metrics_host in ("0.0.0.0", "::")  # reachable on the pod IP
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        target = item[probe]["httpGet"]
        assert target["path"] == path
        assert target.get("scheme", "HTTP") == "HTTP"
        assert "host" not in target  # the pod IP, where the metrics listener is
        assert _container_port(item, target["port"]) == config.metrics_port
    if config.tls:
        mounted = {m["mountPath"] for m in item["volumeMounts"]}
        for path in (config.tls_cert_file, config.tls_key_file, config.client_ca_file):
            assert path.parent.as_posix() in mounted


def _selected(objs: list[Obj], service: Obj) -> list[Obj]:
    """The workloads whose pods a Service's selector picks (same namespace)."""
    selector = service["spec"].get("selector") or {}
    assert selector, f"Service {service['metadata']['name']} selects nothing"
    return [
        w
        for w in workloads(objs)
        if w["metadata"].get("namespace") == service["metadata"].get("namespace")
        and selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
    ]


@pytest.mark.parametrize("overlay", INSTALL_OVERLAYS)
def test_the_metrics_service_selects_the_extender_pods_on_their_metrics_port(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = render(overlay)
    config = _extender_config(overlay, tmp_path, monkeypatch)
    service = find(objs, "Service", "kubegpu-extender-metrics")
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    # Exactly the extender's pods: not the node agent's, whose exporter has its own monitor.
    assert _selected(objs, service) == [find(objs, *EXTENDERS[overlay])]
    item = container(find(objs, *EXTENDERS[overlay]), "extender")
    (port,) = service["spec"]["ports"]
    assert port["name"] == "metrics"
    assert _container_port(item, port.get("targetPort", port["port"])) == config.metrics_port
    # A named target port the container does not declare would leave the Service empty.
    assert isinstance(port["targetPort"], str)


@pytest.mark.parametrize("overlay", INSTALL_OVERLAYS)
def test_no_service_exposes_the_extender_verbs(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = render(overlay)
    config = _extender_config(overlay, tmp_path, monkeypatch)
    services = [o for o in objs if o["kind"] == "Service"]
    assert services  # the check below has something to check
    for service in services:
        for workload in _selected(objs, service):
            for item in pod_spec(workload)["containers"]:
                if item["name"] != "extender":
                    continue
                for port in service["spec"]["ports"]:
                    target = _container_port(item, port.get("targetPort", port["port"]))
                    assert target != config.port, service["metadata"]["name"]
    # The verbs' port is not even declared as a container port, so no named port can reach it.
    item = container(find(objs, *EXTENDERS[overlay]), "extender")
    assert config.port not in {p["containerPort"] for p in item.get("ports", [])}


def test_the_servicemonitor_scrapes_the_metrics_service_of_both_install_overlays() -> None:
    monitor = find(render("overlays/monitoring"), "ServiceMonitor", "kubegpu-extender")
    for overlay in INSTALL_OVERLAYS:
        service = find(render(overlay), "Service", "kubegpu-extender-metrics")
        labels = service["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        # A ServiceMonitor without namespaceSelector looks in its own namespace only.
        assert "namespaceSelector" not in monitor["spec"]
        assert service["metadata"]["namespace"] == monitor["metadata"]["namespace"] == NAMESPACE
        names = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in names
            assert endpoint["path"] == "/metrics"


def test_the_second_scheduler_reads_its_config_and_holds_its_own_lease() -> None:
    overlay = "overlays/second-scheduler"
    objs = render(overlay)
    scheduler = container(find(objs, "Deployment", "kubegpu-scheduler"), "kube-scheduler")
    config_path = arg_value(scheduler["command"], "--config")
    mounts = {m["mountPath"] for m in scheduler["volumeMounts"]}
    assert str(Path(config_path).parent) in mounts
    config = _scheduler_config(overlay)
    election = config["leaderElection"]
    # Not the default scheduler's Lease (kube-system/kube-scheduler): the two would contend.
    assert election["resourceName"] != "kube-scheduler"
    role = find(objs, "Role", "kubegpu-scheduler-leader-election")
    assert role["metadata"]["namespace"] == election["resourceNamespace"]
    named = [r for r in role["rules"] if "resourceNames" in r]
    assert named[0]["resourceNames"] == [election["resourceName"]]
    assert [p["schedulerName"] for p in config["profiles"]] == ["kubegpu-scheduler"]


def elected_lease(config: Obj) -> str:
    """namespace/name of the Lease a KubeSchedulerConfiguration (v1) elects with, with
    kube-scheduler's defaults for what it leaves out."""
    election = config.get("leaderElection", {})
    # Without leader election no Lease is held, and an extender with leader-lease never binds.
    assert election.get("leaderElect", True) is True
    assert election.get("resourceLock", "leases") == "leases"
    namespace = election.get("resourceNamespace", "kube-system")
    return f"{namespace}/{election.get('resourceName', 'kube-scheduler')}"


def test_elected_lease_applies_kube_scheduler_s_defaults() -> None:
    assert elected_lease({}) == "kube-system/kube-scheduler"
    assert elected_lease({"leaderElection": {"resourceName": "x"}}) == "kube-system/x"


@pytest.mark.parametrize("overlay", INSTALL_OVERLAYS)
def test_the_extender_binds_only_beside_the_scheduler_holding_its_scheduler_s_lease(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each extender keeps its card reservations in memory; leader-lease makes it bind only
    # while the kube-scheduler next to it leads. That only works if it names the very Lease
    # the scheduler config of the same overlay elects with, and may read it.
    objs = render(overlay)
    lease = elected_lease(_scheduler_config(overlay))
    config = _extender_config(overlay, tmp_path, monkeypatch)
    assert config.leader_lease == lease
    namespace, name = lease.split("/")
    role = find(objs, "Role", "kubegpu-extender-leader-lease")
    assert role["metadata"]["namespace"] == namespace
    assert role["rules"] == _lease_reader(name)
    binding = find(objs, "RoleBinding", "kubegpu-extender-leader-lease")
    assert binding["metadata"]["namespace"] == namespace
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert api_identities(objs, find(objs, *EXTENDERS[overlay]))["extender"] in {
        s["name"] for s in binding["subjects"]
    }
    # The identity is left to default to the host name, which kube-scheduler on the same host
    # writes before "_<uuid>": the extender must share its host name with kube-scheduler.
    assert config.leader_identity is None
    spec = pod_spec(find(objs, *EXTENDERS[overlay]))
    assert not {"hostname", "subdomain", "setHostnameAsFQDN"} & set(spec)
    if overlay == "overlays/default-scheduler":
        # The static kube-scheduler pod runs on the host network and so sees the node's host
        # name; so does a host-network pod, on every control-plane node.
        assert spec["hostNetwork"] is True
        assert "node-role.kubernetes.io/control-plane" in spec["nodeSelector"]
    else:
        # Containers of one pod share its host name (the pod's name).
        assert {c["name"] for c in spec["containers"]} == {"kube-scheduler", "extender"}


def test_no_two_extenders_hand_out_cards_at_once_during_an_update() -> None:
    # The extender's card reservations live in its memory (docs/sharing.md, "Replicas: run
    # exactly one"): an update must stop the old extender before starting the new one.
    scheduler = find(render("overlays/second-scheduler"), "Deployment", "kubegpu-scheduler")
    assert scheduler["spec"]["replicas"] == 1
    assert scheduler["spec"]["strategy"] == {"type": "Recreate"}
    # Default-scheduler layout: one extender per control-plane node, each called only by the
    # kube-scheduler beside it; a DaemonSet update never surges a second pod onto a node.
    extender = find(render("overlays/default-scheduler"), "DaemonSet", "kubegpu-extender")
    strategy = extender["spec"]["updateStrategy"]
    assert strategy["rollingUpdate"].get("maxSurge", 0) == 0
    sharing = (DEPLOY.parent / "docs" / "sharing.md").read_text()
    assert "`replicas: 1` and `strategy: Recreate`" in sharing


def test_the_quota_example_limits_every_gpu_resource_the_code_uses() -> None:
    (quota,) = [o for o in render("examples/quota") if o["kind"] == "ResourceQuota"]
    hard = quota["spec"]["hard"]
    assert set(hard) == {f"requests.{name}" for name in ResourceNames().all}
    # Extended resources take integers only.
    assert all(str(v).isdigit() for v in hard.values())


@pytest.mark.parametrize("overlay", INSTALL_OVERLAYS)
def test_critical_priority_classes_are_covered_by_a_quota_in_their_namespace(
    overlay: str,
) -> None:
    # Clusters that limit critical priority classes (GKE) admit such pods only in namespaces
    # with a quota scoped to them.
    objs = render(overlay)
    covered: set[tuple[str, str]] = set()
    for quota in (o for o in objs if o["kind"] == "ResourceQuota"):
        for expression in quota["spec"].get("scopeSelector", {}).get("matchExpressions", []):
            if expression["scopeName"] == "PriorityClass" and expression["operator"] == "In":
                for value in expression["values"]:
                    covered.add((quota["metadata"]["namespace"], value))
    for workload in workloads(objs):
        priority = pod_spec(workload).get("priorityClassName", "")
        if priority.startswith("system-"):
            assert (workload["metadata"]["namespace"], priority) in covered


def test_the_kube_scheduler_version_knob_reaches_the_extenders_check() -> None:
    # One knob (images: newTag): the extender gets the same version, and refuses to start
    # beside a kube-scheduler that the API server's version does not allow.
    objs = render("overlays/second-scheduler")
    pod = find(objs, "Deployment", "kubegpu-scheduler")["spec"]["template"]["spec"]
    scheduler = next(c for c in pod["containers"] if c["name"] == "kube-scheduler")
    image, _, tag = scheduler["image"].rpartition(":")
    assert image == "registry.k8s.io/kube-scheduler" and re.fullmatch(r"v\d+\.\d+\.\d+", tag)
    extender = next(c for c in pod["containers"] if c["name"] == "extender")
    env = {e["name"]: e.get("value") for e in extender.get("env", [])}
    assert env["KUBEGPU_EXTENDER_SCHEDULER_VERSION"] == tag
