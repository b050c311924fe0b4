"""What a claim's opaque configs do to its devices: honoured where they map onto what kubegpu
does, otherwise the claim is refused with what to do instead; never dropped unread.

NVIDIA's claims carry a ``GpuConfig`` (decoded by ``kube/gpu_config.py``) asking for
time-slicing or MPS. Dropping it ran a pod that asked for a 50 % MPS limit with none. The map:

* no ``sharing``, or ``TimeSlicing`` with interval ``Default``: the GPU as it is. Containers
  sharing a card are time-sliced by CUDA's default scheduler, which is what ``Default`` asks.
* ``TimeSlicing`` with ``Short``, ``Medium`` or ``Long``: refused; kubegpu never sets a card's
  time slice (a setting of the whole card, for every claim on it).
* ``MPS``, under ``dra.enforcement: mps``: the claim's containers become clients of the
  driver's MPS daemon, held to the config's limits: ``defaultActiveThreadPercentage`` N is a
  compute limit of 10·N milli-cards, ``defaultPinnedDeviceMemoryLimit`` (or that card's
  ``defaultPerDevicePinnedMemoryLimit``) the memory limit. NVIDIA's driver makes them the
  defaults of an MPS daemon of the claim, i.e. limits of each client: the same thing. On a
  share they may only narrow it: a share's limits are what the allocator counted, and more
  would take from the card's other claims. Without a thread percentage a whole card's client
  may use all of it. ``multiUser`` is refused: the node's one daemon is not started so.
* ``MPS`` under ``dra.enforcement: none``: refused, there is no daemon to hold it.

Every config that applies to a device of ours is checked, overridden or not (an unreadable one
refuses the claim, as NVIDIA's strict decoder does); the one that applies, the claim's over its
class's, is the one honoured. Pure: values in, values out, :class:`ConfigRefused` for a no.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from kubegpu.core.dra import (
    DEFAULT_TIME_SLICE,
    ClaimAllocation,
    DeviceConfig,
    MpsSharing,
    TimeSlicing,
)
from kubegpu.dra import cdi
from kubegpu.dra.slices import COMPUTE_MILLI_PER_CARD
from kubegpu.sharing.contract import ShareSettings


class ConfigRefused(ValueError):
    """The claim's configs ask for what kubegpu cannot do; one line naming the config."""


def apply_configs(
    devices: Sequence[cdi.ClaimDevice], allocation: ClaimAllocation, shares: ShareSettings
) -> list[cdi.ClaimDevice]:
    """``devices`` (the claim's, merged per card) as the configs that apply to them make them;
    raises :class:`ConfigRefused`."""
    for unread in allocation.configs_in_use():
        if unread.problem is not None:
            raise ConfigRefused(
                f"{unread}: {unread.problem}; fix or remove it (kubegpu reads only "
                "GpuConfig sharing settings, docs/dra.md)"
            )
    out = []
    for device in devices:
        config = _config_of(device, allocation)
        if config is None or config.sharing is None:
            out.append(device)
        elif isinstance(config.sharing, TimeSlicing):
            _check_time_slicing(config, config.sharing)
            out.append(device)
        else:
            gpus = _config_gpus(config, allocation, devices)
            out.append(_mps_client(device, config, config.sharing, gpus, shares))
    return out


def _config_of(device: cdi.ClaimDevice, allocation: ClaimAllocation) -> DeviceConfig | None:
    """The config that applies to ``device``; one card holding results of several requests
    (shares merged into one CDI device) must have one config for all of them."""
    configs = {
        allocation.config_for(r.request) for r in allocation.devices if r.device == device.name
    }
    if len(configs) > 1:
        names = sorted(str(c) if c is not None else "none" for c in configs)
        raise ConfigRefused(
            f"{device.name} holds results of several requests under different configs "
            f"({', '.join(names)}): one card's containers get one setting; give those "
            "requests one config"
        )
    return configs.pop() if configs else None


def _check_time_slicing(config: DeviceConfig, sharing: TimeSlicing) -> None:
    if sharing.interval != DEFAULT_TIME_SLICE:
        raise ConfigRefused(
            f"{config}: sharing.timeSlicingConfig.interval {sharing.interval} is not "
            "supported: kubegpu does not set a card's time slice (containers sharing a card "
            "are time-sliced with CUDA's default); use interval Default, or MPS under "
            "dra.enforcement: mps"
        )


def _config_gpus(
    config: DeviceConfig, allocation: ClaimAllocation, devices: Sequence[cdi.ClaimDevice]
) -> list[str]:
    """The UUIDs of the devices ``config`` applies to, in allocation order: what an index in
    ``defaultPerDevicePinnedMemoryLimit`` counts (NVIDIA's driver counts the same)."""
    by_name = {d.name: d.gpu.uuid for d in devices}
    uuids: list[str] = []
    for result in allocation.devices:
        uuid = by_name.get(result.device)
        if allocation.config_for(result.request) == config and uuid and uuid not in uuids:
            uuids.append(uuid)
    return uuids


def _pinned_memory(
    device: cdi.ClaimDevice, config: DeviceConfig, sharing: MpsSharing, gpus: list[str]
) -> int | None:
    memory = sharing.pinned_memory_bytes
    for key, limit in sharing.per_device_pinned_memory_bytes:
        if key in gpus:
            uuid = key
        elif key.isdigit() and int(key) < len(gpus):
            uuid = gpus[int(key)]
        else:
            raise ConfigRefused(
                f"{config}: sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit names {key!r:.60}, "
                f"neither the UUID of a GPU it applies to nor an index below {len(gpus)}"
            )
        if uuid == device.gpu.uuid:
            memory = limit
    return memory


def _mib(n: int) -> str:
    return f"{n // 2**20}Mi"


def _milli(n: int) -> str:
    return f"{n} milli-cards"


def _narrowed(
    config: DeviceConfig,
    device: cdi.ClaimDevice,
    what: str,
    asked: int | None,
    share: int | None,
    show: Callable[[int], str],
) -> int | None:
    """The limit ``asked`` for, within the share's ``share``; the share's when none is."""
    if asked is None:
        return share
    if share is not None and asked > share:
        raise ConfigRefused(
            f"{config}: sharing.mpsConfig asks for {show(asked)} of {what} on {device.name}, "
            f"more than the claim's share ({show(share)}); ask for the share you need by "
            "capacity (capacity.requests.memory / compute), or a lower MPS limit"
        )
    return asked


def _mps_client(
    device: cdi.ClaimDevice,
    config: DeviceConfig,
    sharing: MpsSharing,
    gpus: list[str],
    shares: ShareSettings,
) -> cdi.ClaimDevice:
    if shares.enforcement != "mps":
        raise ConfigRefused(
            f"{config}: MPS requested by GpuConfig, but this driver runs dra.enforcement: "
            f"{shares.enforcement} (no MPS daemon); set dra.enforcement: mps on the driver, or "
            "ask for a share by capacity (capacity.requests.memory / compute; accounted, not "
            "enforced, under none)"
        )
    if sharing.multi_user:
        raise ConfigRefused(
            f"{config}: sharing.mpsConfig.multiUser is not supported: the driver runs one MPS "
            "daemon per node for all its claims; remove it"
        )
    percentage = sharing.active_thread_percentage
    asked_compute = None if percentage is None else percentage * 10
    compute = _narrowed(config, device, "compute", asked_compute, device.compute_milli, _milli)
    asked_memory = _pinned_memory(device, config, sharing, gpus)
    memory = _narrowed(config, device, "memory", asked_memory, device.memory_bytes, _mib)
    if memory is None and compute is None:
        # MPS with no limit on a whole card: still a client of the daemon (the contract makes
        # one of a share), which may use all of the card.
        compute = COMPUTE_MILLI_PER_CARD
    return replace(device, memory_bytes=memory, compute_milli=compute)
