"""Scheduling policies as data: a name, the paper's label, how node and cards are chosen.

The six paper policies are the ones of Weng et al. (ATC'23) as their simulator implements them
(``shared/specs/fgd-methodology.md`` §6); ``kubegpu`` is ours; ``spread`` is the extender's
opposite of bin packing. The engine dispatches on :attr:`PolicySpec.node_score` and
:attr:`PolicySpec.gpu_choice`; nothing else differs. The scorers themselves live in this
package's modules (:mod:`.simple`, :mod:`.fgd`, :mod:`.kubegpu`) and the card choice in
:mod:`.cards`; this module imports no numpy, so the table is cheap to import.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class NodeScore(enum.Enum):
    RANDOM = "random"  # one feasible node drawn uniformly gets 100, the others 0
    DOT_PROD = "dot-prod"  # Tetris-like dot product of free and requested (CPU, GPU)
    GPU_CLUSTERING = "gpu-clustering"  # prefer nodes already hosting the same pod class
    GPU_PACKING = "gpu-packing"  # prefer partly used cards, then partly used nodes
    BEST_FIT = "best-fit"  # least (CPU, GPU) left after placement, min-max normalised
    FGD = "fgd"  # least growth of expected fragmentation
    KUBEGPU = "kubegpu"  # least doomed waste (card gaps, CPU-stranded GPU), then FGD, first fit
    SPREAD = "spread"  # BestFit's score turned upside down: the emptiest node


class GpuChoice(enum.Enum):
    RANDOM = "random"  # a uniformly drawn card that fits
    BEST_FIT = "best-fit"  # the fitting card with the least free milli (lowest index on ties)
    FRAGMENTATION = "fragmentation"  # the card whose use adds the least fragmentation
    WASTE = "waste"  # the card whose use dooms the least waste, then the tightest
    SPREAD = "spread"  # the fitting card with the most free milli, then memory (lowest index)


@dataclass(frozen=True)
class PolicySpec:
    name: str  # CLI name, e.g. "fgd"
    label: str  # the paper artifact's label, e.g. "06-FGD"
    node_score: NodeScore
    gpu_choice: GpuChoice


POLICIES: dict[str, PolicySpec] = {
    p.name: p
    for p in (
        PolicySpec("random", "01-Random", NodeScore.RANDOM, GpuChoice.RANDOM),
        PolicySpec("dotprod", "02-DotProd", NodeScore.DOT_PROD, GpuChoice.BEST_FIT),
        PolicySpec(
            "gpuclustering", "03-GpuClustering", NodeScore.GPU_CLUSTERING, GpuChoice.BEST_FIT
        ),
        PolicySpec("gpupacking", "04-GpuPacking", NodeScore.GPU_PACKING, GpuChoice.BEST_FIT),
        PolicySpec("bestfit", "05-BestFit", NodeScore.BEST_FIT, GpuChoice.BEST_FIT),
        PolicySpec("fgd", "06-FGD", NodeScore.FGD, GpuChoice.FRAGMENTATION),
        PolicySpec("kubegpu", "07-Kubegpu", NodeScore.KUBEGPU, GpuChoice.WASTE),
    )
}

# Not in POLICIES, which is what the simulator's ``--policy all`` and the grid run (the paper's
# six and ours); the extender's ``spread`` and ``kubegpu simulate --policy spread`` find it.
SPREAD = PolicySpec("spread", "Spread", NodeScore.SPREAD, GpuChoice.SPREAD)

DEFAULT_POLICY = "kubegpu"


def get_policy(name: str) -> PolicySpec:
    """Look a policy up by CLI name or paper label, case-insensitively."""
    wanted = name.strip().lower()
    for spec in (*POLICIES.values(), SPREAD):
        if wanted in (spec.name, spec.label.lower(), spec.label.split("-", 1)[-1].lower()):
            return spec
    known = ", ".join([*POLICIES, SPREAD.name])
    raise KeyError(f"unknown policy {name!r}; known: {known}")
