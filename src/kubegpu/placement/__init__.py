"""Placement engine: pure cluster state, requests, feasibility, scoring and GPU choice.

The values and the policy registry (:mod:`kubegpu.placement.policies`) are importable from
here; the engine itself lives in :mod:`kubegpu.placement.engine` (``PlacementEngine``,
``filter_nodes``, ``score_nodes``, ``pick_gpus``).
"""

from kubegpu.placement.fragmentation import TypicalPod, TypicalWorkload
from kubegpu.placement.model import (
    MILLI_PER_GPU,
    Fit,
    GpuState,
    NodeState,
    Placement,
    PodRequest,
)
from kubegpu.placement.policies import DEFAULT_POLICY, POLICIES, PolicySpec, get_policy

__all__ = [
    "DEFAULT_POLICY",
    "MILLI_PER_GPU",
    "POLICIES",
    "Fit",
    "GpuState",
    "NodeState",
    "Placement",
    "PodRequest",
    "PolicySpec",
    "TypicalPod",
    "TypicalWorkload",
    "get_policy",
]
