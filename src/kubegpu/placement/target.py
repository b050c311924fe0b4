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

from kubegpu.placement.fragmentation import ClassKey, TypicalWorkload
from kubegpu.placement.policy import PolicySpec


def target_workload(policy: PolicySpec, classes: Iterable[ClassKey]) -> TypicalWorkload:
    """The workload ``policy`` measures against, from one class key per pod: its registry
    entry's rule (:attr:`PolicySpec.target`).

    FGD's (:func:`kubegpu.placement.policies.fgd.target`, every policy but ours): the classes
    covering 95 % of the pods, a model constraint keyed as spelt. Ours
    (:func:`kubegpu.placement.policies.kubegpu.target`): every class, models as sets. Policies
    that measure nothing ignore the workload.
    """
    return policy.target(list(classes))
