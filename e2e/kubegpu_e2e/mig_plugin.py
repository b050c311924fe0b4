"""MIG devices as a container sees them on the device-plugin path (e2e/tests/test_09_mig.py): the
host's fake device nodes a MIG device needs (its card's ``/dev/nvidia<minor>`` and two
``/dev/nvidia-caps/nvidia-cap<N>``, real character devices made with mknod), and a workload
command that prints which of them landed in the container's ``/dev``. (The DRA MIG scenarios
have their own, ``mig_dra``.)"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kubegpu.core.gpu import MigDevice, NodeInventory
from kubegpu_e2e.dra import make_device_nodes
from kubegpu_e2e.workloads import ENV_END

# nvidia-caps has a major number of its own, which the driver picks at load; any fake one will
# do here (no driver answers on it, the runtime only needs a character device).
CAPS_MAJOR = 511
DEV = "KUBEGPU_E2E_DEV"
CAPS = "KUBEGPU_E2E_CAPS"
CONTROL_NODES = frozenset({"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"})


def make_mig_device_nodes(dev_root: Path, *inventories: NodeInventory) -> None:
    """Every card's node, the control nodes and every MIG device's two caps under dev_root."""
    make_device_nodes(dev_root, max(len(i.gpus) for i in inventories))
    caps = dev_root / "dev" / "nvidia-caps"
    caps.mkdir(parents=True, exist_ok=True)
    for inventory in inventories:
        for mig in inventory.mig_devices:
            for minor in (mig.gi_cap_minor, mig.ci_cap_minor):
                path = caps / f"nvidia-cap{minor}"
                if minor is not None and not path.exists():
                    os.mknod(path, 0o666 | 0o020000, os.makedev(CAPS_MAJOR, minor))


def probe_command() -> str:
    """The container's command: environment, its NVIDIA nodes in /dev and /dev/nvidia-caps."""
    return (
        'trap "exit 0" TERM; env | sort; '
        f"echo {DEV}=$(ls -a /dev | tr '\\n' ' '); "
        f"echo {CAPS}=$(ls -a /dev/nvidia-caps 2>/dev/null | tr '\\n' ' '); "
        f"echo {ENV_END}; while :; do sleep 1; done"
    )


@dataclass(frozen=True)
class MigView:
    """What one container found: its NVIDIA nodes in /dev, and in /dev/nvidia-caps."""

    nodes: frozenset[str]
    caps: frozenset[str]


def mig_view(env: Mapping[str, str]) -> MigView:
    listing = env.get(DEV, "").split()
    # The listing ran: every container's /dev has these, GPU or not.
    assert {"null", "zero"} <= set(listing), env.get(DEV)
    nodes = frozenset(n for n in listing if n.startswith("nvidia") and n != "nvidia-caps")
    caps = frozenset(n for n in env.get(CAPS, "").split() if n.startswith("nvidia-cap"))
    return MigView(nodes, caps)


def expected_view(migs: Iterable[MigDevice] = (), cards: Iterable[int] = ()) -> MigView:
    """What a container given these MIG devices (and whole cards, by minor) sees."""
    migs = list(migs)
    minors = {m.parent_minor for m in migs} | set(cards)
    nodes = frozenset(f"nvidia{m}" for m in minors)
    caps = frozenset(
        f"nvidia-cap{c}" for m in migs for c in (m.gi_cap_minor, m.ci_cap_minor) if c is not None
    )
    return MigView(nodes | CONTROL_NODES if nodes else nodes, caps)
