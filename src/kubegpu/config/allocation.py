"""Which of kubegpu's two ways of handing GPUs to pods a node uses (``gpuAllocation``).

The device plugin and the DRA driver would each hand out the same GPUs without knowing of the
other, so a card could be given twice; each role checks this key at start and refuses to run
when the config names the other one.
"""

from __future__ import annotations

from typing import Literal

from kubegpu.config.model import AgentConfig

GpuAllocation = Literal["devicePlugin", "dra"]

_COMMAND: dict[str, str] = {"devicePlugin": "kubegpu device-plugin", "dra": "kubegpu dra-driver"}


class GpuAllocationError(ValueError):
    """The config gives this node's GPUs to the other role."""


def check_gpu_allocation(config: AgentConfig, role: GpuAllocation) -> None:
    """Raise :class:`GpuAllocationError`, saying what to change, unless ``config`` gives the
    node's GPUs to ``role``."""
    chosen = config.gpu_allocation
    if chosen != role:
        raise GpuAllocationError(
            f"gpuAllocation is {chosen!r}: this node's GPUs are handed out by {_COMMAND[chosen]}, "
            f"not {_COMMAND[role]}; a node runs one of them, never both (set gpuAllocation: "
            f"{role} in this node's config to switch, see docs/dra.md)"
        )
