"""Faults during the replay: two scheduler replicas, each a kube-scheduler with its own kubegpu
extender (as the second-scheduler Deployment runs them, one pod each), electing a leader on one
Lease; the leader pair is killed mid-replay, and later the API server is restarted.

Each kube-scheduler runs in a UTS namespace of its own with the replica's name as host name:
kube-scheduler writes ``<hostname>_<uuid>`` as the Lease's holder, and the extender beside it
binds only while the holder starts with its ``--leader-identity`` (``kubegpu.extender.leader``).
On one machine both would otherwise carry the machine's name, and both extenders would bind.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

from kubegpu_e2e.cluster import Cluster, component_healthz, free_port, http_ok
from kubegpu_e2e.kubegpu import DEPLOY, KubegpuRoles, _kubegpu
from kubegpu_e2e.processes import HostProcess

LEASE = "kube-system/kubegpu-scheduler"


class Replica:
    def __init__(self, name: str, roles: KubegpuRoles, policy: str, workload: Path) -> None:
        self.name = name
        self.roles = roles
        self.cluster: Cluster = roles.cluster
        self.policy = policy
        self.workload = workload
        self.port = free_port()
        self.metrics_port = free_port()
        self.scheduler_port = free_port()
        self.extender: HostProcess | None = None
        self.scheduler: HostProcess | None = None
        self.killed = False

    def start(self) -> None:
        config = DEPLOY / "overlays" / "second-scheduler" / "extender-config.yaml"
        self.extender = self.roles.start_role(
            f"kubegpu-extender-{self.name}",
            [
                _kubegpu(),
                "extender",
                f"--config={config}",
                f"--kubeconfig={self.roles.kubeconfigs['kubegpu-extender']}",
                f"--port={self.port}",
                "--metrics-host=127.0.0.1",
                f"--metrics-port={self.metrics_port}",
                f"--policy={self.policy}",
                f"--workload-file={self.workload}",
                f"--leader-lease={LEASE}",
                f"--leader-identity={self.name}",
            ],
        )
        self.extender.wait_until(
            lambda: http_ok(f"http://127.0.0.1:{self.metrics_port}/healthz"), 60, "extender"
        )
        argv = self.roles.scheduler_argv(
            f"kubegpu-scheduler-{self.name}", self.scheduler_port, f"http://127.0.0.1:{self.port}"
        )
        # Its own host name, in a UTS namespace of its own (see the module's docstring).
        wrapped = ["unshare", "--uts", "sh", "-c", f'hostname {self.name} && exec "$@"', "sh"]
        self.scheduler = self.roles.start_role(f"kubegpu-scheduler-{self.name}", wrapped + argv)
        self.scheduler.wait_until(
            lambda: component_healthz(self.scheduler_port), 120, "kube-scheduler"
        )

    def kill(self) -> None:
        """SIGKILL both processes, as a node that dies takes the pod with it; the pod is not
        replaced here (its node is gone), so the other replica must take over."""
        self.killed = True
        for process in (self.scheduler, self.extender):
            if process is not None and process.popen is not None:
                process.popen.send_signal(signal.SIGKILL)
                process.popen.wait(timeout=30)

    def restart_exited(self) -> list[str]:
        """Start again a process of this replica that exited by itself, as the kubelet
        restarts a container: kube-scheduler exits when it cannot renew its Lease (the API
        server away longer than its renew deadline), by design."""
        if self.killed:
            return []
        restarted = []
        for name, process in (("scheduler", self.scheduler), ("extender", self.extender)):
            if (
                process is not None
                and process.popen is not None
                and process.popen.poll() is not None
            ):
                process.start()
                restarted.append(f"{self.name} {name}")
        return restarted

    def stop(self) -> None:
        for process in (self.scheduler, self.extender):
            if process is not None:
                process.stop(grace=10)


class Supervisor:
    """Restarts the replicas' processes that exit by themselves, every second, in a thread
    (the kubelet's part for the replicas' pods); ``restarts`` lists what it restarted, when."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas
        self.restarts: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-supervisor", daemon=True)

    def __enter__(self) -> Supervisor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for replica in self.replicas:
                for what in replica.restart_exited():
                    self.restarts.append((time.monotonic(), what))


def lease_holder(cluster: Cluster) -> str:
    namespace, name = LEASE.split("/")
    spec = cluster.get("lease", "-n", namespace, name).get("spec") or {}
    return str(spec.get("holderIdentity") or "")


def restart_apiserver(cluster: Cluster) -> float:
    """Stop the API server and start it again on the same port and data; seconds until it is
    ready again."""
    started = time.monotonic()
    cluster.processes.pop("kube-apiserver").stop(grace=10)
    cluster.start_apiserver()
    return time.monotonic() - started


def summary(events: dict[str, Any]) -> dict[str, Any]:
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in events.items()}
