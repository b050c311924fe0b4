"""The target workload FGD and our policy measure against: one definition for every caller.

Both the trace simulator and the scheduler extender call :func:`target_workload`, with one
class key per pod the scheduler knows of: for the simulator, every pod of the trace; live,
every pod in the cluster (pending, bound or running). CPU-only pods count too: FGD's paper
runs include them (``isInvolvedCpuPods``), and their CPU is what strands GPU on a node, which
our policy prices. So the same pods give the same workload, and the same node state the same
placement, offline and live (``tests/extender/test_workload_definition.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from kubegpu.placement.fragmentation import ClassKey, TypicalWorkload
from kubegpu.placement.model import NodeState
from kubegpu.placement.policy import PolicySpec


def reference_card_memory(card_memories: Iterable[int | None]) -> int | None:
    """The card memory (MiB) a workload's shares are classed against
    (:func:`~kubegpu.placement.fragmentation.class_key`): the most common among the
    cluster's cards, the smaller on a tie; ``None`` when no card's memory is known (the
    traces: shares are then classed by compute alone, as the paper's simulator does).

    One class per share, however many card sizes: the engine scores each node at the share's
    level on that node's cards; the workload only says which shares to expect."""
    counts = Counter(m for m in card_memories if m)
    if not counts:
        return None
    return min(counts, key=lambda m: (-counts[m], m))


def node_card_memories(nodes: Iterable[NodeState]) -> Iterable[int | None]:
    """Each card's memory (MiB, ``None`` where unknown), over ``nodes``."""
    return (g.memory_mib for n in nodes for g in n.gpus)


def target_workload(policy: PolicySpec, classes: Iterable[ClassKey]) -> TypicalWorkload:
    """The workload ``policy`` measures against, from one class key per pod: its registry
    entry's rule (:attr:`PolicySpec.target`).

    FGD's (:func:`kubegpu.placement.policies.fgd.target`, every policy but ours): the classes
    covering 95 % of the pods, a model constraint keyed as spelt. Ours
    (:func:`kubegpu.placement.policies.kubegpu.target`): every class, models as sets. Policies
    that measure nothing ignore the workload.
    """
    return policy.target(list(classes))
