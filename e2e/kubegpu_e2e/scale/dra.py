"""The DRA column of the scale replay's side by side (issue 27, item 3): the same KWOK nodes,
the same pods in the same arrival order, with each pod's GPUs asked through a ResourceClaim made
from a template and allocated by kube-scheduler's own DRA allocator (consumable capacity).

Each node's ResourceSlices are kubegpu's (``dra_fleet``: the driver's slice builder, publisher
and, steered, its steerer, for the inventory ``fleet.py`` gives the node); the DeviceClasses
and the driver's RBAC are the component's (``deploy/components/dra-driver``). A pod asks:

* whole cards: ``count`` devices of ``gpu.kubegpu.io`` naming no capacity, so each consumes
  the request policy's default, the whole card;
* a share: one device of ``gpu-share.kubegpu.io`` with ``capacity.requests`` of its compute
  in milli-cards and ``trace.SHARE_MEMORY_MIB`` of memory (the policy rounds both up to its
  steps: 10 milli, 256 MiB), as the device-plugin replay asks;
* a pod limited to GPU models: a CEL selector on the device's ``productName``.

Variants (``VARIANTS``): DRA's first fit through the default kube-scheduler, with kubegpu's
steering, and with steering and the extender's ``/prioritize-dra`` ranking through the shipped
second-scheduler configuration; and ranking alone (first fit in index order on the node the
extender ranks best), which isolates what the order recovers against kubegpu's own card
choice under the same node choice.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import lightkube
import yaml
from lightkube.generic_resource import create_namespaced_resource

from kubegpu.core.dra import DEFAULT_DRIVER_NAME
from kubegpu.dra.slices import COMPUTE_STEP_MILLI
from kubegpu.placement.device_order import CardChoice
from kubegpu.placement.model import MILLI_PER_GPU, PodRequest
from kubegpu.placement.policies import POLICIES
from kubegpu.sharing.resources import parse_quantity
from kubegpu.simulate.replay import replay as simulate_replay
from kubegpu.simulate.replay import target_workload
from kubegpu_e2e.cluster import Cluster, write_kubeconfig
from kubegpu_e2e.dra import COMPONENT, FEATURE_GATES
from kubegpu_e2e.processes import HostProcess
from kubegpu_e2e.scale import fleet, replay, trace
from kubegpu_e2e.scale.session import SCALE_CONTROLLER_MANAGER_FLAGS, ScaleCluster, process_usage
from kubegpu_e2e.scale.trace import ReplayTrace

E2E = Path(__file__).resolve().parents[2]
DRIVER = DEFAULT_DRIVER_NAME
WHOLE_CLASS = "gpu.kubegpu.io"
SHARE_CLASS = "gpu-share.kubegpu.io"
DRIVER_ACCOUNT = "kubegpu-dra-driver"
DRIVER_NAMESPACE = "kubegpu"
DEFAULT_SCHEDULER = "default-scheduler"
STEERING_POLICY = "kubegpu"

ResourceClaimTemplate = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates"
)


@dataclass(frozen=True)
class Variant:
    name: str
    steer: str  # the slice fleet's --steer: off, poll, watch
    ranked: bool  # through kubegpu-scheduler with the extender's /prioritize-dra
    # The simulator's card choice this variant's card choice corresponds to, under kubegpu's
    # node choice (the ranked variants only: the simulator never places by kube-scheduler's
    # own scores).
    simulated: CardChoice | None = None


# simulated_card_choices' key of first fit under the ranking blind to the allocator's card.
BLIND_FIRST_FIT = "first-fit-blind"

VARIANTS = {
    "first-fit": Variant("first-fit", "off", ranked=False),
    "steered": Variant("steered", "watch", ranked=False),
    "steered-ranked": Variant("steered-ranked", "watch", ranked=True, simulated=CardChoice.STEERED),
    "ranked": Variant("ranked", "off", ranked=True, simulated=CardChoice.FIRST_FIT),
    # The driver's steering as it was before issue 27: each node's claims polled every
    # interval (5 s, the default dra.steering.intervalS), for the before/after figures.
    "steered-poll": Variant("steered-poll", "poll", ranked=False),
    "steered-ranked-poll": Variant(
        "steered-ranked-poll", "poll", ranked=True, simulated=CardChoice.STEERED
    ),
}


# ---------------------------------------------------------------- claims and pods
def template_name(pod: PodRequest) -> str | None:
    """The ResourceClaimTemplate a pod's GPU demand is made from (None: a CPU-only pod)."""
    if not pod.gpu_count:
        return None
    models = ""
    if pod.gpu_models:
        models = "-" + "-".join(sorted(m.lower().replace("_", "-") for m in pod.gpu_models))
    if pod.gpu_milli >= MILLI_PER_GPU:
        return f"whole-{pod.gpu_count}{models}"
    return f"share-{pod.gpu_milli}{models}"


def claim_spec(pod: PodRequest) -> dict[str, Any]:
    exactly: dict[str, Any]
    if pod.gpu_milli >= MILLI_PER_GPU:
        exactly = {"deviceClassName": WHOLE_CLASS, "count": pod.gpu_count}
    else:
        exactly = {
            "deviceClassName": SHARE_CLASS,
            "capacity": {
                "requests": {
                    "compute": str(pod.gpu_milli),
                    "memory": f"{trace.SHARE_MEMORY_MIB}Mi",
                }
            },
        }
    if pod.gpu_models:
        names = ", ".join(json.dumps(m) for m in sorted(pod.gpu_models))
        exactly["selectors"] = [
            {"cel": {"expression": f'device.attributes["{DRIVER}"].productName in [{names}]'}}
        ]
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def templates(pods: Sequence[PodRequest], namespace: str) -> list[dict[str, Any]]:
    """One template per distinct demand of ``pods``."""
    found: dict[str, dict[str, Any]] = {}
    for pod in pods:
        name = template_name(pod)
        if name is not None and name not in found:
            found[name] = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"spec": claim_spec(pod)},
            }
    return list(found.values())


def dra_pod_manifest(
    pod: PodRequest, namespace: str, run: str, scheduler_name: str
) -> dict[str, Any]:
    """The Pod a DRA user would apply for ``pod``: CPU and memory requests as the device-plugin
    replay's pod, its GPUs as a claim from the template of its demand."""
    manifest = trace.pod_manifest(pod, namespace, run, scheduler_name)
    container = manifest["spec"]["containers"][0]
    requests = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    container["resources"] = {"requests": requests}
    manifest["metadata"]["annotations"] = {}
    name = template_name(pod)
    if name is not None:
        container["resources"]["claims"] = [{"name": "gpu"}]
        manifest["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": name}]
    return manifest


# ---------------------------------------------------------------- reading claims back
def consumed_milli(pod: PodRequest) -> int:
    """The compute a pod's claim consumes once allocated: whole cards, or a share rounded up
    to the request policy's step (``COMPUTE_STEP_MILLI``)."""
    if pod.gpu_milli >= MILLI_PER_GPU:
        return pod.gpu_count * MILLI_PER_GPU
    return pod.gpu_count * (-(-pod.gpu_milli // COMPUTE_STEP_MILLI) * COMPUTE_STEP_MILLI)


@dataclass
class ClaimAccount:
    """The allocated claims of a run, per device."""

    compute: dict[tuple[str, str], Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    memory: dict[tuple[str, str], Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    claims: int = 0
    allocated: int = 0
    consumed_milli: Decimal = Decimal(0)


def account(
    claims: Sequence[Mapping[str, Any]], capacities: Mapping[tuple[str, str], tuple[Decimal, ...]]
) -> ClaimAccount:
    """Every result of our driver in ``claims``: a share consumes its ``consumedCapacity``, a
    result without it the whole device (its published capacity)."""
    out = ClaimAccount()
    for claim in claims:
        out.claims += 1
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        if results:
            out.allocated += 1
        for r in results:
            if r.get("driver") != DRIVER:
                continue
            key = (str(r["pool"]), str(r["device"]))
            memory_total, compute_total = capacities[key]
            consumed = r.get("consumedCapacity") or {}
            compute = parse_quantity(consumed["compute"]) if "compute" in consumed else None
            memory = parse_quantity(consumed["memory"]) if "memory" in consumed else None
            out.compute[key] += compute_total if compute is None else compute
            out.memory[key] += memory_total if memory is None else memory
            out.consumed_milli += compute_total if compute is None else compute
    return out


def overallocated(
    used: ClaimAccount, capacities: Mapping[tuple[str, str], tuple[Decimal, ...]]
) -> list[str]:
    problems = []
    for key, (memory_total, compute_total) in capacities.items():
        if used.compute.get(key, 0) > compute_total or used.memory.get(key, 0) > memory_total:
            problems.append(
                f"{key[0]}/{key[1]}: compute {used.compute.get(key, 0)} of {compute_total}, "
                f"memory {used.memory.get(key, 0)} of {memory_total}"
            )
    return problems


def device_capacities(
    slices: Sequence[Mapping[str, Any]],
) -> dict[tuple[str, str], tuple[Decimal, ...]]:
    """(pool, device) -> (memory bytes, compute milli) of every device at its pool's newest
    generation."""
    newest: dict[str, int] = {}
    for s in slices:
        pool = s["spec"]["pool"]
        newest[pool["name"]] = max(newest.get(pool["name"], 0), int(pool["generation"]))
    out = {}
    for s in slices:
        pool = s["spec"]["pool"]
        if int(pool["generation"]) != newest[pool["name"]]:
            continue
        for d in s["spec"].get("devices") or []:
            capacity = d.get("capacity") or {}
            out[(pool["name"], d["name"])] = (
                parse_quantity(capacity["memory"]["value"]),
                parse_quantity(capacity["compute"]["value"]),
            )
    return out


# ---------------------------------------------------------------- the simulator's figures
def simulated_card_choices(t: ReplayTrace, seed: int) -> dict[str, float]:
    """``kubegpu simulate``'s allocation ratio (%) at 100 % arrived on the same pods and order,
    under kubegpu's node choice, for each card choice: its own (what the device plugin with
    our extender gives), DRA's first fit in index order, and first fit in the steered order,
    the node choice pricing the card the allocator takes (what the ranked variants do); and
    ``first-fit-blind``, first fit under the node choice that ranks by the policy's own best
    card (the extender's DRA ranking before issue 27), the baseline steering and the ranking
    are measured against."""
    spec = POLICIES[STEERING_POLICY]
    workload = target_workload(spec, t.originals)
    arrivals = trace._arrivals(t)
    out = {}

    def ratio(choice: CardChoice, aware: bool = True) -> float:
        result = simulate_replay(
            t.nodes, arrivals, spec, workload, seed, card_choice=choice, allocator_aware=aware
        )
        return round(100.0 * float(result.used_milli[-1]) / t.capacity_milli, 3)

    for choice in CardChoice:
        out[choice.value] = ratio(choice)
    out[BLIND_FIRST_FIT] = ratio(CardChoice.FIRST_FIT, aware=False)
    return out


def gap_closed(steered: float, first_fit: float, full: float) -> float | None:
    """(steered − first fit) / (full − first fit), None when first fit loses nothing."""
    gap = full - first_fit
    if gap <= 1e-9:
        return None
    return round((steered - first_fit) / gap, 3)


# ---------------------------------------------------------------- the cluster
@dataclass
class DraRun:
    variant: str
    outcome: replay.ReplayOutcome
    capacity_milli: int
    claims: ClaimAccount
    overallocated: list[str]
    unbound_with_claim: list[str]
    usage: dict[str, dict[str, float]]
    fleet_publishes: int = 0
    rounded_milli: int = 0  # GPU milli the bound pods consume after the policy's rounding

    @property
    def ratio(self) -> float:
        return 100.0 * self.outcome.bound_milli() / self.capacity_milli

    def summary(self) -> dict[str, Any]:
        latencies = self.outcome.latencies_s()
        return {
            "variant": self.variant,
            "pods": len(self.outcome.pods),
            "bound": sum(1 for p in self.outcome.pods if p.result == replay.BOUND),
            "refused": sum(1 for p in self.outcome.pods if p.result == replay.REFUSED),
            "allocation_pct": round(self.ratio, 3),
            "claims_consumed_pct": round(
                100.0 * float(self.claims.consumed_milli) / self.capacity_milli, 3
            ),
            "bound_after_rounding_pct": round(100.0 * self.rounded_milli / self.capacity_milli, 3),
            "claims": self.claims.claims,
            "claims_allocated": self.claims.allocated,
            "late_binds": len(self.outcome.late_binds),
            "wall_s": round(self.outcome.wall_s, 1),
            "pods_per_s": round(len(self.outcome.pods) / self.outcome.wall_s, 1),
            "bind_latency_p50_ms": round(1000 * latencies[len(latencies) // 2], 1)
            if latencies
            else None,
            "overallocated": self.overallocated,
            "unbound_with_claim": self.unbound_with_claim,
            "slice_publishes": self.fleet_publishes,
            "usage": self.usage,
        }


class DraScaleCluster(ScaleCluster):
    """The scale cluster with DRA's feature gates on every component, the driver's
    DeviceClasses and RBAC, and one process publishing every KWOK node's slices."""

    def __init__(self, bin_dir: Path, out_dir: Path, kwok_binary: Path) -> None:
        super().__init__(bin_dir, out_dir, kwok_binary)
        self.cluster = Cluster(
            bin_dir=bin_dir,
            out_dir=out_dir,
            controller_manager_flags=list(SCALE_CONTROLLER_MANAGER_FLAGS),
            feature_gates=dict(FEATURE_GATES),
        )
        self.kwok = fleet.Kwok(self.cluster, kwok_binary)
        self.driver_kubeconfig: Path | None = None
        self.slice_fleet: HostProcess | None = None
        self.fleet_starts = 0

    def start(self) -> None:
        super().start()
        c = self.cluster
        c.kubectl("create", "namespace", DRIVER_NAMESPACE, check=False)
        for name in ("dra-driver-rbac.yaml", "deviceclasses.yaml"):
            c.kubectl("apply", "--server-side", "-f", str(COMPONENT / name))
        token = c.kubectl(
            "create", "token", DRIVER_ACCOUNT, "-n", DRIVER_NAMESPACE, "--duration=12h"
        ).stdout.strip()
        self.driver_kubeconfig = write_kubeconfig(
            c.run_dir / f"{DRIVER_ACCOUNT}.kubeconfig",
            c.server,
            c.ca.cert,
            user=DRIVER_ACCOUNT,
            token=token,
        )

    def start_scheduling(self, policy: str, t: ReplayTrace, *extra: str) -> None:
        """The extender and the second kube-scheduler, the scheduler with the DRA gates."""
        assert self.roles is not None
        workload = self.cluster.run_dir / f"workload-{policy}.yaml"
        workload.write_text(yaml.safe_dump(trace.workload_file(t, policy)))
        self.roles.start_extender(f"--policy={policy}", f"--workload-file={workload}", *extra)
        self.roles.start_scheduler(*self.cluster._gate_flags())

    # ------------------------------------------------------------ the driver's side
    def start_slice_fleet(self, t: ReplayTrace, steer: str, interval_s: float = 5.0) -> HostProcess:
        """Every node's slices, steered or in index order; returns once all are published."""
        assert self.driver_kubeconfig is not None
        run_dir = self.cluster.run_dir
        nodes = run_dir / "dra-fleet-nodes.json"
        if not nodes.exists():
            nodes.write_text(
                json.dumps(
                    {
                        n.name: {"spec": fleet.gpu_spec(n), "cpuMilli": n.cpu_capacity_milli}
                        for n in t.nodes
                    }
                )
            )
        workload = run_dir / f"workload-{STEERING_POLICY}.yaml"
        workload.write_text(yaml.safe_dump(trace.workload_file(t, STEERING_POLICY)))
        self.fleet_starts += 1
        ready = run_dir / f"dra-fleet-ready-{self.fleet_starts}"
        env = dict(self.cluster.env)
        env.pop("KUBECONFIG", None)
        env["PYTHONPATH"] = str(E2E)
        process = HostProcess(
            "kubegpu-dra-fleet",
            [
                sys.executable,
                "-m",
                "kubegpu_e2e.scale.dra_fleet",
                f"--nodes={nodes}",
                f"--kubeconfig={self.driver_kubeconfig}",
                f"--ready={ready}",
                f"--steer={steer}",
                f"--workload-file={workload}",
                f"--interval={interval_s}",
            ],
            self.cluster.logs / f"kubegpu-dra-fleet-{self.fleet_starts}.log",
            env=env,
        ).start()
        process.wait_until(ready.exists, 300, "every KWOK node's ResourceSlices")
        self.slice_fleet = process
        return process

    def stop_slice_fleet(self) -> int:
        """Stop the fleet; the number of slice publishes it logged after the first."""
        if self.slice_fleet is None:
            return 0
        self.slice_fleet.stop(grace=15)
        log = self.slice_fleet.log.read_text(errors="replace")
        self.slice_fleet = None
        for line in reversed(log.splitlines()):
            if "slice publishes in all" in line:
                return int(line.split("stopping: ")[1].split()[0])
        return 0

    def warm_extender(self, t: ReplayTrace) -> None:
        """The extender's DRA view starts at its first /prioritize-dra call and scores 0 until
        it has listed: make that call, then wait for the lists (as test_13 does)."""
        assert self.roles is not None
        pod = {
            "metadata": {"name": "warm", "namespace": "default"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "none"}]},
        }
        body = json.dumps({"pod": pod, "nodenames": [t.nodes[0].name]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.roles.extender_port}/prioritize-dra",
            body,
            {"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=10).read()
        log = self.roles.processes["kubegpu-extender"].log
        self.cluster.wait_for(
            "the extender's DRA view listed slices and claims",
            lambda: (
                "resourceclaims at version" in log.read_text(errors="replace")
                and "resourceslices at version" in log.read_text(errors="replace")
            ),
            timeout=120,
        )

    # ------------------------------------------------------------ one variant
    async def run_variant(
        self, t: ReplayTrace, variant: Variant, progress: Any = None, steer_interval_s: float = 5.0
    ) -> DraRun:
        """``t``'s pods in order as DRA pods, through ``variant``'s scheduling; then the pods
        (and with them their claims) are deleted and its processes stopped."""
        assert self.roles is not None
        namespace = f"dra-{variant.name}"
        fleet_process = self.start_slice_fleet(t, variant.steer, steer_interval_s)
        processes: dict[str, HostProcess] = {"kubegpu-dra-fleet": fleet_process}
        if variant.ranked:
            self.start_scheduling(STEERING_POLICY, t)
            self.warm_extender(t)
            processes |= {
                n: self.roles.processes[n] for n in ("kubegpu-scheduler", "kubegpu-extender")
            }
            scheduler_name = trace.SCHEDULER_NAME
        else:
            self.cluster.start_default_scheduler()
            processes["kube-scheduler"] = self.cluster.processes["kube-scheduler"]
            scheduler_name = DEFAULT_SCHEDULER
        client = self.client()
        try:
            await replay.ensure_namespace(client, namespace)
            for template in templates(t.pods, namespace):
                await client.create(ResourceClaimTemplate.from_dict(template))
            before = {n: process_usage(p) for n, p in processes.items()}
            outcome = await replay.replay_in_order(
                client,
                t.pods,
                namespace,
                variant.name,
                progress=progress,
                manifest=dra_pod_manifest,
                scheduler_name=scheduler_name,
            )
            after = {n: process_usage(p) for n, p in processes.items()}
            claims = self.cluster.get("resourceclaims", "-n", namespace)["items"]
            slices = self.cluster.get("resourceslices")["items"]
            capacities = device_capacities(slices)
            used = account(claims, capacities)
            unbound = _unbound_with_claim(claims, outcome)
            if variant.ranked:
                self.stop_scheduling()
            else:
                self.cluster.processes.pop("kube-scheduler").stop(grace=10)
            publishes = self.stop_slice_fleet()
            await replay.delete_run(client, namespace)
            # The controller-manager deletes each claim after its pod: a few per second more
            # than the trace has pods takes longer than CI's trace.
            await _wait_no_claims(client, namespace, max(300.0, len(claims) / 5))
        finally:
            await client.close()
        by_name = {p.name: p for p in t.pods}
        rounded = sum(
            consumed_milli(by_name[o.name]) for o in outcome.pods if o.result == replay.BOUND
        )
        run = DraRun(
            variant.name,
            outcome,
            t.capacity_milli,
            used,
            overallocated(used, capacities),
            unbound,
            {
                n: {
                    "cpu_s": round(after[n]["cpu_s"] - before[n]["cpu_s"], 1),
                    "peak_rss_mib": after[n]["peak_rss_mib"],
                }
                for n in after
            },
            publishes,
            rounded,
        )
        (self.out_dir / f"dra-{variant.name}.json").write_text(
            json.dumps(
                {
                    **run.summary(),
                    "curve_real_milli": outcome.curve(),
                    "arrived_milli": t.arrived_milli().tolist(),
                    "nodes_real": [p.node for p in outcome.pods],
                }
            )
        )
        return run


def _unbound_with_claim(
    claims: Sequence[Mapping[str, Any]], outcome: replay.ReplayOutcome
) -> list[str]:
    """Claims allocated for a pod that was never bound (an allocation left behind)."""
    bound = {p.name for p in outcome.pods if p.result == replay.BOUND}
    out = []
    for claim in claims:
        status = claim.get("status") or {}
        if not status.get("allocation"):
            continue
        owners = [o.get("name") for o in claim["metadata"].get("ownerReferences") or []]
        if not any(o in bound for o in owners):
            out.append(f"{claim['metadata']['name']} (owners {owners})")
    return out


async def _wait_no_claims(
    client: lightkube.AsyncClient, namespace: str, timeout_s: float = 300
) -> None:
    from lightkube.generic_resource import create_namespaced_resource as make

    claim_kind = make("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims")
    deadline = time.monotonic() + timeout_s
    left: list[Any] = []
    while time.monotonic() < deadline:
        left = [c async for c in client.list(claim_kind, namespace=namespace)]
        if not left:
            return
        await asyncio.sleep(1)
    raise AssertionError(f"{len(left)} claims of {namespace} still there after {timeout_s:.0f} s")
