"""The CDI spec file that lets a CDI-enabled runtime resolve the names ``Allocate`` returns.

Written only when a CDI device-list strategy is on, atomically (temp file + rename in the same
directory) so the runtime never reads half a spec, at start and on every config change. It is
*kept* when the agent exits: a container restarted while the agent is down or being rolled out
still has to resolve the CDI names ``Allocate`` gave it. Device names follow the device-id
strategy so they match what ``Allocate`` hands out; the kind is our own (``flags.plugin.cdiKind``)
so the spec never clashes with the ``nvidia.com/gpu`` one nvidia-ctk writes beside it. A MIG
device (``flags.migStrategy`` ``single`` or ``mixed``) is a device of its own, named by its
``MIG-…`` UUID (or ``<card>:<MIG index>``), with its card's node and its two capability nodes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubegpu.atomic_file import write_atomically
from kubegpu.config.model import AgentConfig
from kubegpu.core.container import CONTROL_DEVICE_NODES, host_path
from kubegpu.core.gpu import GpuDevice, MigDevice

log = logging.getLogger(__name__)

CDI_VERSION = "0.6.0"


def cdi_spec(
    gpus: Sequence[GpuDevice],
    kind: str,
    id_strategy: str,
    dev_root: str = "/",
    migs: Sequence[MigDevice] = (),
) -> dict[str, Any]:
    """One device per GPU (its ``/dev/nvidiaN``) and per MIG device, plus ``all``; control
    nodes for every one."""

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
    devices += [
        {
            "name": mig.uuid if id_strategy == "uuid" else mig.address,
            "containerEdits": {"deviceNodes": [node(p) for p in mig.device_nodes]},
        }
        for mig in sorted(migs, key=lambda m: (m.parent_index, m.index))
    ]
    every = dict.fromkeys(
        [*(g.device_node for g in gpus), *(p for m in migs for p in m.device_nodes)]
    )
    devices.append(
        {
            "name": "all",
            "containerEdits": {"deviceNodes": [node(p) for p in every]},
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


class CdiSpecFile:
    """The one CDI spec file this agent keeps, following its config.

    :meth:`write` writes the spec of the current config (or none when no CDI strategy is on); a
    spec this agent wrote under another kind or directory before (a reload) is removed: its
    names are no longer handed out, and an old kind may clash with another vendor's."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.path: Path | None = None  # the spec file last written

    def write(
        self, config: AgentConfig, gpus: Sequence[GpuDevice], migs: Sequence[MigDevice] = ()
    ) -> None:
        plugin = config.flags.plugin
        path: Path | None = None
        if config.uses_cdi:
            spec = cdi_spec(gpus, plugin.cdi_kind, plugin.device_id_strategy, plugin.dev_root, migs)
            path = write_spec(Path(plugin.cdi_dir), spec)
            log.info(
                "node %s: wrote CDI spec %s (%d GPUs, %d MIG devices)",
                self.node,
                path,
                len(gpus),
                len(migs),
            )
        previous, self.path = self.path, path
        if previous is not None and previous != path:
            previous.unlink(missing_ok=True)
            log.info("node %s: removed CDI spec %s of the previous config", self.node, previous)
