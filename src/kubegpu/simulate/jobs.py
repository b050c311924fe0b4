"""One run of ``kubegpu simulate``'s grid: a policy's replay, or (``--bound``) the upper
bound or the offline packing of the same arrivals (:mod:`kubegpu.simulate.hindsight`), or
(``--mig``) the same arrivals on MIG cards (:mod:`kubegpu.simulate.mig`).

Runs are plain values so the command can hand them to worker processes.
"""

from __future__ import annotations

import functools
import resource
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kubegpu.placement.device_order import CardChoice
from kubegpu.placement.model import NodeState
from kubegpu.placement.policies import get_policy
from kubegpu.simulate.arrivals import Arrivals, generate_arrivals, load_fixture
from kubegpu.simulate.hindsight import HINDSIGHT_LABELS, hindsight
from kubegpu.simulate.memory_only import memory_only, with_card_memory
from kubegpu.simulate.mig import MIG_POLICIES, MigResult, mig_variant, replay_mig
from kubegpu.simulate.replay import ReplayResult, discretise, replay, target_workload
from kubegpu.simulate.traces import TracePod, load_nodes, load_pods

# ``--mig``: the arrivals as MIG requests on H100 MIG cards, by each placement rule.
MIG_LABELS = {f"mig-{rule}": f"MIG {rule}" for rule in MIG_POLICIES}


def mig_curve(result: MigResult, total_gpus: int) -> ReplayResult:
    """A MIG replay as a policy's curve: the original demand arrived against the compute
    slices held, in milli-cards (7 slices are one card)."""
    used = np.rint(np.array(result.used_slices, dtype=np.float64) * 1000 / 7).astype(np.int64)
    return ReplayResult(
        np.array(result.arrived_milli, dtype=np.int64), used, total_gpus, result.refused
    )


@dataclass(frozen=True)
class Job:
    nodes: Path
    pods: Path
    arrivals: Path | None  # fixture file, or None to generate from the seed
    # A policy's name, a key of HINDSIGHT_LABELS ("offline", "bound") or of MIG_LABELS.
    policy: str
    seed: int
    inflation: float
    card_choice: CardChoice = CardChoice.POLICY
    # A memory-only variant of the trace (kubegpu.simulate.memory_only.VARIANTS), or "".
    memory_only: str = ""

    @property
    def workload(self) -> str:
        """The pod list's name, with the memory-only variant: ``default-memory-openb``."""
        return f"{self.pods.stem}-memory-{self.memory_only}" if self.memory_only else self.pods.stem

    @property
    def label(self) -> str:
        """The policy's paper label, plus the card choice where it is not the policy's
        (``07-Kubegpu first-fit``): the ``sc_policy`` of allocation.csv and runs.csv."""
        if self.policy in HINDSIGHT_LABELS:
            return HINDSIGHT_LABELS[self.policy]
        if self.policy in MIG_LABELS:
            return MIG_LABELS[self.policy]
        label = get_policy(self.policy).label
        if self.card_choice is CardChoice.POLICY:
            return label
        return f"{label} {self.card_choice.value}"


@dataclass(frozen=True)
class JobResult:
    job: Job
    columns: list[float | None]
    total_gpus: int
    failed_pods: int  # the bound's: GPU pods its relaxation leaves out
    wall_s: float
    cpu_s: float  # this process's CPU time for the run: steadier than wall on a busy machine
    max_rss_mib: float


@functools.lru_cache(maxsize=4)
def _nodes(path: Path) -> list[NodeState]:
    return load_nodes(path)


@functools.lru_cache(maxsize=4)
def _pods(path: Path) -> list[TracePod]:
    return load_pods(path)


def run_job(job: Job) -> JobResult:
    """One replay (or bound, or offline packing); reads (and caches per process) the traces
    it needs."""
    started = time.perf_counter()
    cpu_started = time.process_time()
    nodes = _nodes(job.nodes)
    pods = _pods(job.pods)
    if job.memory_only:
        # Re-expressed before the arrivals are drawn: they are tuned by what shares hold.
        nodes = with_card_memory(nodes)
        requests = memory_only([p.request for p in pods], nodes, job.memory_only, job.seed)
        pods = [replace(p, request=r) for p, r in zip(pods, requests, strict=True)]
    arrivals: Arrivals
    if job.arrivals is not None:
        arrivals = load_fixture(job.arrivals, pods, nodes)
    else:
        arrivals = generate_arrivals(pods, nodes, job.seed, job.inflation)
    total_gpus = sum(len(n.gpus) for n in nodes)
    if job.policy in MIG_LABELS:
        mig = replay_mig(nodes, mig_variant(arrivals.pods), job.policy.removeprefix("mig-"))
        columns, failed = discretise(mig_curve(mig, total_gpus)), mig.refused
    elif job.policy in HINDSIGHT_LABELS:
        found = hindsight(nodes, arrivals.pods, pack=job.policy == "offline")
        if found.packing is None:
            columns, failed = found.bound_column, found.lp_dropped_pods
        else:
            columns = found.offline_column
            failed = sum(1 for s in found.packing.slots if s is None)
    else:
        spec = get_policy(job.policy)
        workload = target_workload(spec, pods, nodes)
        result = replay(nodes, arrivals, spec, workload, job.seed, card_choice=job.card_choice)
        columns, failed = discretise(result), result.failed_pods
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return JobResult(
        job,
        columns,
        total_gpus,
        failed,
        time.perf_counter() - started,
        time.process_time() - cpu_started,
        rss_mib,
    )
