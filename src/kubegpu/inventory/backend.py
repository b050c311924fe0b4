"""Where the backend protocol used to live; it is a core port now (:mod:`kubegpu.core.backend`).

Kept so that the inventory edge's own modules and older imports keep working: the protocol is
what the kubelet, exporter and labels edges depend on, and they may not import this edge.
"""

from kubegpu.core.backend import GpuBackend, HealthWatcher, InventoryError

__all__ = ["GpuBackend", "HealthWatcher", "InventoryError"]
