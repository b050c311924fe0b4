"""Kueue's manager (sigs.k8s.io/kueue, built from its Go module by e2e/components/kueue/build.sh)
beside the default cluster, as a host process: its own CRDs applied server-side, its webhooks
served on loopback with a certificate of the cluster's CA and registered by URL (there is no
kube-proxy here, so a Service could not reach them), and its Configuration the one
deploy/examples/kueue ships with only the host process's settings added.

Kueue's internal certificate management is off (it would make a Secret for a Service and wait
for a pod volume to mount it); the webhook certificate is written into the certDir named in the
Configuration. With it off, Kueue reads its metrics certificate from the fixed
/etc/kueue/metrics/certs (cmd/kueue/main.go); that folder is made for the run and recorded as a
created host path, so teardown and the janitor remove it."""

from __future__ import annotations

import base64
import copy
import shutil
from pathlib import Path
from typing import Any

import yaml

from kubegpu_e2e.cluster import CREATED_HOST_PATHS, Cluster, free_port, http_ok
from kubegpu_e2e.kubegpu import DEPLOY
from kubegpu_e2e.processes import HostProcess, StartError, built

E2E = Path(__file__).resolve().parents[1]
EXAMPLE = DEPLOY / "examples" / "kueue"
NAMESPACE = "kueue-system"
# Where Kueue reads its metrics certificate when internal certificate management is off.
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
# Only the webhooks of what this cluster runs: Kueue's own kinds and batch/v1 Jobs. Kueue's
# manifests also hook every Pod, Deployment and StatefulSet (served by no-op handlers while
# those integrations are off) with failurePolicy Fail: registered, they would make every pod of
# the cluster depend on this one process.
WEBHOOK_GROUPS = {"kueue.x-k8s.io", "batch"}
# The names Kueue's own install (config/default, name prefix kueue-) gives its registrations.
WEBHOOK_CONFIGS = {
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
}


def kueue_dir() -> Path:
    """The folder e2e/components/kueue/build.sh fills: bin/kueue, crd/, webhook/."""
    return built("KUBEGPU_E2E_KUEUE", E2E / "components" / "kueue" / "build.sh")


def example(name: str) -> dict[str, Any]:
    """One document of deploy/examples/kueue (fresh copy)."""
    (document,) = [d for d in yaml.safe_load_all((EXAMPLE / name).read_text()) if d]
    return dict(document)


def webhook_registrations(manifests: Path, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """Kueue's Mutating/ValidatingWebhookConfigurations, trimmed to WEBHOOK_GROUPS and pointed
    at ``https://127.0.0.1:<port><path>`` with ``ca_bundle``."""
    registrations = []
    for document in yaml.safe_load_all(manifests.read_text()):
        if not document:
            continue
        registration = copy.deepcopy(document)
        registration["metadata"] = {"name": WEBHOOK_CONFIGS[registration["kind"]]}
        hooks = []
        for hook in registration["webhooks"]:
            groups = {g for rule in hook["rules"] for g in rule["apiGroups"]}
            if not groups & WEBHOOK_GROUPS:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
            hooks.append(hook)
        registration["webhooks"] = hooks
        registrations.append(registration)
    return registrations


class Kueue:
    def __init__(self, cluster: Cluster, pods_ready_timeout: str, backoff_base_s: int) -> None:
        self.cluster = cluster
        self.dir = kueue_dir()
        self.folder = cluster.run_dir / "kueue"
        self.webhook_port = free_port()
        self.health_port = free_port()
        self.pods_ready_timeout = pods_ready_timeout
        self.backoff_base_s = backoff_base_s
        self.process: HostProcess | None = None
        self.registered = False

    # ------------------------------------------------------------------ setup
    def configuration(self, cert_dir: Path) -> dict[str, Any]:
        """The shipped kueue-config.yaml with what a host process needs added, and shorter
        waitForPodsReady times so that the scenarios run in seconds."""
        config = example("kueue-config.yaml")
        config.update(
            {
                "namespace": NAMESPACE,
                "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
                "metrics": {"bindAddress": "0"},  # off: nothing here scrapes it
                "webhook": {
                    "host": "127.0.0.1",
                    "port": self.webhook_port,
                    "certDir": str(cert_dir),
                },
                "leaderElection": {"leaderElect": False},  # one replica
                "internalCertManagement": {"enable": False},
                # The visibility API server wants an APIService and certificates of its own.
                "featureGates": {"VisibilityOnDemand": False},
            }
        )
        ready = config["waitForPodsReady"]
        ready["timeout"] = self.pods_ready_timeout
        ready["requeuingStrategy"]["backoffBaseSeconds"] = self.backoff_base_s
        return config

    def install_crds(self) -> None:
        """Kueue's CRDs from its module, server-side (the workloads CRD is 1.4 MB, far over the
        client-side apply annotation's limit), and its namespace."""
        crds = str(self.dir / "crd")
        self.cluster.kubectl("apply", "--server-side", "-f", crds, timeout=120)
        self.cluster.kubectl(
            "wait", "--for=condition=Established", "-f", crds, "--timeout=60s", timeout=90
        )
        self.cluster.kubectl("create", "namespace", NAMESPACE)

    def _metrics_certs(self) -> None:
        top = METRICS_CERTS.parents[1]  # /etc/kueue
        if top.exists():
            raise StartError(f"{top} exists on this machine; the suite will not overwrite it")
        record = self.cluster.run_dir / CREATED_HOST_PATHS
        lines = [line for line in record.read_text().splitlines() if line] + [str(top)]
        record.write_text("\n".join(lines))
        METRICS_CERTS.mkdir(parents=True)
        pair = self.cluster.ca.issue(
            "kueue-metrics", common_name="kueue-metrics", ips=("127.0.0.1",), server=True
        )
        shutil.copy(pair.cert, METRICS_CERTS / "tls.crt")
        shutil.copy(pair.key, METRICS_CERTS / "tls.key")

    def start(self) -> None:
        cert_dir = self.folder / "serving-certs"
        cert_dir.mkdir(parents=True)
        pair = self.cluster.ca.issue(
            "kueue-webhook", common_name="kueue-webhook", ips=("127.0.0.1",), server=True
        )
        shutil.copy(pair.cert, cert_dir / "tls.crt")
        shutil.copy(pair.key, cert_dir / "tls.key")
        self._metrics_certs()
        config_path = self.folder / "controller_manager_config.yaml"
        config_path.write_text(yaml.safe_dump(self.configuration(cert_dir)))
        env = dict(self.cluster.env)
        env.pop("KUBECONFIG", None)
        self.process = HostProcess(
            "kueue",
            [
                str(self.dir / "bin" / "kueue"),
                f"--config={config_path}",
                # Kueue's install binds it to its ClusterRole; the admin's is a superset.
                f"--kubeconfig={self.cluster.admin}",
                "--zap-log-level=2",
            ],
            self.cluster.logs / "kueue.log",
            env=env,
        ).start()
        # Ready once its webhook server listens (Kueue's own readiness check).
        self.process.wait_until(
            lambda: http_ok(f"http://127.0.0.1:{self.health_port}/readyz"), 120, "Kueue /readyz"
        )
        registrations = webhook_registrations(
            self.dir / "webhook" / "manifests.yaml",
            self.webhook_port,
            self.cluster.ca.cert.read_bytes(),
        )
        self.cluster.kubectl(
            "apply", "-f", "-", input=yaml.safe_dump_all(registrations), timeout=60
        )
        self.registered = True

    # ------------------------------------------------------------------ teardown
    def stop(self) -> None:
        """Registrations first (failurePolicy Fail: with the server gone every Job creation
        would fail), then the process, then Kueue's CRDs and namespace."""
        if self.registered:
            for kind, name in WEBHOOK_CONFIGS.items():
                self.cluster.kubectl(
                    "delete", kind.lower(), name, "--ignore-not-found", check=False
                )
            self.registered = False
        if self.process is not None:
            self.process.stop(grace=10)
            self.process = None
        self.cluster.kubectl(
            "delete",
            "-f",
            str(self.dir / "crd"),
            "--ignore-not-found",
            "--timeout=60s",
            check=False,
            timeout=90,
        )
        self.cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", check=False)
        shutil.rmtree(METRICS_CERTS.parents[1], ignore_errors=True)
