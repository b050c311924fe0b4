"""The CDI spec file that lets a CDI-enabled runtime resolve the names ``Allocate`` returns.

Written only when a CDI device-list strategy is on, atomically (temp file + rename in the same
directory) so the runtime never reads half a spec, at start and on every config change. It is
*kept* when the agent exits: a container restarted while the agent is down or being rolled out
still has to resolve the CDI names ``Allocate`` gave it. Device names follow the device-id
strategy so they match what ``Allocate`` hands out; the kind is our own (``flags.plugin.cdiKind``)
so the spec never clashes with the ``nvidia.com/gpu`` one nvidia-ctk writes beside it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubegpu.atomic_file import write_atomically
from kubegpu.core.container import CONTROL_DEVICE_NODES, host_path
from kubegpu.core.gpu import GpuDevice

CDI_VERSION = "0.6.0"


def cdi_spec(
    gpus: Sequence[GpuDevice], kind: str, id_strategy: str, dev_root: str = "/"
) -> dict[str, Any]:
    """One device per GPU (its ``/dev/nvidiaN``) plus ``all``; control nodes for every one."""

    def node(path: str) -> dict[str, str]:
        entry = {"path": path}
        if dev_root not in ("", "/"):
            entry["hostPath"] = host_path(dev_root, path)
        return entry

    devices = [
        {
            "name": gpu.uuid if id_strategy == "uuid" else str(gpu.index),
            "containerEdits": {"deviceNodes": [node(gpu.device_node)]},
        }
        for gpu in sorted(gpus, key=lambda g: g.index)
    ]
    devices.append(
        {
            "name": "all",
            "containerEdits": {"deviceNodes": [node(g.device_node) for g in gpus]},
        }
    )
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": devices,
        "containerEdits": {"deviceNodes": [node(p) for p in CONTROL_DEVICE_NODES]},
    }


def spec_path(cdi_dir: Path, kind: str) -> Path:
    """``nvidia.com/gpu`` → ``<dir>/kubegpu-nvidia.com-gpu.json``."""
    return cdi_dir / f"kubegpu-{kind.replace('/', '-')}.json"


def write_spec(cdi_dir: Path, spec: dict[str, Any]) -> Path:
    target = spec_path(cdi_dir, str(spec["kind"]))
    write_atomically(target, json.dumps(spec, indent=2) + "\n", mode=0o644)
    return target
