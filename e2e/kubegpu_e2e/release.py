"""kubegpu installed as users install it: the image built from the project's Dockerfile
(e2e/components/image/build.sh, exported by e2e/run as KUBEGPU_E2E_IMAGE and, rebuilt with a
bumped version, KUBEGPU_E2E_IMAGE_UPGRADE), kube-scheduler's image from the suite's binary, both
imported into the cluster's containerd, and the chart deploy/helm/kubegpu installed with the
real helm and `--wait`. Every role then runs as the chart's pods, with the chart's mounts,
users, probes, RBAC and in-cluster API access; nothing contacts a registry (the images are
present, so the chart's IfNotPresent pull policy never pulls)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kubegpu_e2e import images
from kubegpu_e2e.cluster import NODE_NAME, Cluster
from kubegpu_e2e.processes import built
from kubegpu_e2e.versions import suite_version

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "kubegpu"
COMPONENTS = REPO / "e2e" / "components"
RELEASE = "kubegpu"
NAMESPACE = "kubegpu"  # the chart's namespace.name default
IMAGE_REPOSITORY = "kubegpu.local/kubegpu"
FAKE_GPUS = "8xA100-80GB-NVLink"
# What makes the fake node a GPU node to the chart's node affinity (set by hand or by NVIDIA's
# GPU operator on a real one).
GPU_NODE_LABEL = "nvidia.com/gpu.present=true"


# What installing the chart for real forced, in the product and the suite (docs/install.md,
# docs/e2e.md); report.json lists it beside the figures of the run.
FIXES_FORCED = (
    "every kubegpu pod sets enableServiceLinks: false (chart and overlays): the kubelet's "
    "KUBEGPU_EXTENDER_METRICS_PORT=tcp://IP:9402 for the Service kubegpu-extender-metrics was "
    "read as the extender's --metrics-port and the extender crash-looped",
    "the roles log the Kubernetes client's HTTP requests only at debug: the installed node "
    "agent logged one INFO line every 10 s",
    "chart values testing.fakeGpus and testing.fakeDevRoot (test clusters only): the fake "
    "backend and stand-in device nodes for the node agent, labeller and DRA driver",
    "the suite: pods in their own network namespaces (CNI ptp) reaching the API server at "
    "the kubernetes Service's address, the kubelet at its default root /var/lib/kubelet where "
    "the chart's host paths point, and every release pod waited Ready after helm's --wait, "
    "which passes a one-node DaemonSet with maxUnavailable 1 before its pod is Ready",
)


def image_archive(upgrade: bool = False) -> Path:
    """The kubegpu image's OCI archive (built, or taken from the cache, when e2e/run has not
    exported it). The upgrade image is a rebuild with a bumped package version."""
    script = COMPONENTS / "image" / "build.sh"
    if upgrade:
        return built("KUBEGPU_E2E_IMAGE_UPGRADE", script, "--bump-version", UPGRADE_VERSION)
    return built("KUBEGPU_E2E_IMAGE", script)


# The version the upgrade image is built with (a real rebuild from the Dockerfile).
UPGRADE_VERSION = "0.1.1"


def image_info(archive: Path) -> dict[str, Any]:
    """The build record e2e/components/image/build.sh writes beside the archive."""
    record = archive.with_name(archive.name + ".json")
    return json.loads(record.read_text()) if record.exists() else {}


def archive_tag(archive: Path) -> str:
    """The tag of the image an archive holds (its build record names the reference)."""
    reference = str(image_info(archive).get("image", ""))
    if ":" not in reference:
        raise RuntimeError(f"{archive}: its build record names no image reference")
    return reference.rsplit(":", 1)[1]


def kubernetes_version() -> str:
    """The suite's Kubernetes version: e2e/components/go.mod's (v1.35.4, CI's) or the one
    KUBEGPU_E2E_K8S_VERSION names (kubegpu_e2e/versions.py)."""
    return suite_version()


def helm_binary() -> str:
    return str(built("KUBEGPU_E2E_HELM", COMPONENTS / "helm" / "build.sh"))


def parse_time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


@dataclass
class Release:
    cluster: Cluster
    helm: str
    home: Path
    kubernetes_version: str
    # More chart values (--set), e.g. draDriver.enabled=true for the DRA cluster.
    extra_values: dict[str, str] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    # -------------------------------------------------------------- helm
    def run_helm(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cluster.admin),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        done = subprocess.run(
            [self.helm, *args], capture_output=True, text=True, env=env, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"helm {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}\n"
                f"{self.describe_unready()}"
            )
        return done

    def values(self, tag: str) -> list[str]:
        settings = {
            "image.repository": IMAGE_REPOSITORY,
            "image.tag": tag,
            "scheduler.kubeSchedulerImage.tag": self.kubernetes_version,
            "testing.fakeGpus": FAKE_GPUS,
            **self.extra_values,
        }
        return [arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")]

    def _timed(self, verb: str, *args: str) -> float:
        """Run one helm verb with --wait, then wait for every pod of the release to be Ready;
        returns the seconds both took. helm's own --wait is not enough: it counts a DaemonSet
        with maxUnavailable 1 on one node as ready with no pod Ready (helm's ready checker
        expects desired - maxUnavailable ready pods), and returned in 2.5 s here."""
        started = time.monotonic()
        self.run_helm(verb, *args)
        helm_seconds = round(time.monotonic() - started, 1)
        if verb != "uninstall":
            self.wait_ready()
        seconds = round(time.monotonic() - started, 1)
        self.history.append(
            {"helm": verb, "args": list(args), "helm_s": helm_seconds, "all_ready_s": seconds}
        )
        return seconds

    def wait_ready(self, timeout: float = 300) -> None:
        """Until every workload of the release is rolled out (`kubectl rollout status`, which
        waits for the DaemonSet's updated pods to be Ready) and every live pod is Ready."""
        for kind in ("daemonset", "deployment"):
            found = self.cluster.get(kind, "-n", NAMESPACE)
            for item in found["items"]:
                name = f"{kind}/{item['metadata']['name']}"
                done = self.cluster.kubectl(
                    "rollout",
                    "status",
                    name,
                    "-n",
                    NAMESPACE,
                    f"--timeout={int(timeout)}s",
                    check=False,
                    timeout=timeout + 30,
                )
                if done.returncode != 0:
                    raise RuntimeError(
                        f"{name} did not roll out: {done.stderr.strip()}\n{self.describe_unready()}"
                    )

        def all_ready() -> bool:
            pods = self.cluster.get("pods", "-n", NAMESPACE)["items"]
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            return bool(live) and all(is_ready(p) for p in live) and len(live) == len(pods)

        self.cluster.wait_for("every pod of the release Ready, none terminating", all_ready, 120)

    def install(self, tag: str) -> float:
        """`helm install --wait`: returns the seconds until every pod of the release is Ready."""
        return self._timed(
            "install", RELEASE, str(CHART), *self.values(tag), "--wait", "--timeout=5m"
        )

    def upgrade(self, tag: str) -> float:
        return self._timed(
            "upgrade", RELEASE, str(CHART), *self.values(tag), "--wait", "--timeout=5m"
        )

    def rollback(self, revision: int) -> float:
        return self._timed("rollback", RELEASE, str(revision), "--wait", "--timeout=5m")

    def uninstall(self) -> float:
        return self._timed("uninstall", RELEASE, "--wait", "--timeout=5m")

    # -------------------------------------------------------------- the release's pods
    def pods(self, name: str) -> list[dict[str, Any]]:
        """The live pods of one workload (app.kubernetes.io/name), oldest first."""
        found = self.cluster.get("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name={name}")
        live = [p for p in found["items"] if not p["metadata"].get("deletionTimestamp")]
        return sorted(live, key=lambda p: p["metadata"]["creationTimestamp"])

    def ready_pod(self, name: str, timeout: float = 180) -> dict[str, Any]:
        """The one Ready pod of a workload, waiting for it."""

        def ready() -> dict[str, Any] | None:
            pods = [p for p in self.pods(name) if is_ready(p)]
            return pods[0] if len(pods) == 1 and len(self.pods(name)) == 1 else None

        pod: dict[str, Any] = self.cluster.wait_for(f"one Ready {name} pod", ready, timeout)
        return pod

    def ready_times(self) -> dict[str, float]:
        """Each pod of the release: seconds from its creation to its Ready condition."""
        found = self.cluster.get("pods", "-n", NAMESPACE)
        times = {}
        for pod in found["items"]:
            created = parse_time(pod["metadata"]["creationTimestamp"])
            for condition in pod["status"].get("conditions", []):
                if condition["type"] == "Ready" and condition["status"] == "True":
                    ready = parse_time(condition["lastTransitionTime"])
                    times[pod["metadata"]["name"]] = (ready - created).total_seconds()
        return times

    def describe_unready(self) -> str:
        """What a failed wait leaves to read: every pod of the namespace that is not Ready,
        with its events (the reason a user would look for)."""
        try:
            found = self.cluster.get("pods", "-n", NAMESPACE)
        except Exception as error:  # the namespace may be gone already
            return f"(pods unreadable: {error})"
        lines = []
        for pod in found["items"]:
            if is_ready(pod):
                continue
            name = pod["metadata"]["name"]
            described = self.cluster.kubectl(
                "describe", "pod", "-n", NAMESPACE, name, check=False
            ).stdout
            lines.append(f"--- pod {name} not Ready:\n{described[-3000:]}")
        return "\n".join(lines)


def is_ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def prepare(
    cluster: Cluster,
    kubernetes_version: str,
    *,
    node_label: str = GPU_NODE_LABEL,
    upgrade: bool = True,
) -> dict[str, Any]:
    """Import the images (kubegpu's build, its upgrade rebuild unless `upgrade` is false, and
    kube-scheduler's) and label the node (a GPU node for the node agent, by default). Returns
    what the report records of the images."""
    build = cluster.run_dir / "release-images"
    build.mkdir(exist_ok=True)
    scheduler = images.build_kube_scheduler(
        build, cluster.bin_dir / "kube-scheduler", kubernetes_version
    )
    imported: dict[str, Any] = {}
    archives = [image_archive(), *([image_archive(upgrade=True)] if upgrade else []), scheduler]
    for archive in archives:
        started = time.monotonic()
        cluster.import_image(archive)
        imported[archive.name] = {
            **image_info(archive),
            "archive_bytes": archive.stat().st_size,
            "import_s": round(time.monotonic() - started, 1),
        }
    cluster.kubectl("label", "node", NODE_NAME, node_label, "--overwrite")
    return imported
