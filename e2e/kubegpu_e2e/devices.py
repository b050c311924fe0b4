"""Accelerator isolation as a container sees it (issue 28): which NVIDIA device nodes it finds
in its /dev, and which of the host's it can reach at all.

The workload container runs :func:`probe_command`: it prints its environment, the whole of
``ls -a /dev`` (not a filtered listing, so a listing that failed reads as an error, never as
"no GPU"), and then, for every NVIDIA node of the host's fake device folder (real character
devices made with mknod, :func:`kubegpu_e2e.dra.make_device_nodes`), whether it can open it:
through its own /dev when the node is there, or else through a node it makes itself with the
same major:minor (containerd gives containers CAP_MKNOD). The kernel checks the container's
device cgroup before it looks for a driver: a device the runtime did not grant fails with EPERM
(at mknod or at open), one it granted with ENXIO, since no NVIDIA driver serves the fake
majors. So "reachable" means the runtime let this container at that device whatever the path,
and a container that was given nothing must show neither a node nor a reachable device.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kubegpu.inventory.select import open_backend
from kubegpu_e2e.workloads import ENV_END

# What every container given a GPU also gets, from the device plugin's DeviceSpecs and from the
# DRA driver's CDI spec alike: the control node and the unified-memory nodes a CUDA program
# opens. Spelt out rather than read from the product, so the scenarios say what they expect.
CONTROL_NODES = frozenset({"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"})
DEV = "KUBEGPU_E2E_DEV"
REACH = "KUBEGPU_E2E_REACH"
# Reachability outcomes the probe prints per node.
REACHABLE = "reachable"  # open failed with ENXIO: the device cgroup let it through
OPENED = "opened"  # open succeeded: a driver answered (never with fake nodes)
DENIED = ("denied", "denied-mknod")  # EPERM at open or at mknod: the device cgroup refused


def host_nodes(dev_root: Path) -> dict[str, tuple[int, int]]:
    """The NVIDIA character devices under ``dev_root``/dev, name -> (major, minor)."""
    found = {}
    for path in sorted((dev_root / "dev").iterdir()):
        info = path.stat()
        if path.name.startswith("nvidia") and stat.S_ISCHR(info.st_mode):
            found[path.name] = (os.major(info.st_rdev), os.minor(info.st_rdev))
    assert found, f"no NVIDIA device nodes under {dev_root}/dev"
    return found


def probe_command(nodes: Mapping[str, tuple[int, int]]) -> str:
    """The container's shell command: environment, /dev, reachability of ``nodes``, idle."""
    reach = " ".join(f"reach {name} {major} {minor};" for name, (major, minor) in nodes.items())
    return (
        'trap "exit 0" TERM; env | sort; '
        f"echo {DEV}=$(ls -a /dev | tr '\\n' ' '); "
        "reach() { p=/dev/$1; "
        'if [ ! -e "$p" ]; then p=/dev/kgpu-probe-$1; '
        'mknod "$p" c $2 $3 2>/dev/null || { echo "$1:denied-mknod"; return; }; fi; '
        'e=$( (: <"$p") 2>&1 ); '
        'case "$e" in "") echo "$1:opened";; '
        '*"No such device or address"*) echo "$1:reachable";; '
        '*"Operation not permitted"*) echo "$1:denied";; '
        '*) echo "$1:unexpected($e)";; esac; }; '
        f"echo {REACH}=$( {{ {reach} }} | tr '\\n' ' '); "
        f"echo {ENV_END}; while :; do sleep 1; done"
    )


@dataclass(frozen=True)
class DeviceView:
    """What one container saw: its /dev's NVIDIA entries, and per host node what opening it
    gave (``reachable``, ``denied``, ...)."""

    visible: frozenset[str]
    reach: Mapping[str, str]

    @property
    def reachable(self) -> frozenset[str]:
        return frozenset(n for n, r in self.reach.items() if r in (REACHABLE, OPENED))

    def summary(self) -> str:
        refused = sorted({r for n, r in self.reach.items() if n not in self.reachable})
        return (
            f"sees {sorted(self.visible)}, reaches {sorted(self.reachable)}, "
            f"the other nodes {refused or 'none'}"
        )


def device_view(env: Mapping[str, str], nodes: Iterable[str], where: str) -> DeviceView:
    """The probe's two lines from a container's printed environment."""
    listing = env.get(DEV, "").split()
    # The listing ran: every container's /dev has these, GPU or not.
    assert {"null", "zero", "pts"} <= set(listing), (where, env.get(DEV))
    reach = dict(entry.split(":", 1) for entry in env.get(REACH, "").split())
    assert set(reach) == set(nodes), (where, env.get(REACH))
    unexplained = {n: r for n, r in reach.items() if r not in (REACHABLE, OPENED, *DENIED)}
    assert not unexplained, (where, unexplained)
    return DeviceView(frozenset(n for n in listing if n.startswith("nvidia")), reach)


def gpu_nodes(minors: Iterable[int]) -> frozenset[str]:
    """What a container given the GPUs of these minor numbers sees: their /dev/nvidiaN and the
    control nodes; a container given no GPU sees nothing (``minors`` empty)."""
    cards = frozenset(f"nvidia{m}" for m in minors)
    return cards | CONTROL_NODES if cards else frozenset()


def assert_isolated(view: DeviceView, minors: Iterable[int], where: str) -> None:
    """Exactly the nodes of these GPUs (and the control nodes with them) in /dev, and exactly
    those reachable: no other GPU's node, and no other GPU opened through a node of its own."""
    expected = gpu_nodes(minors)
    assert view.visible == expected, (where, sorted(view.visible), sorted(expected))
    assert view.reachable == expected, (where, dict(view.reach), sorted(expected))


def minors_by_uuid(fake_gpus: str) -> dict[str, int]:
    """The fake backend's GPUs (the preset the node's agent or driver runs), uuid -> the minor
    number of its /dev/nvidiaN."""
    backend = open_backend("fake", fake_gpus=fake_gpus)
    try:
        return {g.uuid: g.minor_number for g in backend.snapshot().gpus}
    finally:
        backend.close()
