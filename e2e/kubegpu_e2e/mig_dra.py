"""The fake MIG node of the DRA MIG scenarios (e2e/tests/test_17_mig_dra.py): four H100s,
card 0 partitioned 2g.20gb@0 + 1g.10gb@2 + 3g.40gb@4, card 1 in MIG mode with no instances
(dynamic MIG's card), cards 2 and 3 whole; and the MIG capability device nodes
(/dev/nvidia-caps/nvidia-cap<N>) a MIG device's CDI spec names, made as real character devices
under the driver's --dev-root as the card nodes are."""

from __future__ import annotations

import os
from pathlib import Path

from kubegpu.core.gpu import mig_cap_minors
from kubegpu_e2e.cluster import Cluster
from kubegpu_e2e.dra import FEATURE_GATES, DraDriver, containerd_bin_dir

H100 = "NVIDIA H100 80GB HBM3"
CARDS = 4
# What the static slice publishes: card 0's three instances and cards 2 and 3 whole.
MIG_DEVICES = 5
STATIC_LAYOUT = (("2g.20gb", 0), ("1g.10gb", 2), ("3g.40gb", 4))
# nvidia-caps' character-device major is dynamic on a real host; any free one does here.
_CAPS_MAJOR = 236


def write_mig_spec(folder: Path) -> Path:
    cards = []
    for i in range(CARDS):
        lines = [
            f"  - index: {i}",
            f"    uuid: GPU-4a000000-0000-0000-0000-00000000000{i}",
            f"    product_name: {H100}",
            "    memory_total_mib: 81559",
            f'    pci_bus_id: "00000000:{0x18 + i:02X}:00.0"',
            '    compute_capability: "9.0"',
            f"    mig_enabled: {'true' if i < 2 else 'false'}",
        ]
        if i == 0:
            lines.append("    mig_instances:")
            lines += [f"      - {{profile: {p}, start: {s}}}" for p, s in STATIC_LAYOUT]
        cards.append("\n".join(lines))
    path = folder / "4xH100-MIG.yaml"
    path.write_text('driver_version: "570.86.15"\ngpus:\n' + "\n".join(cards) + "\n")
    return path


def make_cap_nodes(dev_root: Path) -> None:
    """Every capability node the MIG cards could name: 15 GPU instances of 8 compute instances
    each, per card in MIG mode."""
    caps = dev_root / "dev" / "nvidia-caps"
    caps.mkdir(parents=True, exist_ok=True)
    for card in range(2):
        for gi in range(15):
            for ci in range(8):
                for minor in mig_cap_minors(card, gi, ci):
                    path = caps / f"nvidia-cap{minor}"
                    if not path.exists():
                        os.mknod(path, 0o666 | 0o020000, os.makedev(_CAPS_MAJOR, minor))


def mig_dra_cluster(bin_dir: Path, out_dir: Path) -> tuple[Cluster, DraDriver]:
    """The DRA cluster with DRAPartitionableDevices on (alpha in 1.35, on by default from
    1.36: dynamic MIG needs it), and its driver serving the MIG node written into the run
    folder."""
    cluster = Cluster(
        bin_dir=bin_dir,
        out_dir=out_dir,
        feature_gates={**FEATURE_GATES, "DRAPartitionableDevices": True},
        containerd_bin_dir=containerd_bin_dir(),
    )
    return cluster, DraDriver(cluster, str(write_mig_spec(cluster.run_dir)), devices=MIG_DEVICES)
