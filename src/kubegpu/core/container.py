"""What a GPU container is handed, the same from the device plugin and the DRA driver: the
environment variables a share is told through, and the device nodes every GPU container needs.
Both edges take them from here, so a pod sees one set of names whichever path served it; what a
shared container is told in them is :func:`kubegpu.sharing.contract.share_contract`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath, PurePosixPath

# The cards a container sees, where kubegpu names them (the device plugin's device-list
# strategy may name them otherwise: by index, volume mounts or CDI).
ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# Environment every sharing container gets (docs/sharing.md).
ENV_UUID = "KUBEGPU_GPU_UUID"
ENV_MEMORY_LIMIT = "KUBEGPU_GPU_MEMORY_LIMIT_MIB"
ENV_COMPUTE = "KUBEGPU_GPU_COMPUTE_MILLI"
ENV_ENFORCEMENT = "KUBEGPU_GPU_ENFORCEMENT"
# A DRA share's allocation ``shareID`` (docs/dra.md); the device plugin has none to tell.
ENV_SHARE_ID = "KUBEGPU_DRA_SHARE_ID"
# CUDA MPS client settings a share is held to under `enforcement: mps`.
ENV_MPS_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MPS_LOG = "CUDA_MPS_LOG_DIRECTORY"
ENV_MPS_MEMORY = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"

# Device nodes every GPU container needs besides its /dev/nvidiaN.
CONTROL_DEVICE_NODES: tuple[str, ...] = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
)


def host_path(dev_root: str, path: str) -> str:
    """Where a container's device ``path`` is on the host when the host's /dev sits under
    ``dev_root`` (the driver root of a containerised driver); ``path`` itself for ``/``."""
    return path if dev_root in ("", "/") else dev_root.rstrip("/") + path


def mps_thread_percentage(compute_milli: int) -> int:
    """MPS takes whole percents; round up so a 5-milli share still gets 1 %."""
    return max(1, min(100, -(-compute_milli // 10)))


@dataclass(frozen=True)
class MpsDirs:
    """Where the node's MPS control daemon listens (``enforcement: mps``): host paths, mounted
    at the same path in a sharing container (by the device plugin and the DRA driver alike)."""

    pipe_dir: str
    log_dir: str

    @classmethod
    def under(cls, host_dir: str | PurePath) -> MpsDirs:
        """The folders under the daemon's ``host_dir`` (``mps.hostDir``): ``pipe/`` and ``log/``."""
        root = PurePosixPath(host_dir)
        return cls(str(root / "pipe"), str(root / "log"))
