"""GPU health as domain values: what happened to a GPU and whether it makes the GPU unusable.

Which Xid codes count as critical is policy, kept here as data so that the NVML watcher, the
fake backend and the tests all apply the same rule.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kubegpu.core.gpu import GpuUuid

# Xids caused by the application, not the GPU (NVIDIA's device plugin ignores the same set):
# 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing,
# 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})


class HealthEventKind(enum.Enum):
    XID = "xid"  # an Xid error was reported for the GPU
    LOST = "lost"  # the GPU fell off the bus / stopped answering
    RECOVERED = "recovered"  # a lost GPU answers again (fake backend, or a checked recovery)


@dataclass(frozen=True)
class HealthEvent:
    """Something the backend observed about one GPU (``uuid=None``: about every GPU)."""

    kind: HealthEventKind
    uuid: GpuUuid | None
    xid: int | None = None
    detail: str = ""
