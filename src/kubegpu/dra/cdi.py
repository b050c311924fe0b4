"""Per-claim CDI specs: what a container that uses a prepared claim gets from the runtime.

One spec file per claim (``<cdi_dir>/kubegpu-dra-<claim uid>.json``) holding one CDI device per
allocated GPU, named ``<claim uid>-<device>``, so the kubelet can hand the runtime fully qualified
names (``<kind>=<name>``) and Unprepare can remove exactly that claim's file. The kind is our own
(default ``<driver>/claim``) so it never clashes with nvidia-ctk's ``nvidia.com/gpu`` spec or the
device plugin's. Each device's environment and mounts are the share contract
(:func:`kubegpu.sharing.contract.share_contract`), the device plugin's too: a share's memory and
compute under the same names (docs/sharing.md), its share ID, and with ``enforcement: mps`` the
MPS client's pipe and log folders (mounted) and its per-client limits, so the driver's MPS
daemon holds it to its share. The spec is a property of the claim, not of a container: every
container that uses the claim resolves the same device, so a claim is one share however many
containers use it. A claim of several requests on different cards has one more device,
``<claim uid>-claim``, the environment of a container naming the whole claim
(:func:`needs_whole_claim_device`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubegpu.atomic_file import write_atomically
from kubegpu.config.model import Dra
from kubegpu.core.container import CONTROL_DEVICE_NODES, host_path
from kubegpu.core.gpu import GpuDevice, MigDevice
from kubegpu.sharing.contract import Grant, ShareContract, ShareSettings, share_contract

CDI_VERSION = "0.6.0"

# The config's defaults: shares are accounted, not enforced (no MPS).
UNENFORCED: ShareSettings = Dra()


@dataclass(frozen=True)
class ClaimDevice:
    """One allocated GPU of a claim, resolved against the inventory."""

    name: str  # the device's name in the slice, e.g. "gpu-0"
    gpu: GpuDevice
    share_id: str | None = None
    memory_bytes: int | None = None
    compute_milli: int | None = None
    # The claim's requests that got this device (a container may name one request, and then
    # only that request's devices are injected): empty = one request for the whole claim.
    requests: frozenset[str] = frozenset()
    # The MIG device this is, on ``gpu`` (its parent card); None for a card or a share of one.
    mig: MigDevice | None = None

    @property
    def is_share(self) -> bool:
        return self.memory_bytes is not None or self.compute_milli is not None


# The claim's own CDI device (``<claim uid>-claim``): slice devices are ``gpu-<index>``.
WHOLE_CLAIM_DEVICE = "claim"


def default_kind(driver: str) -> str:
    return f"{driver}/claim"


def cdi_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def qualified_name(kind: str, claim_uid: str, device: str) -> str:
    return f"{kind}={cdi_device_name(claim_uid, device)}"


def _node(dev_root: str, path: str) -> dict[str, str]:
    entry = {"path": path}
    if dev_root not in ("", "/"):
        entry["hostPath"] = host_path(dev_root, path)
    return entry


def devices_together(device: ClaimDevice, devices: Sequence[ClaimDevice]) -> list[ClaimDevice]:
    """The devices a container that names ``device``'s request gets with it, in GPU index
    order: those of the claim that share a request with it. The runtime sets each CDI device's
    environment in turn, the last value winning, so every device of a request must name all of
    them, or a container of a two-GPU claim would be told of one GPU only. A container naming
    the whole claim is told by the claim's own CDI device (:func:`needs_whole_claim_device`)."""
    together = [
        d
        for d in devices
        if d.name == device.name
        or not (d.requests or device.requests)
        or d.requests & device.requests
    ]
    return sorted(together, key=lambda d: d.gpu.index)


def needs_whole_claim_device(devices: Sequence[ClaimDevice]) -> bool:
    """Whether a container naming the whole claim must be told more than any one request's
    devices tell: the claim has several requests on different cards. It then gets one more
    CDI device, ``<claim uid>-claim``, injected last (the driver answers it last under a
    request no container can name, :data:`kubegpu.core.dra.WHOLE_CLAIM_REQUEST`), whose
    environment names every card of the claim; a container naming one request never gets
    it, and keeps being told of that request's cards only."""
    return any(len(devices_together(d, devices)) < len(devices) for d in devices)


def _grant(device: ClaimDevice) -> Grant:
    memory_mib = device.memory_bytes // 2**20 if device.memory_bytes is not None else None
    # A MIG device is named by its own UUID (NVIDIA_VISIBLE_DEVICES=MIG-…), as NVIDIA's
    # container toolkit expects; its index stays the parent card's.
    uuid = device.mig.uuid if device.mig is not None else device.gpu.uuid
    return Grant(uuid, device.gpu.index, memory_mib, device.compute_milli, device.share_id)


def device_contract(
    device: ClaimDevice,
    shares: ShareSettings = UNENFORCED,
    together: Sequence[ClaimDevice] | None = None,
) -> ShareContract:
    """What a container that gets ``device`` is told under ``shares`` (the config's ``dra``
    section); ``together``: the devices it comes with (:func:`devices_together`), itself
    alone by default. The GPU list and MPS's per-GPU memory limits name all of them; the
    share's own limits (``KUBEGPU_GPU_*``) are this device's."""
    return share_contract(
        _grant(device), shares, together=[_grant(d) for d in together or [device]]
    )


def _device_edits(
    device: ClaimDevice, dev_root: str, shares: ShareSettings, together: Sequence[ClaimDevice]
) -> dict[str, Any]:
    told = device_contract(device, shares, together)
    edits: dict[str, Any] = {
        "deviceNodes": [
            _node(dev_root, path)
            for path in (
                device.mig.device_nodes if device.mig is not None else (device.gpu.device_node,)
            )
        ],
        "env": [f"{key}={value}" for key, value in told.env.items()],
    }
    if told.mounts:
        # The MPS client talks to the daemon through these folders: the same path inside.
        edits["mounts"] = [
            {"hostPath": d, "containerPath": d, "options": ["rbind", "rw"]} for d in told.mounts
        ]
    return edits


def claim_spec(
    claim_uid: str,
    devices: Sequence[ClaimDevice],
    kind: str,
    dev_root: str = "/",
    shares: ShareSettings = UNENFORCED,
) -> dict[str, Any]:
    """The CDI spec of a claim; ``shares``: the config's ``dra`` section (enforcement, MPS)."""
    entries = [
        {
            "name": cdi_device_name(claim_uid, d.name),
            "containerEdits": _device_edits(d, dev_root, shares, devices_together(d, devices)),
        }
        for d in devices
    ]
    if needs_whole_claim_device(devices):
        # Environment only: the cards' nodes and mounts come with their own devices. The
        # share figures are the last device's, as they would be without it.
        everything = sorted(devices, key=lambda d: d.gpu.index)
        told = device_contract(devices[-1], shares, everything)
        entries.append(
            {
                "name": cdi_device_name(claim_uid, WHOLE_CLAIM_DEVICE),
                "containerEdits": {"env": [f"{k}={v}" for k, v in told.env.items()]},
            }
        )
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": entries,
        "containerEdits": {"deviceNodes": [_node(dev_root, p) for p in CONTROL_DEVICE_NODES]},
    }


def spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    return cdi_dir / f"kubegpu-dra-{claim_uid}.json"


def write_claim_spec(cdi_dir: Path, claim_uid: str, spec: dict[str, Any]) -> Path:
    target = spec_path(cdi_dir, claim_uid)
    write_atomically(target, json.dumps(spec, indent=2) + "\n", mode=0o644)
    return target


def remove_claim_spec(cdi_dir: Path, claim_uid: str) -> bool:
    """True when a spec was there to remove (Unprepare of a never-prepared claim is fine)."""
    try:
        spec_path(cdi_dir, claim_uid).unlink()
    except FileNotFoundError:
        return False
    return True
