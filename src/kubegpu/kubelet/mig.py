"""Which resource each MIG device is advertised under: NVIDIA's MIG strategies
(``flags.migStrategy``), as its device plugin applies them.

``none``: a card in MIG mode is a whole GPU like any other, its MIG devices are not advertised.
``single``: the MIG devices take their card's place in its resource (``nvidia.com/gpu``), which
needs a uniform node: every card in MIG mode, each with MIG devices, all of one type; anything
else stops the agent with NVIDIA's message. ``mixed``: one resource per profile
(``nvidia.com/mig-1g.10gb``, ``nvidia.com/mig-3g.40gb``), beside the cards not in MIG mode. Under
both, a card in MIG mode is neither a whole GPU nor a card to share (share slots, the
extender's inventory, the peers' figures). A MIG device's id is its ``MIG-…`` UUID.

Pure rules over the inventory; :mod:`~kubegpu.kubelet.resources` builds the plans from them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kubegpu.config.model import DEFAULT_VENDOR_DOMAIN
from kubegpu.core.gpu import GpuDevice, MigDevice
from kubegpu.core.mig import resource_suffix, whole_instance

# NVIDIA's device plugin's words (internal/rm/device_map.go), so that a search for the message
# finds NVIDIA's documentation as well as ours.
INVALID = "invalid MIG configuration: "
NOT_CONFIGURED = "at least one device with migEnabled=true was not configured correctly: "
# The longest resource name a profile of the cards known here makes under mixed (an H200's
# media-extension 1g), for checking that the socket folder can hold every socket's path.
LONGEST_MIXED_RESOURCE = f"{DEFAULT_VENDOR_DOMAIN}/mig-1g.18gb.me"


def in_mig_mode(strategy: str, gpu: GpuDevice) -> bool:
    """Whether ``gpu`` is advertised by its MIG devices rather than whole under ``strategy``."""
    return strategy != "none" and gpu.mig_enabled is True


def cards_outside_mig(strategy: str, gpus: Iterable[GpuDevice]) -> list[GpuDevice]:
    """The cards kubegpu hands out whole or shared: all but those in MIG mode (under
    ``single`` and ``mixed``), by index."""
    return sorted((g for g in gpus if not in_mig_mode(strategy, g)), key=lambda g: g.index)


def mixed_resource_name(mig: MigDevice) -> str | None:
    """``nvidia.com/mig-1g.10gb`` for a MIG device under ``mixed``; None for a compute instance
    smaller than its GPU instance (``1c.3g.40gb``), for which NVIDIA's plugin has no resource."""
    if not whole_instance(mig):
        return None
    return f"{DEFAULT_VENDOR_DOMAIN}/{resource_suffix(mig.profile)}"


def _kind(mig: MigDevice) -> tuple[object, ...]:
    """What NVIDIA compares to call two MIG devices one type: NVML's device attributes."""
    return (
        mig.profile,
        mig.compute_slices,
        mig.memory_total_mib,
        mig.multiprocessors,
        mig.copy_engines,
        mig.decoders,
        mig.encoders,
        mig.jpeg_engines,
        mig.ofa_engines,
    )


def single_layout_problem(gpus: Sequence[GpuDevice]) -> str:
    """Why the ``single`` strategy cannot serve this node, in NVIDIA's words and order ("" when
    it can; also when no card is in MIG mode: every card is then a whole GPU)."""
    cards = sorted(gpus, key=lambda g: g.index)
    in_mig = [g for g in cards if g.mig_enabled is True]
    if not in_mig:
        return ""
    for gpu in in_mig:
        if not gpu.mig_devices:
            return f"{INVALID}{NOT_CONFIGURED}device {gpu.index} has no MIG devices configured"
    if len({_kind(m) for g in in_mig for m in g.mig_devices}) > 1:
        return f"{INVALID}more than one MIG device type present on node"
    if len(in_mig) < len(cards):
        return "all devices on the node must be configured with the same migEnabled value"
    return ""
