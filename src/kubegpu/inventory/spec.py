"""Fake GPU node descriptions: the YAML format, its validation, and the shipped presets.

A spec describes what NVML would report for a node (the same fields as
:class:`~kubegpu.core.gpu.GpuDevice` plus the pairwise topology), so the fake backend can stand
in for a real node in tests, demos and the simulator. Validation is strict and every error names
the file, the field and the bad value: a typo in a spec must not quietly produce a different
node than the one the author meant.

Format::

    description: DGX A100-like node              # optional
    driver_version: "535.161.08"                  # optional
    cuda_driver_version: "12.2"                   # optional
    gpus:
      - index: 0                                  # unique, 0..n-1
        uuid: GPU-5d1a5c8b-0e3a-4b9a-8f6e-2b1c7f0a9d31
        product_name: NVIDIA A100-SXM4-80GB
        memory_total_mib: 81920
        compute_capability: "8.0"                 # optional, "8.0" or [8, 0]
        pci_bus_id: "00000000:07:00.0"
        minor_number: 0                           # optional, default = index
        numa_node: 0                              # optional
        mig_enabled: false                        # optional
        mig_instances:                            # optional, needs mig_enabled: true
          - {profile: 3g.40gb, start: 0}          # a profile of the card, its memory slice
        brand: Nvidia                             # optional, NVML's brand as go-nvlib names it
        architecture: Ampere                      # optional, default from compute_capability
        pcie_root: pci0000:00                     # optional, the PCIe root complex (sysfs name)
    topology:                                     # optional
      default: {nvlinks: 12}                      # optional, for every pair not listed
      pairs:
        - {gpus: [0, 1], pcie: PXB, nvlinks: 12}

Every pair of GPUs gets a link: ``pcie`` comes from the pair entry, else ``default.pcie``, else
from NUMA placement (same node: ``NODE``, otherwise ``SYS``); ``nvlinks`` from the pair entry,
else ``default.nvlinks``, else 0.
"""

from __future__ import annotations

import importlib.resources
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from kubegpu.core import mig as mig_profiles
from kubegpu.core.gpu import (
    GpuDevice,
    GpuLink,
    GpuUuid,
    NodeInventory,
    PcieLink,
    architecture_of,
)

PRESET_PACKAGE = "kubegpu.inventory.presets"

_TOP_FIELDS = frozenset(
    {"description", "driver_version", "cuda_driver_version", "gpus", "topology"}
)
_GPU_REQUIRED = ("index", "uuid", "product_name", "memory_total_mib", "pci_bus_id")
_GPU_FIELDS = frozenset(
    {
        *_GPU_REQUIRED,
        "minor_number",
        "compute_capability",
        "numa_node",
        "mig_enabled",
        "mig_instances",
        "brand",
        "architecture",
        "pcie_root",
    }
)
_TOPOLOGY_FIELDS = frozenset({"default", "pairs"})
_LINK_FIELDS = frozenset({"pcie", "nvlinks"})
_PAIR_FIELDS = frozenset({"gpus", *_LINK_FIELDS})
# NVML's own format: 8 hex digits of domain (older drivers print 4), bus, device, function.
_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
# sysfs's name of a PCIe root complex: "pci" + domain + ":" + bus, lower case.
_PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_UUID = re.compile(
    r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)


class FakeSpecError(ValueError):
    """A fake GPU spec is missing, unreadable or invalid; the message names file, field, value."""


@dataclass(frozen=True)
class FakeGpuSpec:
    """A validated fake node: what the fake backend reports, and where it came from."""

    name: str  # preset name or file stem
    source: str  # "preset:<name>" or the file path, for messages
    inventory: NodeInventory
    description: str = ""


def list_presets() -> list[str]:
    """Names of the specs shipped with the package, sorted."""
    folder = importlib.resources.files(PRESET_PACKAGE)
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    )


def resolve_fake_spec(name_or_path: str | Path) -> FakeGpuSpec:
    """Load a preset by name (``8xA100-80GB-NVLink``) or a spec from a YAML file path."""
    text = str(name_or_path)
    if isinstance(name_or_path, str) and text in list_presets():
        resource = importlib.resources.files(PRESET_PACKAGE).joinpath(f"{text}.yaml")
        return parse_fake_spec(
            resource.read_text(encoding="utf-8"), name=text, source=f"preset:{text}"
        )
    path = Path(name_or_path)
    if not path.is_file():
        raise FakeSpecError(
            f"{text}: neither a preset nor a readable file (presets: {', '.join(list_presets())})"
        )
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FakeSpecError(f"{path}: cannot read: {exc}") from exc
    return parse_fake_spec(content, name=path.stem, source=str(path))


def parse_fake_spec(text: str, *, name: str, source: str) -> FakeGpuSpec:
    """Validate a spec's YAML text; ``source`` is used in error messages."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FakeSpecError(f"{source}: not valid YAML: {exc}") from exc
    return _Parser(source).spec(data, name)


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, value: object, why: str) -> FakeSpecError:
        return FakeSpecError(f"{self.source}: {field}: {why} (got {value!r})")

    def mapping(self, field: str, value: object, allowed: frozenset[str]) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field, value, "expected a mapping")
        for key in value:
            if key not in allowed:
                raise self.fail(
                    f"{field}.{key}" if field else str(key),
                    value[key],
                    f"unknown field (allowed: {', '.join(sorted(allowed))})",
                )
        return value

    def integer(self, field: str, value: object, *, minimum: int | None = None) -> int:
        # bool is an int in Python; "true" as a GPU index is a mistake, not 1.
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(field, value, "expected an integer")
        if minimum is not None and value < minimum:
            raise self.fail(field, value, f"must be at least {minimum}")
        return value

    def string(self, field: str, value: object) -> str:
        # YAML reads 12.4 or 535.161 unquoted as numbers; accept them as the text they spell.
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.fail(field, value, "expected a string")
        text = str(value).strip()
        if not text:
            raise self.fail(field, value, "must not be empty")
        return text

    def spec(self, data: object, name: str) -> FakeGpuSpec:
        top = self.mapping("", data, _TOP_FIELDS)
        if "gpus" not in top:
            raise self.fail("gpus", None, "required field is missing")
        raw_gpus = top["gpus"]
        if not isinstance(raw_gpus, list) or not raw_gpus:
            raise self.fail("gpus", raw_gpus, "expected a non-empty list")
        gpus = [self.gpu(f"gpus[{i}]", raw) for i, raw in enumerate(raw_gpus)]
        self.check_unique(gpus)
        gpus.sort(key=lambda gpu: gpu.index)
        links = self.topology(top.get("topology"), gpus)
        optional = {
            key: self.string(key, top[key])
            for key in ("description", "driver_version", "cuda_driver_version")
            if top.get(key) is not None
        }
        inventory = NodeInventory(
            gpus=tuple(gpus),
            links=links,
            driver_version=optional.get("driver_version"),
            cuda_driver_version=optional.get("cuda_driver_version"),
        )
        return FakeGpuSpec(
            name=name,
            source=self.source,
            inventory=inventory,
            description=optional.get("description", ""),
        )

    def gpu(self, field: str, raw: object) -> GpuDevice:
        entry = self.mapping(field, raw, _GPU_FIELDS)
        for key in _GPU_REQUIRED:
            if key not in entry:
                raise self.fail(f"{field}.{key}", None, "required field is missing")
        index = self.integer(f"{field}.index", entry["index"], minimum=0)
        uuid = self.string(f"{field}.uuid", entry["uuid"])
        if not _UUID.match(uuid):
            raise self.fail(f"{field}.uuid", uuid, "expected NVML's form GPU-xxxxxxxx-xxxx-…")
        bus_id = self.string(f"{field}.pci_bus_id", entry["pci_bus_id"])
        if not _BUS_ID.match(bus_id):
            raise self.fail(
                f"{field}.pci_bus_id", bus_id, "expected a PCI address like 00000000:07:00.0"
            )
        numa = entry.get("numa_node")
        mig = entry.get("mig_enabled")
        if mig is not None and not isinstance(mig, bool):
            raise self.fail(f"{field}.mig_enabled", mig, "expected true or false")
        capability = self.compute_capability(
            f"{field}.compute_capability", entry.get("compute_capability")
        )
        pcie_root = entry.get("pcie_root")
        if pcie_root is not None:
            pcie_root = self.string(f"{field}.pcie_root", pcie_root)
            if not _PCIE_ROOT.match(pcie_root):
                raise self.fail(
                    f"{field}.pcie_root", pcie_root, "expected sysfs's form such as pci0000:64"
                )
        brand = entry.get("brand")
        architecture = entry.get("architecture")
        gpu = GpuDevice(
            index=index,
            uuid=GpuUuid(uuid),
            product_name=self.string(f"{field}.product_name", entry["product_name"]),
            memory_total_mib=self.integer(
                f"{field}.memory_total_mib", entry["memory_total_mib"], minimum=1
            ),
            pci_bus_id=bus_id.upper(),
            minor_number=self.integer(
                f"{field}.minor_number", entry.get("minor_number", index), minimum=0
            ),
            compute_capability=capability,
            numa_node=None if numa is None else self.integer(f"{field}.numa_node", numa, minimum=0),
            mig_enabled=mig,
            brand=None if brand is None else self.string(f"{field}.brand", brand),
            architecture=(
                architecture_of(capability)
                if architecture is None
                else self.string(f"{field}.architecture", architecture)
            ),
            pcie_root=pcie_root,
        )
        return self.mig_instances(field, gpu, entry.get("mig_instances"))

    def mig_instances(self, field: str, gpu: GpuDevice, raw: object) -> GpuDevice:
        """The card with the GPU instances the spec lists (GPU-instance ids 1, 2, … in the
        listed order, one compute instance each), checked against the card's profile table."""
        if raw is None:
            return gpu
        field = f"{field}.mig_instances"
        if not isinstance(raw, list):
            raise self.fail(field, raw, "expected a list of {profile, start}")
        if raw and gpu.mig_enabled is not True:
            raise self.fail(field, raw, "GPU instances need mig_enabled: true")
        placed: list[mig_profiles.Instance] = []
        for position, item in enumerate(raw):
            where = f"{field}[{position}]"
            entry = self.mapping(where, item, frozenset({"profile", "start"}))
            name = self.string(f"{where}.profile", entry.get("profile"))
            try:
                chosen = mig_profiles.profile(gpu.product_name, name)
            except mig_profiles.MigError as exc:
                raise self.fail(f"{where}.profile", name, str(exc)) from None
            start = self.integer(f"{where}.start", entry.get("start"), minimum=0)
            instance = mig_profiles.Instance(chosen, start)
            problem = mig_profiles.layout_problem([*placed, instance])
            if problem:
                raise self.fail(where, item, problem)
            placed.append(instance)
        ids = {id(instance): gi for gi, instance in enumerate(placed, start=1)}
        ordered = sorted(placed, key=lambda instance: instance.start)
        devices = tuple(
            mig_profiles.mig_device(
                gpu,
                instance,
                index=position,
                gpu_instance_id=ids[id(instance)],
                uuid=mig_profiles.fake_mig_uuid(gpu.uuid, ids[id(instance)], 0),
            )
            for position, instance in enumerate(ordered)
        )
        return replace(gpu, mig_devices=devices)

    def compute_capability(self, field: str, value: object) -> tuple[int, int] | None:
        if value is None:
            return None
        if isinstance(value, list) and len(value) == 2:
            return (
                self.integer(field, value[0], minimum=1),
                self.integer(field, value[1], minimum=0),
            )
        if isinstance(value, str | float) and not isinstance(value, bool):
            match = re.fullmatch(r"(\d+)\.(\d+)", str(value).strip())
            if match:
                return (int(match.group(1)), int(match.group(2)))
        raise self.fail(field, value, 'expected "major.minor" such as "8.0", or [8, 0]')

    def check_unique(self, gpus: list[GpuDevice]) -> None:
        for attribute in ("index", "uuid", "pci_bus_id", "minor_number"):
            seen: set[object] = set()
            for position, gpu in enumerate(gpus):
                value = getattr(gpu, attribute)
                if value in seen:
                    raise self.fail(f"gpus[{position}].{attribute}", value, "duplicate value")
                seen.add(value)
        indices = sorted(gpu.index for gpu in gpus)
        if indices != list(range(len(gpus))):
            raise self.fail("gpus[].index", indices, f"indices must be 0..{len(gpus) - 1}")

    def link_fields(
        self, field: str, entry: Mapping[str, Any]
    ) -> tuple[PcieLink | None, int | None]:
        pcie: PcieLink | None = None
        if entry.get("pcie") is not None:
            level = self.string(f"{field}.pcie", entry["pcie"]).upper()
            if level not in PcieLink.__members__:
                raise self.fail(
                    f"{field}.pcie",
                    entry["pcie"],
                    f"expected one of {', '.join(PcieLink.__members__)}",
                )
            pcie = PcieLink[level]
        nvlinks = None
        if entry.get("nvlinks") is not None:
            nvlinks = self.integer(f"{field}.nvlinks", entry["nvlinks"], minimum=0)
        return pcie, nvlinks

    def topology(
        self, raw: object, gpus: list[GpuDevice]
    ) -> dict[tuple[GpuUuid, GpuUuid], GpuLink]:
        section = self.mapping("topology", raw if raw is not None else {}, _TOPOLOGY_FIELDS)
        default_pcie, default_nvlinks = (None, None)
        if section.get("default") is not None:
            default_pcie, default_nvlinks = self.link_fields(
                "topology.default",
                self.mapping("topology.default", section["default"], _LINK_FIELDS),
            )
        explicit: dict[tuple[int, int], tuple[PcieLink | None, int | None]] = {}
        raw_pairs = section.get("pairs") or []
        if not isinstance(raw_pairs, list):
            raise self.fail("topology.pairs", raw_pairs, "expected a list")
        for position, raw_pair in enumerate(raw_pairs):
            field = f"topology.pairs[{position}]"
            pair = self.mapping(field, raw_pair, _PAIR_FIELDS)
            ends = pair.get("gpus")
            if not isinstance(ends, list) or len(ends) != 2:
                raise self.fail(f"{field}.gpus", ends, "expected two GPU indices")
            a = self.integer(f"{field}.gpus", ends[0], minimum=0)
            b = self.integer(f"{field}.gpus", ends[1], minimum=0)
            if a == b or a >= len(gpus) or b >= len(gpus):
                raise self.fail(
                    f"{field}.gpus", ends, f"expected two distinct indices below {len(gpus)}"
                )
            key = (min(a, b), max(a, b))
            if key in explicit:
                raise self.fail(f"{field}.gpus", ends, "pair listed twice")
            explicit[key] = self.link_fields(field, pair)
        links: dict[tuple[GpuUuid, GpuUuid], GpuLink] = {}
        for first, second in itertools.combinations(gpus, 2):
            pcie, nvlinks = explicit.get((first.index, second.index), (None, None))
            if pcie is None:
                pcie = default_pcie or _pcie_from_numa(first, second)
            if nvlinks is None:
                nvlinks = default_nvlinks or 0
            links[(first.uuid, second.uuid)] = GpuLink(pcie=pcie, nvlinks=nvlinks)
        return links


def _pcie_from_numa(a: GpuDevice, b: GpuDevice) -> PcieLink:
    same_node = a.numa_node is not None and a.numa_node == b.numa_node
    return PcieLink.NODE if same_node else PcieLink.SYS
