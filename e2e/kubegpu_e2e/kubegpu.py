"""The kubegpu roles beside the real cluster, as host processes: node agent (fake backend,
8xA100-80GB-NVLink, shared mode on), extender, the second kube-scheduler that calls it, and the
labeller. Each runs with the credentials of its own service account from deploy/, whose RBAC is
applied with the real kubectl, so least privilege is exercised for real."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from kubegpu_e2e.cluster import (
    NODE_NAME,
    Cluster,
    component_healthz,
    free_port,
    http_ok,
    write_kubeconfig,
)
from kubegpu_e2e.processes import HostProcess

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
FAKE_GPUS = "8xA100-80GB-NVLink"
NAMESPACE = "kubegpu"
# The kubelet's nodeStatusUpdateFrequency (its default; the suite does not set it).
NODE_STATUS_PERIOD_S = 10
# Objects of the overlay that grant or hold identity. The workloads (DaemonSet, Deployment)
# are not applied: their image is not in this cluster, and pulling it would leave loopback.
_IDENTITY_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Secret",
    "ResourceQuota",
}


def _kubegpu() -> str:
    return str(Path(sys.executable).with_name("kubegpu"))


class KubegpuRoles:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.processes: dict[str, HostProcess] = {}
        self.kubeconfigs: dict[str, Path] = {}
        self.agent_health_port = free_port()
        self.exporter_port = free_port()
        self.extender_metrics_port = free_port()
        self.scheduler_port = free_port()
        self.fake_control = cluster.run_dir / "fake-gpu.sock"

    # -------------------------------------------------------------- identities from deploy/
    def apply_rbac(self) -> None:
        rendered = self.cluster.kubectl(
            "kustomize", str(DEPLOY / "overlays" / "second-scheduler")
        ).stdout
        documents = [d for d in yaml.safe_load_all(rendered) if d]
        identity = [d for d in documents if d["kind"] in _IDENTITY_KINDS]
        self.cluster.kubectl(
            "apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(identity)
        )
        for account in ("kubegpu-node-agent", "kubegpu-extender", "kubegpu-scheduler"):
            token = self.cluster.kubectl(
                "create", "token", account, "-n", NAMESPACE, "--duration=12h"
            ).stdout.strip()
            self.kubeconfigs[account] = write_kubeconfig(
                self.cluster.run_dir / f"{account}.kubeconfig",
                self.cluster.server,
                self.cluster.ca.cert,
                user=account,
                token=token,
            )

    # -------------------------------------------------------------- processes
    def _start(self, name: str, argv: list[str], kubeconfig: Path | None = None) -> HostProcess:
        env = dict(self.cluster.env)
        env.pop("KUBECONFIG", None)
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        process = HostProcess(name, argv, self.cluster.logs / f"{name}.log", env=env).start()
        self.processes[name] = process
        return process

    def start_agent(
        self,
        config: Path | None = None,
        *,
        fake_gpus: str = FAKE_GPUS,
        fake_control: Path | None = None,
    ) -> HostProcess:
        """The node agent with ``config`` (default: deploy/base/node-agent-config.yaml) on the
        fake node ``fake_gpus`` (a preset or a spec file)."""
        process = self._start(
            "kubegpu-node-agent", self.agent_argv(config, fake_gpus, fake_control)
        )
        process.wait_until(
            lambda: http_ok(f"http://127.0.0.1:{self.agent_health_port}/readyz"),
            60,
            "node agent /readyz (registered with the kubelet)",
        )
        return process

    def agent_argv(
        self,
        config: Path | None = None,
        fake_gpus: str = FAKE_GPUS,
        fake_control: Path | None = None,
    ) -> list[str]:
        """The node agent's command line as :meth:`start_agent` runs it."""
        c = self.cluster
        config = config or DEPLOY / "base" / "node-agent-config.yaml"
        return [
            _kubegpu(),
            "device-plugin",
            "--backend=fake",
            f"--fake-gpus={fake_gpus}",
            f"--fake-control={fake_control or self.fake_control}",
            f"--config={config}",
            f"--kubelet-dir={c.device_plugin_dir}",
            f"--node-name={NODE_NAME}",
            f"--kubeconfig={self.kubeconfigs['kubegpu-node-agent']}",
            f"--pod-resources-socket={c.pod_resources_socket}",
            f"--cdi-dir={c.cdi_dir}",
            f"--health-listen=127.0.0.1:{self.agent_health_port}",
            # The exporter inside the agent, as the DaemonSet runs it (on loopback here).
            "--exporter",
            f"--exporter-listen=127.0.0.1:{self.exporter_port}",
            "--exporter-pod-directory=api",
            f"--exporter-pod-resources-socket={c.pod_resources_socket}",
        ]

    def wait_advertised(
        self,
        capacity: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
    ) -> None:
        """Until the Node shows the agent's resources: by default (the shipped config) 8 GPUs
        in capacity (cards holding shares leave allocatable) and all 256 share slots
        allocatable; another config's figures as ``capacity`` and ``allocatable``. A shared pod
        that kube-scheduler turns away before then waits five minutes (docs/e2e.md, item 4),
        so scenarios start after."""
        if capacity is None and allocatable is None:
            capacity, allocatable = {"nvidia.com/gpu": "8"}, {"kubegpu.io/gpu-shared": str(8 * 32)}
        figures = {"capacity": capacity or {}, "allocatable": allocatable or {}}

        def advertised() -> bool:
            status = self.cluster.get("node", NODE_NAME)["status"]
            return all(
                status[part].get(name) == value
                for part, wanted in figures.items()
                for name, value in wanted.items()
            )

        # The kubelet posts allocatable on its next status sync (every 10 s), so right after a
        # restart the Node may still show the figures from before it, and drop to no slots a
        # few seconds later, when the scheduler would refuse with "Insufficient". Advertised
        # means: seen, and still seen a whole sync period later.
        deadline = time.monotonic() + 90
        while True:
            self.cluster.wait_for(f"the Node to advertise {figures}", advertised, 60)
            held_until = time.monotonic() + NODE_STATUS_PERIOD_S + 2
            while time.monotonic() < held_until and advertised():
                time.sleep(0.5)
            if time.monotonic() >= held_until:
                return
            if time.monotonic() > deadline:
                raise AssertionError("the Node's GPUs and slots keep coming and going")

    def stop_agent(self) -> None:
        self.processes["kubegpu-node-agent"].stop(grace=15)

    def start_extender(self, *extra_args: str) -> HostProcess:
        """The extender with the second-scheduler overlay's settings, plus ``extra_args``."""
        config = DEPLOY / "overlays" / "second-scheduler" / "extender-config.yaml"
        settings = yaml.safe_load(config.read_text())["settings"]
        process = self._start(
            "kubegpu-extender",
            [
                _kubegpu(),
                "extender",
                f"--config={config}",
                f"--kubeconfig={self.kubeconfigs['kubegpu-extender']}",
                # The overlay listens on the pod IP for Prometheus; here only loopback is used.
                "--metrics-host=127.0.0.1",
                f"--metrics-port={self.extender_metrics_port}",
                *extra_args,
            ],
        )
        process.wait_until(
            lambda: http_ok(f"http://127.0.0.1:{self.extender_metrics_port}/healthz"),
            60,
            "extender /healthz",
        )
        self.extender_port = int(settings["port"])
        return process

    def stop_role(self, name: str) -> None:
        """Stop one role's process (e.g. to start it again with other settings)."""
        self.processes.pop(name).stop(grace=15)

    def start_role(self, name: str, argv: list[str], kubeconfig: Path | None = None) -> HostProcess:
        """Any other kubegpu role as a host process, logged like the others."""
        return self._start(name, argv, kubeconfig)

    def start_scheduler(
        self, *extra_args: str, edit: Callable[[dict[str, Any]], None] | None = None
    ) -> HostProcess:
        """A second kube-scheduler with the shipped KubeSchedulerConfiguration; only the API
        access the Deployment gets from its service account is added (clientConnection), and
        ``extra_args`` (feature gates, log verbosity); ``edit`` may change the configuration
        first (a scenario comparing with a setting off)."""
        argv = self.scheduler_argv("kubegpu-scheduler", self.scheduler_port, edit=edit)
        process = self._start("kubegpu-scheduler", [*argv, *extra_args])
        process.wait_until(
            lambda: component_healthz(self.scheduler_port),
            120,
            "kubegpu-scheduler /healthz",
        )
        self.cluster.wait_for(
            "the kubegpu-scheduler Lease held by this host",
            lambda: (
                self.cluster.get("lease", "-n", "kube-system", "kubegpu-scheduler")["spec"]
                .get("holderIdentity", "")
                .startswith(socket.gethostname() + "_")
            ),
            timeout=60,
        )
        return process

    def scheduler_argv(
        self,
        name: str,
        port: int,
        extender_url: str = "",
        edit: Callable[[dict[str, Any]], None] | None = None,
    ) -> list[str]:
        """kube-scheduler's command line with the shipped KubeSchedulerConfiguration, written
        as ``<name>.yaml`` in the run folder with the service account's API access added
        (clientConnection) and, with ``extender_url``, every extender entry pointed there."""
        shipped = DEPLOY / "overlays" / "second-scheduler" / "kube-scheduler-config.yaml"
        config = yaml.safe_load(shipped.read_text())
        kubeconfig = self.kubeconfigs["kubegpu-scheduler"]
        config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
        if extender_url:
            for extender in config["extenders"]:
                extender["urlPrefix"] = extender_url
        if edit is not None:
            edit(config)
        path = self.cluster.run_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        return [
            str(self.cluster.bin_dir / "kube-scheduler"),
            f"--config={path}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--v=2",
        ]

    def start_labeller(
        self, config: Path | None = None, *, fake_gpus: str = FAKE_GPUS
    ) -> HostProcess:
        """The labeller of the fake node ``fake_gpus`` with the node agent's ``config``."""
        return self._start(
            "kubegpu-labels",
            [
                _kubegpu(),
                "labels",
                "--backend=fake",
                f"--fake-gpus={fake_gpus}",
                "--sink=node",
                f"--node-name={NODE_NAME}",
                f"--config={config or DEPLOY / 'base' / 'node-agent-config.yaml'}",
                "--poll=2",
            ],
            # The labeller has no --kubeconfig: in a pod it uses the service account's token.
            kubeconfig=self.kubeconfigs["kubegpu-node-agent"],
        )

    def start(self) -> None:
        self.apply_rbac()
        self.start_agent()
        self.wait_advertised()
        self.start_extender()
        self.start_scheduler()
        self.start_labeller()

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            process.stop(grace=10)


def tool_path(cluster: Cluster) -> str:
    """PATH for kubectl plugin discovery: our kubectl, then the venv with kubectl-gpu."""
    return f"{cluster.bin_dir}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
