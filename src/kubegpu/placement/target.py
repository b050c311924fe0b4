"""The target workload FGD and our policy measure against: one definition for every caller.

Both the trace simulator and the scheduler extender call :func:`target_workload`, with one
class key per pod the scheduler knows of: for the simulator, every pod of the trace; live,
every pod in the cluster (pending, bound or running). CPU-only pods count too: FGD's paper
runs include them (``isInvolvedCpuPods``), and their CPU is what strands GPU on a node, which
our policy prices. So the same pods give the same workload, and the same node state the same
placement, offline and live (``tests/extender/test_workload_definition.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from kubegpu.placement.fragmentation import ClassKey, TypicalWorkload, spec_models
from kubegpu.placement.policies import NodeScore, PolicySpec

# FGD keeps the most popular classes covering this share of the pods (spec §6).
FGD_POPULARITY_PERCENT = 95.0


def target_workload(policy: PolicySpec, classes: Iterable[ClassKey]) -> TypicalWorkload:
    """The workload ``policy`` measures against, from one class key per pod.

    FGD: the classes covering :data:`FGD_POPULARITY_PERCENT` of the pods, a model constraint
    keyed as spelt (the paper's simulator does so; live pods come with one spelling). Ours:
    every class, models as sets (it cuts to FGD's popular classes itself where it needs to,
    ``kubegpu.placement.policies.kubegpu.KubegpuScorer.keys``). Other policies ignore the workload.
    """
    keys = list(classes)
    if policy.node_score is NodeScore.KUBEGPU:
        as_sets = [(c, m, n, "|".join(sorted(spec_models(s)))) for c, m, n, s in keys]
        return TypicalWorkload.from_classes(as_sets, popularity_percent=100.0)
    return TypicalWorkload.from_classes(keys, FGD_POPULARITY_PERCENT)
