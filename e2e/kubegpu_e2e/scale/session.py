"""One control plane of KWOK nodes for the scale replay, and one policy's run on it.

The control plane is the suite's own (etcd, kube-apiserver, kube-controller-manager) with no
kubelet; node lifecycle is off in the controller-manager because KWOK's nodes here send no
heartbeats (1,213 nodes' leases would cost the 2-core machine more than the scheduling under
test). Each policy's run gets the extender with that policy and the workload the simulator
uses, and the second kube-scheduler with the shipped configuration; between runs every pod is
deleted, so each policy starts on empty nodes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightkube
import numpy as np
import yaml

from kubegpu.kube.client import load_kubeconfig_file
from kubegpu.placement.model import PodRequest
from kubegpu_e2e.cluster import Cluster
from kubegpu_e2e.kubegpu import KubegpuRoles
from kubegpu_e2e.processes import HostProcess
from kubegpu_e2e.scale import faults, fleet, replay, trace
from kubegpu_e2e.scale.trace import ReplayTrace

NODE_LIFECYCLE_OFF = "--controllers=*,-node-lifecycle-controller"
# kube-controller-manager's flags on the scale clusters: no node lifecycle controller (KWOK
# nodes have no kubelet to renew leases for), and a client rate for thousands of objects. At
# its default 20 requests/s (burst 30) its resourceclaim controller made claims for a DRA
# replay at about 10 pods/s and deleted 8,316 of them afterwards at about 11/s; large clusters
# raise it the same way.
SCALE_CONTROLLER_MANAGER_FLAGS = (
    NODE_LIFECYCLE_OFF,
    "--kube-api-qps=200",
    "--kube-api-burst=400",
)


def process_usage(process: HostProcess) -> dict[str, float]:
    """CPU seconds (user + system) and peak resident memory of a running process."""
    assert process.popen is not None
    pid = process.popen.pid
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    peak_kib = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak_kib = int(line.split()[1])
    return {"cpu_s": ticks / 100.0, "peak_rss_mib": round(peak_kib / 1024, 1)}


@dataclass
class PolicyRun:
    policy: str
    outcome: replay.ReplayOutcome
    simulated_milli: np.ndarray
    capacity_milli: int
    usage: dict[str, dict[str, float]] = field(default_factory=dict)
    overcommit: list[str] = field(default_factory=list)
    extender_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def real_ratio(self) -> float:
        return 100.0 * self.outcome.bound_milli() / self.capacity_milli

    @property
    def simulated_ratio(self) -> float:
        return 100.0 * float(self.simulated_milli[-1]) / self.capacity_milli

    def first_difference(self) -> int | None:
        """Index of the first pod after which real and simulated allocation differ."""
        real = np.array(self.outcome.curve(), dtype=np.int64)
        differs = np.flatnonzero(real != self.simulated_milli)
        return int(differs[0]) if differs.size else None

    def summary(self) -> dict[str, Any]:
        latencies = self.outcome.latencies_s()
        return {
            "policy": self.policy,
            "pods": len(self.outcome.pods),
            "bound": sum(1 for p in self.outcome.pods if p.result == replay.BOUND),
            "refused": sum(1 for p in self.outcome.pods if p.result == replay.REFUSED),
            "real_allocation_pct": round(self.real_ratio, 3),
            "simulated_allocation_pct": round(self.simulated_ratio, 3),
            "difference_pp": round(self.real_ratio - self.simulated_ratio, 3),
            "first_pod_that_differs": self.first_difference(),
            "late_binds": len(self.outcome.late_binds),
            "unschedulable_updates": self.outcome.refusals_seen,
            "wall_s": round(self.outcome.wall_s, 1),
            "pods_per_s": round(len(self.outcome.pods) / self.outcome.wall_s, 1),
            "bind_latency_p50_ms": round(1000 * latencies[len(latencies) // 2], 1)
            if latencies
            else None,
            "overcommitted": self.overcommit,
            "usage": self.usage,
            "extender": self.extender_metrics,
        }


def scrape(url: str, prefixes: tuple[str, ...]) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefixes):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


class ScaleCluster:
    def __init__(self, bin_dir: Path, out_dir: Path, kwok_binary: Path) -> None:
        self.cluster = Cluster(
            bin_dir=bin_dir,
            out_dir=out_dir,
            controller_manager_flags=list(SCALE_CONTROLLER_MANAGER_FLAGS),
        )
        self.kwok = fleet.Kwok(self.cluster, kwok_binary)
        self.roles: KubegpuRoles | None = None
        self.out_dir = out_dir

    def start(self) -> None:
        self.cluster.start_control_plane()
        self.roles = KubegpuRoles(self.cluster)
        self.roles.apply_rbac()
        self.kwok.start()

    def client(self) -> lightkube.AsyncClient:
        config = load_kubeconfig_file(self.cluster.admin)
        return lightkube.AsyncClient(config, field_manager="kubegpu-e2e-replay")

    async def add_nodes(self, t: ReplayTrace) -> float:
        started = time.monotonic()
        client = self.client()
        try:
            await fleet.create_nodes(client, t.nodes)
        finally:
            await client.close()
        ready = self.cluster.wait_for(
            "every KWOK node Ready",
            lambda: _ready_nodes(self.cluster) >= len(t.nodes),
            timeout=300,
            interval=2,
        )
        assert ready
        return time.monotonic() - started

    def start_scheduling(self, policy: str, t: ReplayTrace, *extra: str) -> None:
        assert self.roles is not None
        workload = self.cluster.run_dir / f"workload-{policy}.yaml"
        workload.write_text(yaml.safe_dump(trace.workload_file(t, policy)))
        self.roles.start_extender(f"--policy={policy}", f"--workload-file={workload}", *extra)
        self.roles.start_scheduler()

    def stop_scheduling(self) -> None:
        assert self.roles is not None
        for name in ("kubegpu-scheduler", "kubegpu-extender"):
            if name in self.roles.processes:
                self.roles.stop_role(name)

    async def run_policy(
        self, t: ReplayTrace, policy: str, seed: int, progress: Any = None
    ) -> PolicyRun:
        """``t``'s pods in order through the real scheduler with ``policy``; then the pods are
        deleted and the scheduler and extender stopped."""
        assert self.roles is not None
        namespace = f"replay-{policy}"
        self.start_scheduling(policy, t)
        roles = self.roles
        before = {
            n: process_usage(roles.processes[n]) for n in ("kubegpu-scheduler", "kubegpu-extender")
        }
        client = self.client()
        try:
            outcome = await replay.replay_in_order(
                client, t.pods, namespace, policy, progress=progress
            )
            after = {
                n: process_usage(roles.processes[n])
                for n in ("kubegpu-scheduler", "kubegpu-extender")
            }
            pods = await replay.bound_pods(client, namespace, policy)
            metrics = scrape(
                f"http://127.0.0.1:{roles.extender_metrics_port}/metrics",
                ("kubegpu_extender_decisions_total", "kubegpu_extender_binds_total"),
            )
            run = PolicyRun(
                policy,
                outcome,
                trace.simulated(t, policy, seed),
                t.capacity_milli,
                usage={
                    n: {
                        "cpu_s": round(after[n]["cpu_s"] - before[n]["cpu_s"], 1),
                        "peak_rss_mib": after[n]["peak_rss_mib"],
                    }
                    for n in after
                },
                overcommit=replay.card_overcommit(pods),
                extender_metrics=metrics,
            )
            self.stop_scheduling()
            await replay.delete_run(client, namespace)
        finally:
            await client.close()
        (self.out_dir / f"replay-{policy}.json").write_text(
            json.dumps(
                {
                    **run.summary(),
                    "curve_real_milli": outcome.curve(),
                    "curve_simulated_milli": run.simulated_milli.tolist(),
                    "arrived_milli": t.arrived_milli().tolist(),
                    "nodes_real": [p.node for p in outcome.pods],
                    "nodes_simulated": trace.simulated_nodes(t, policy, seed),
                }
            )
        )
        return run

    async def run_burst(
        self,
        t: ReplayTrace,
        pods: Sequence[PodRequest],
        *,
        with_extender: bool,
        policy: str = "kubegpu",
        parallel: int = 8,
    ) -> dict[str, Any]:
        """``pods`` created as fast as ``parallel`` creators can, scheduled by the kubegpu
        scheduler with the extender, or by a plain kube-scheduler alone; pods per second from
        the first creation to the last pod settled, CPU and memory of the scheduling
        processes. The pods are deleted afterwards."""
        assert self.roles is not None
        kind = "extender" if with_extender else "alone"
        if with_extender:
            self.start_scheduling(policy, t)
            processes = {
                n: self.roles.processes[n] for n in ("kubegpu-scheduler", "kubegpu-extender")
            }
            scheduler_name = trace.SCHEDULER_NAME
        else:
            self.cluster.start_default_scheduler()
            processes = {"kube-scheduler": self.cluster.processes["kube-scheduler"]}
            scheduler_name = "default-scheduler"
        before = {n: process_usage(p) for n, p in processes.items()}
        client = self.client()
        namespace = f"burst-{kind}"
        try:
            outcome = await replay.replay_burst(
                client, pods, namespace, kind, parallel=parallel, scheduler_name=scheduler_name
            )
            after = {n: process_usage(p) for n, p in processes.items()}
            bound = await replay.bound_pods(client, namespace, kind)
            metrics: dict[str, float] = {}
            if with_extender:
                metrics = scrape(
                    f"http://127.0.0.1:{self.roles.extender_metrics_port}/metrics",
                    (
                        "kubegpu_extender_binds_total",
                        "kubegpu_extender_stale_binds_total",
                        "kubegpu_extender_tentative_reservations_total",
                    ),
                )
                self.stop_scheduling()
            else:
                self.cluster.processes.pop("kube-scheduler").stop(grace=10)
            await replay.delete_run(client, namespace)
        finally:
            await client.close()
        latencies = outcome.latencies_s()
        settled = sum(1 for p in outcome.pods if p.result)
        return {
            "scheduling": kind,
            "pods": len(pods),
            "bound": sum(1 for p in outcome.pods if p.result == replay.BOUND),
            "allocation_pct": round(100.0 * outcome.bound_milli() / t.capacity_milli, 3),
            "wall_s": round(outcome.wall_s, 1),
            "pods_per_s": round(settled / outcome.wall_s, 1),
            "bind_latency_p50_ms": round(1000 * latencies[len(latencies) // 2], 1)
            if latencies
            else None,
            "bind_latency_p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)], 1)
            if latencies
            else None,
            "late_binds": len(outcome.late_binds),
            "overcommitted": replay.card_overcommit(bound) if with_extender else [],
            "usage": {
                n: {
                    "cpu_s": round(after[n]["cpu_s"] - before[n]["cpu_s"], 1),
                    "peak_rss_mib": after[n]["peak_rss_mib"],
                }
                for n in after
            },
            "extender": metrics,
        }

    async def run_with_faults(self, t: ReplayTrace, policy: str, seed: int) -> dict[str, Any]:
        """``t`` in order with two scheduler replicas (``faults``): the leader pair killed
        after half the pods, the API server restarted after three quarters. Returns the run's
        summary, which replica led before and after, and the seconds each fault cost: from
        the fault to the next pod settled."""
        assert self.roles is not None
        workload = self.cluster.run_dir / f"workload-{policy}.yaml"
        workload.write_text(yaml.safe_dump(trace.workload_file(t, policy)))
        replicas = {
            name: faults.Replica(name, self.roles, policy, workload)
            for name in ("replica-a", "replica-b")
        }
        for replica in replicas.values():
            replica.start()
        events: dict[str, Any] = {}
        self.cluster.wait_for(
            "a replica holding the Lease",
            lambda: faults.lease_holder(self.cluster).split("_")[0] in replicas,
            timeout=60,
        )
        kill_at, restart_at = len(t.pods) // 2, 3 * len(t.pods) // 4
        pending: dict[str, float] = {}

        async def between(done: int, total: int, watch: replay.PodWatch) -> None:
            for fault, started in list(pending.items()):
                events[f"{fault}_recovered_s"] = time.monotonic() - started
                del pending[fault]
            if done == kill_at:
                leader = faults.lease_holder(self.cluster).split("_")[0]
                events["leader_killed"] = leader
                pending["leader_kill"] = time.monotonic()
                replicas[leader].kill()
            elif done == restart_at:
                events["new_leader"] = faults.lease_holder(self.cluster).split("_")[0]
                pending["apiserver_restart"] = time.monotonic()
                events["apiserver_down_s"] = await asyncio.to_thread(
                    faults.restart_apiserver, self.cluster
                )

        namespace = f"faults-{policy}"
        client = self.client()
        supervisor = faults.Supervisor(list(replicas.values()))
        try:
            with supervisor:
                outcome = await replay.replay_in_order(
                    client, t.pods, namespace, f"faults-{policy}", progress=between
                )
            events["restarted"] = [what for _, what in supervisor.restarts]
            pods = await replay.bound_pods(client, namespace, f"faults-{policy}")
            for replica in replicas.values():
                replica.stop()
            await replay.delete_run(client, namespace)
        finally:
            await client.close()
        run = PolicyRun(policy, outcome, trace.simulated(t, policy, seed), t.capacity_milli)
        run.overcommit = replay.card_overcommit(pods)
        return {
            **run.summary(),
            "faults": faults.summary(events),
            "decisions_on_another_node": replay.decided_elsewhere(pods),
        }

    def stop(self) -> list[str]:
        if self.roles is not None:
            self.roles.stop()
        self.kwok.stop()
        return self.cluster.stop()


def _ready_nodes(cluster: Cluster) -> int:
    nodes = cluster.get("nodes", "-l", f"{fleet.FLEET_LABEL}=true")["items"]
    return sum(
        1
        for n in nodes
        for c in (n.get("status") or {}).get("conditions") or []
        if c.get("type") == "Ready" and c.get("status") == "True"
    )
