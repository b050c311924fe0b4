"""NVIDIA's opaque ``GpuConfig`` (``resource.nvidia.com/v1beta1``), as a claim carries it.

A claim (or its DeviceClass) may hand a driver opaque ``parameters``; NVIDIA's driver reads a
``GpuConfig`` there whose ``sharing`` asks for time-slicing or MPS with limits. Its claims run
unchanged against kubegpu under NVIDIA's naming, so the DRA driver must read this format, and
under either naming a config for our driver is never dropped unread. This module owns the
format and nothing else: :func:`gpu_sharing` turns ``parameters`` into a
:class:`~kubegpu.core.dra.TimeSlicing` or :class:`~kubegpu.core.dra.MpsSharing`; what kubegpu
does with it is the DRA driver's business (``dra/claim_configs.py``).

Read strictly, as NVIDIA's ``StrictDecoder`` reads it for a claim: an unknown kind, version or
field, or a value its ``Validate`` refuses, is a :class:`GpuConfigError` naming it. A field we
skipped would be a setting silently ignored. Pure: JSON in, values out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubegpu.core.dra import (
    DEFAULT_TIME_SLICE,
    GPU_CONFIG_API_VERSION,
    GPU_CONFIG_KIND,
    MpsSharing,
    TimeSlicing,
)
from kubegpu.sharing.resources import RequestError, parse_quantity

TIME_SLICE_INTERVALS = (DEFAULT_TIME_SLICE, "Short", "Medium", "Long")
STRATEGY_TIME_SLICING = "TimeSlicing"
STRATEGY_MPS = "MPS"

_TOP_FIELDS = frozenset({"apiVersion", "kind", "sharing"})
_SHARING_FIELDS = frozenset({"strategy", "timeSlicingConfig", "mpsConfig"})
_TIME_SLICING_FIELDS = frozenset({"interval"})
_MPS_FIELDS = frozenset(
    {
        "defaultActiveThreadPercentage",
        "defaultPinnedDeviceMemoryLimit",
        "defaultPerDevicePinnedMemoryLimit",
        "multiUser",
    }
)


class GpuConfigError(ValueError):
    """``parameters`` are not a GpuConfig we can read; the message names the field."""


def kind_of(parameters: Any) -> str:
    """``<apiVersion> <kind>`` as written, for messages (``?`` for what is missing)."""
    if not isinstance(parameters, Mapping):
        return "parameters"
    named = (parameters.get(k) for k in ("apiVersion", "kind"))
    return " ".join(v if isinstance(v, str) and v else "?" for v in named)


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise GpuConfigError(f"{where} is a {type(value).__name__}, not an object")
    return value


def _known(value: Mapping[str, Any], fields: frozenset[str], where: str) -> None:
    unknown = sorted(str(k) for k in value if k not in fields)
    if unknown:
        raise GpuConfigError(
            f"{where}{unknown[0]} is not a field of {GPU_CONFIG_KIND} {GPU_CONFIG_API_VERSION}"
        )


def _bytes(value: Any, where: str) -> int:
    try:
        amount = int(parse_quantity(value))
    except RequestError as exc:
        raise GpuConfigError(f"{where}: {exc}") from None
    # NVIDIA's driver hands MPS whole MiB and refuses a limit that rounds to none.
    if amount < 2**20:
        raise GpuConfigError(f"{where} {value!r:.40} is less than 1Mi")
    return amount


def _time_slicing(sharing: Mapping[str, Any]) -> TimeSlicing:
    if sharing.get("mpsConfig") is not None:
        raise GpuConfigError("sharing.mpsConfig cannot go with strategy TimeSlicing")
    raw = sharing.get("timeSlicingConfig")
    if raw is None:
        return TimeSlicing()
    config = _object(raw, "sharing.timeSlicingConfig")
    _known(config, _TIME_SLICING_FIELDS, "sharing.timeSlicingConfig.")
    interval = config.get("interval")
    if interval is None:
        return TimeSlicing()
    if interval not in TIME_SLICE_INTERVALS:
        raise GpuConfigError(
            f"sharing.timeSlicingConfig.interval {interval!r:.40} is not one of "
            + ", ".join(TIME_SLICE_INTERVALS)
        )
    return TimeSlicing(str(interval))


def _mps(sharing: Mapping[str, Any]) -> MpsSharing:
    if sharing.get("timeSlicingConfig") is not None:
        raise GpuConfigError("sharing.timeSlicingConfig cannot go with strategy MPS")
    raw = sharing.get("mpsConfig")
    if raw is None:
        return MpsSharing()
    config = _object(raw, "sharing.mpsConfig")
    _known(config, _MPS_FIELDS, "sharing.mpsConfig.")
    percentage = config.get("defaultActiveThreadPercentage")
    # bool is an int in Python; Go's decoder takes neither it nor 50.0 for an int.
    if percentage is not None and (type(percentage) is not int or not 1 <= percentage <= 100):
        raise GpuConfigError(
            f"sharing.mpsConfig.defaultActiveThreadPercentage {percentage!r:.40} is not a "
            "whole number from 1 to 100"
        )
    memory = config.get("defaultPinnedDeviceMemoryLimit")
    per_device_raw = config.get("defaultPerDevicePinnedMemoryLimit")
    where = "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit"
    per_device = _object(per_device_raw, where) if per_device_raw is not None else {}
    multi_user = config.get("multiUser")
    if multi_user is not None and not isinstance(multi_user, bool):
        raise GpuConfigError(
            f"sharing.mpsConfig.multiUser is a {type(multi_user).__name__}, not a boolean"
        )
    return MpsSharing(
        active_thread_percentage=percentage,
        pinned_memory_bytes=(
            None
            if memory is None
            else _bytes(memory, "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit")
        ),
        per_device_pinned_memory_bytes=tuple(
            (str(key), _bytes(value, f"{where}[{key}]")) for key, value in per_device.items()
        ),
        multi_user=bool(multi_user),
    )


def gpu_sharing(parameters: Any) -> TimeSlicing | MpsSharing | None:
    """The sharing a GpuConfig's ``parameters`` ask for; None for a GpuConfig without
    ``sharing`` (NVIDIA's default: the GPU as it is). Raises :class:`GpuConfigError`."""
    top = _object(parameters, "parameters")
    api, kind = top.get("apiVersion"), top.get("kind")
    if (api, kind) != (GPU_CONFIG_API_VERSION, GPU_CONFIG_KIND):
        raise GpuConfigError(
            f"kind {kind!r:.60} of apiVersion {api!r:.60} is not a config kubegpu reads (it "
            f"reads {GPU_CONFIG_KIND} of {GPU_CONFIG_API_VERSION}; it has no MIG, VFIO or "
            "ComputeDomain devices)"
        )
    _known(top, _TOP_FIELDS, "")
    if top.get("sharing") is None:
        return None
    sharing = _object(top["sharing"], "sharing")
    _known(sharing, _SHARING_FIELDS, "sharing.")
    strategy = sharing.get("strategy")
    if strategy == STRATEGY_TIME_SLICING:
        return _time_slicing(sharing)
    if strategy == STRATEGY_MPS:
        return _mps(sharing)
    raise GpuConfigError(
        f"sharing.strategy {strategy!r:.40} is not {STRATEGY_TIME_SLICING} or {STRATEGY_MPS}"
    )
