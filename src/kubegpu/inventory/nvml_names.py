"""NVML's codes as the names NVIDIA's own software publishes them under.

The brand and architecture strings are NVIDIA's go-nvlib's (``GetBrandAsString``,
``GetArchitectureAsString``), the values NVIDIA's DRA driver publishes as the ``brand`` and
``architecture`` attributes: a CEL selector written for it matches ours. Read by
:mod:`kubegpu.inventory.nvml`, which owns NVML; apart only to keep that module one reading long.
"""

from __future__ import annotations

import re
from typing import Any

# NVML's brand and architecture codes, by the names of nvidia-ml-py's constants, as NVIDIA's
# go-nvlib spells them (GetBrandAsString / GetArchitectureAsString): the strings NVIDIA's DRA
# driver publishes, so a CEL selector written for it matches ours.
_BRAND_NAMES = {
    "NVML_BRAND_UNKNOWN": "Unknown",
    "NVML_BRAND_QUADRO": "Quadro",
    "NVML_BRAND_TESLA": "Tesla",
    "NVML_BRAND_NVS": "NVS",
    "NVML_BRAND_GRID": "Grid",
    "NVML_BRAND_GEFORCE": "GeForce",
    "NVML_BRAND_TITAN": "Titan",
    "NVML_BRAND_NVIDIA_VAPPS": "NvidiaVApps",
    "NVML_BRAND_NVIDIA_VPC": "NvidiaVPC",
    "NVML_BRAND_NVIDIA_VCS": "NvidiaVCS",
    "NVML_BRAND_NVIDIA_VWS": "NvidiaVWS",
    "NVML_BRAND_NVIDIA_CLOUD_GAMING": "NvidiaCloudGaming",
    "NVML_BRAND_QUADRO_RTX": "QuadroRTX",
    "NVML_BRAND_NVIDIA_RTX": "NvidiaRTX",
    "NVML_BRAND_NVIDIA": "Nvidia",
    "NVML_BRAND_GEFORCE_RTX": "GeForceRTX",
    "NVML_BRAND_TITAN_RTX": "TitanRTX",
}
_ARCHITECTURE_NAMES = {
    "NVML_DEVICE_ARCH_KEPLER": "Kepler",
    "NVML_DEVICE_ARCH_MAXWELL": "Maxwell",
    "NVML_DEVICE_ARCH_PASCAL": "Pascal",
    "NVML_DEVICE_ARCH_VOLTA": "Volta",
    "NVML_DEVICE_ARCH_TURING": "Turing",
    "NVML_DEVICE_ARCH_AMPERE": "Ampere",
    "NVML_DEVICE_ARCH_ADA": "Ada Lovelace",
    "NVML_DEVICE_ARCH_HOPPER": "Hopper",
    "NVML_DEVICE_ARCH_BLACKWELL": "Blackwell",
    "NVML_DEVICE_ARCH_RUBIN": "Rubin",
}


PCIE_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


def _named(nvml: Any, names: dict[str, str], code: object) -> str | None:
    """The name of NVML code ``code`` among ``names`` (constant name -> text); None for a
    code these bindings do not define."""
    for constant, text in names.items():
        if getattr(nvml, constant, None) == code:
            return text
    return None


def brand_name(nvml: Any, code: object) -> str | None:
    return _named(nvml, _BRAND_NAMES, code)


def architecture_name(nvml: Any, code: object) -> str | None:
    return _named(nvml, _ARCHITECTURE_NAMES, code)
