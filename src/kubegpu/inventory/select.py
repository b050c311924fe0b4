"""Choosing a GPU backend from settings: the one place that decides between NVML and the fake.

``auto`` never falls back to the fake: a real node whose NVML is broken must fail loudly, not
advertise invented GPUs to the scheduler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from kubegpu.core.backend import GpuBackend, InventoryError
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.inventory.nvml import NvmlBackend

BackendKind = Literal["auto", "nvml", "fake"]
BACKEND_KINDS: tuple[BackendKind, ...] = ("auto", "nvml", "fake")


def mig_state_beside(control_socket: Path) -> Path:
    """Where a fake node keeps its MIG layout: beside its control socket."""
    return control_socket.with_name(control_socket.name + ".mig-state.json")


def open_backend(
    kind: BackendKind,
    *,
    fake_gpus: str | None = None,
    fake_control: Path | None = None,
) -> GpuBackend:
    """An initialised backend of ``kind``.

    Raises :class:`InventoryError` when NVML cannot be used (``auto``/``nvml``),
    :class:`~kubegpu.inventory.spec.FakeSpecError` for a bad fake spec, and ``ValueError`` for
    settings that do not fit together (``fake`` without ``fake_gpus``, an unknown kind).
    """
    if kind == "fake":
        if not fake_gpus:
            raise ValueError("--backend fake needs --fake-gpus (a preset name or a YAML file)")
        # MIG changes made over the control socket outlive a restart, as on a real card: they
        # are kept beside the socket.
        mig_state = None if fake_control is None else mig_state_beside(fake_control)
        return FakeGpuBackend.from_spec(fake_gpus, control_socket=fake_control, mig_state=mig_state)
    if kind not in ("auto", "nvml"):
        raise ValueError(
            f"unknown GPU backend {kind!r} (expected one of {', '.join(BACKEND_KINDS)})"
        )
    if fake_gpus or fake_control:
        raise ValueError("--fake-gpus and --fake-control only apply to --backend fake")
    backend = NvmlBackend()
    try:
        backend.init()
    except InventoryError as exc:
        if kind == "nvml":
            raise
        raise InventoryError(
            f"no NVIDIA GPU or NVML found on this node ({exc.message})",
            f"{exc.hint}; for development without a GPU use --backend fake --fake-gpus PRESET",
        ) from exc
    return backend
