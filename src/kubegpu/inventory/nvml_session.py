"""The one owner of NVML's initialisation in this process: every reader shares one session.

The inventory backend (:mod:`kubegpu.inventory.nvml`) and the metrics source
(:mod:`kubegpu.inventory.nvml_metrics`) both read through NVML; each :func:`acquire` s the
library when it starts and :func:`release` s it when it closes. The first acquire loads
``pynvml`` and calls ``nvmlInit``, the last release calls ``nvmlShutdown``, so one agent
running both (the DaemonSet's device plugin with ``--exporter``) initialises NVML once and
neither shuts it down under the other. Errors are translated here, once, into an
:class:`InventoryError` whose hint says what the admin should check.

Sessions are counted per module object, so a test's scripted stand-in for ``pynvml`` gets a
count of its own.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from kubegpu.core.backend import InventoryError

# Error codes meaning "this GPU or driver cannot answer that question": the field becomes None.
_UNSUPPORTED_ERRORS = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_NO_DATA",
    "NVML_ERROR_INVALID_ARGUMENT",
)
# Error codes meaning the GPU stopped answering (fell off the bus, or the driver lost it).
_LOST_ERRORS = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_UNKNOWN")

# (message, hint) per NVML error code name; the hint is what an admin should look at.
_ERROR_HINTS: dict[str, tuple[str, str]] = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": (
        "NVML library not found",
        "is the NVIDIA driver installed and the driver libraries mounted into this container? "
        "(libnvidia-ml.so.1; with the NVIDIA container toolkit set "
        "NVIDIA_DRIVER_CAPABILITIES=utility or use the nvidia runtime class)",
    ),
    "NVML_ERROR_DRIVER_NOT_LOADED": (
        "NVIDIA driver not loaded",
        "is the nvidia kernel module loaded (lsmod | grep nvidia) and /dev/nvidiactl present? "
        "check dmesg for driver load errors",
    ),
    "NVML_ERROR_NO_PERMISSION": (
        "no permission to query the GPU",
        "run the agent privileged or give it the /dev/nvidia* device nodes",
    ),
    "NVML_ERROR_GPU_IS_LOST": (
        "GPU is lost",
        "it stopped answering (Xid 79, fallen off the bus?); check dmesg; the GPU needs a reset "
        "or the node a reboot",
    ),
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        "NVML library and kernel driver versions differ",
        "the driver was upgraded without a reboot, or the container mounts libraries from "
        "another driver version; reboot or remount the host's driver libraries",
    ),
    "NVML_ERROR_RESET_REQUIRED": (
        "GPU requires a reset",
        "reset it with nvidia-smi -r -i <index> when idle, or reboot the node",
    ),
    "NVML_ERROR_CORRUPTED_INFOROM": (
        "GPU infoROM is corrupted",
        "the GPU needs service; check nvidia-smi -q and dmesg",
    ),
    "NVML_ERROR_INSUFFICIENT_POWER": (
        "GPU has insufficient power",
        "check that its power cables are connected",
    ),
    "NVML_ERROR_IRQ_ISSUE": ("NVIDIA driver interrupt problem", "check dmesg for NVRM errors"),
    "NVML_ERROR_UNINITIALIZED": (
        "NVML is not initialised",
        "a bug in kubegpu: the backend was used after close()",
    ),
    "NVML_ERROR_UNKNOWN": (
        "NVML reported an unknown error",
        "often a GPU that fell off the bus or a driver problem; check dmesg for Xid messages",
    ),
}


def _code(nvml: Any, name: str) -> int | None:
    value = getattr(nvml, name, None)
    return value if isinstance(value, int) else None


def _error_name(nvml: Any, exc: BaseException) -> str | None:
    value = getattr(exc, "value", None)
    for name in _ERROR_HINTS.keys() | set(_UNSUPPORTED_ERRORS) | {"NVML_ERROR_TIMEOUT"}:
        if value is not None and value == _code(nvml, name):
            return name
    return None


def translate_nvml_error(nvml: Any, exc: BaseException, doing: str) -> InventoryError:
    """An :class:`InventoryError` saying what failed and what to check."""
    name = _error_name(nvml, exc)
    if name in _ERROR_HINTS:
        message, hint = _ERROR_HINTS[name]
        return InventoryError(f"{message} while {doing}", hint)
    return InventoryError(f"NVML error while {doing}: {exc}", "check nvidia-smi and dmesg")


def load_pynvml() -> Any:
    """The ``pynvml`` module (nvidia-ml-py), or an :class:`InventoryError` saying how to get it."""
    try:
        import pynvml
    except ImportError as exc:
        raise InventoryError(
            "the NVML Python bindings are not installed",
            "install nvidia-ml-py (pip install nvidia-ml-py)",
        ) from exc
    return pynvml


_lock = threading.Lock()
# id(module) -> (module, number of holders); the module is kept so its id stays its own.
_holders: dict[int, tuple[Any, int]] = {}


def acquire(nvml: Any | None = None) -> Any:
    """Hold NVML: initialise it if nobody holds it yet, and return the module to call.

    ``nvml``: the ``pynvml`` module, or a stand-in for tests; loaded when ``None``.
    """
    module = load_pynvml() if nvml is None else nvml
    with _lock:
        held = _holders.get(id(module))
        if held is None:
            try:
                module.nvmlInit()
            except module.NVMLError as exc:
                raise translate_nvml_error(module, exc, "initialising NVML") from exc
            except OSError as exc:  # the library itself failed to load or map
                raise InventoryError(
                    f"cannot initialise NVML: {exc}",
                    "is the NVIDIA driver loaded and libnvidia-ml.so.1 visible "
                    "(container toolkit, NVIDIA_VISIBLE_DEVICES)?",
                ) from exc
            _holders[id(module)] = (module, 1)
        else:
            _holders[id(module)] = (module, held[1] + 1)
    return module


def release(module: Any) -> None:
    """Stop holding NVML; the last holder shuts it down. Releasing more than was acquired
    does nothing."""
    with _lock:
        held = _holders.get(id(module))
        if held is None:
            return
        if held[1] > 1:
            _holders[id(module)] = (module, held[1] - 1)
            return
        del _holders[id(module)]
        with contextlib.suppress(module.NVMLError):
            module.nvmlShutdown()


def holders(module: Any) -> int:
    """How many readers hold NVML through ``module`` now (0: not initialised by us)."""
    with _lock:
        held = _holders.get(id(module))
        return 0 if held is None else held[1]
