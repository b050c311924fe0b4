"""The policy registry: every placement policy in one table, and the lookups that read it.

Each entry is a :class:`~kubegpu.placement.policy.PolicySpec`: its names, how it scores nodes
and chooses a share's card (built per engine, :mod:`kubegpu.placement.policy`), the target
workload it measures against, and whether the extender and ``kubegpu simulate --policy all``
list it. The engine builds its scorers from the entry; the extender (``--policy``, settings
validation, DRA ranking), the simulator, the CLIs' help and the generated docs read their
policies from here. Adding a policy is a module in this package (its scorer) and one entry in
:data:`POLICIES`.

The six paper policies are the ones of Weng et al. (ATC'23) as their simulator implements them
(``shared/specs/fgd-methodology.md`` §6): their scorers are :mod:`.simple` and :mod:`.fgd`;
``kubegpu`` is ours (:mod:`.kubegpu`); ``spread`` is the extender's opposite of bin packing.
The card rules that need no scorer are :mod:`.cards`.
"""

from __future__ import annotations

from collections.abc import Iterable

from kubegpu.placement.policies import cards, fgd, simple
from kubegpu.placement.policies import kubegpu as ours
from kubegpu.placement.policy import PolicySpec

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "PolicySpec",
    "extender_accepts",
    "extender_names",
    "extender_policy",
    "get_policy",
    "names_in_prose",
    "simulator_policies",
]

# Table order is the order of every list made from it (``--policy all``'s runs and so
# allocation.csv's rows, help texts, docs).
POLICIES: dict[str, PolicySpec] = {
    p.name: p
    for p in (
        PolicySpec(
            "random",
            "01-Random",
            node_scorer=simple.RandomNodes,
            cards=cards.RANDOM,
            target=fgd.target,
            in_simulator_all=True,
        ),
        PolicySpec(
            "dotprod",
            "02-DotProd",
            node_scorer=simple.scored_by(simple.dot_prod),
            cards=cards.BEST_FIT,
            target=fgd.target,
            in_simulator_all=True,
        ),
        PolicySpec(
            "gpuclustering",
            "03-GpuClustering",
            node_scorer=simple.scored_by(simple.gpu_clustering),
            cards=cards.BEST_FIT,
            target=fgd.target,
            in_simulator_all=True,
        ),
        PolicySpec(
            "gpupacking",
            "04-GpuPacking",
            node_scorer=simple.scored_by(simple.gpu_packing),
            cards=cards.BEST_FIT,
            target=fgd.target,
            in_simulator_all=True,
        ),
        PolicySpec(
            "bestfit",
            "05-BestFit",
            node_scorer=simple.scored_by(simple.best_fit),
            cards=cards.BEST_FIT,
            target=fgd.target,
            extender_name="binpack",
            in_simulator_all=True,
        ),
        PolicySpec(
            "fgd",
            "06-FGD",
            node_scorer=fgd.node_scorer,
            cards=fgd.CARDS,
            target=fgd.target,
            needs_workload=True,
            extender_name="fgd",
            in_simulator_all=True,
        ),
        PolicySpec(
            "kubegpu",
            "07-Kubegpu",
            node_scorer=ours.node_scorer,
            cards=ours.CARDS,
            target=ours.target,
            needs_workload=True,
            extender_name="kubegpu",
            in_simulator_all=True,
        ),
        # Not one the paper grid runs (--policy all); the extender's, and simulate finds it.
        PolicySpec(
            "spread",
            "Spread",
            node_scorer=simple.scored_by(simple.spread),
            cards=cards.SPREAD,
            target=fgd.target,
            extender_name="spread",
        ),
    )
}

DEFAULT_POLICY = "kubegpu"


def get_policy(name: str) -> PolicySpec:
    """Look a policy up by CLI name or paper label, case-insensitively."""
    wanted = name.strip().lower()
    for spec in POLICIES.values():
        if wanted in (spec.name, spec.label.lower(), spec.label.split("-", 1)[-1].lower()):
            return spec
    known = ", ".join(POLICIES)
    raise KeyError(f"unknown policy {name!r}; known: {known}")


def simulator_policies() -> list[PolicySpec]:
    """What ``kubegpu simulate --policy all`` runs, in table order."""
    return [p for p in POLICIES.values() if p.in_simulator_all]


def extender_names() -> list[str]:
    """The names the extender lists its policies under, in table order."""
    return [p.extender_name for p in POLICIES.values() if p.extender_name is not None]


def extender_accepts() -> frozenset[str]:
    """Every name the extender's settings accept (lower case): its listed names and every
    registered policy's own name."""
    return frozenset(extender_names()) | frozenset(POLICIES)


def extender_policy(name: str) -> PolicySpec:
    """The policy the extender runs for ``name``: its listed name, else a registered name or
    label (:func:`get_policy`)."""
    wanted = name.strip().lower()
    for spec in POLICIES.values():
        if spec.extender_name == wanted:
            return spec
    return get_policy(wanted)


def names_in_prose(names: Iterable[str], conjunction: str = "or") -> str:
    """Policy names as help texts and docs list them: sorted, ``a, b or c``."""
    ordered = sorted(names)
    if len(ordered) < 2:
        return "".join(ordered)
    return f"{', '.join(ordered[:-1])} {conjunction} {ordered[-1]}"
