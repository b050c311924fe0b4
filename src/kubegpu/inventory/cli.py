"""``kubegpu discover`` (print the node's GPUs) and ``kubegpu fake-gpu`` (script a fake node).

Exit codes, the same for both: 0 success, 1 the backend or control socket is unavailable or
refused the command, 2 bad usage, a bad fake spec, or a --control path that is not a socket.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn, cast

import click

from kubegpu.config.model import MAX_XID
from kubegpu.core.backend import GpuBackend, InventoryError
from kubegpu.core.gpu import GpuDevice, NodeInventory, PcieLink
from kubegpu.inventory.fake import FakeControlError, FakeGpuBackend, send_fake_gpu_command
from kubegpu.inventory.select import BACKEND_KINDS, BackendKind, open_backend
from kubegpu.inventory.spec import FakeSpecError, list_presets

EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.command("discover")
@click.option(
    "--backend",
    "backend_kind",
    type=click.Choice(BACKEND_KINDS),
    default="auto",
    show_default=True,
    help="Where to read GPUs from; 'auto' is NVML and fails on a node without it.",
)
@click.option(
    "--fake-gpus",
    metavar="NAME|PATH",
    default=None,
    help=f"For --backend fake: a YAML spec file or a preset ({', '.join(list_presets())}).",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table: for people; json: every field, for scripts.",
)
def discover(backend_kind: str, fake_gpus: str | None, output: str) -> None:
    """Print the node's GPUs and the topology between them."""
    try:
        backend = open_backend(cast(BackendKind, backend_kind), fake_gpus=fake_gpus)
    except FakeSpecError as exc:
        _fail(str(exc), EXIT_USAGE)
    except ValueError as exc:
        _fail(str(exc), EXIT_USAGE)
    except InventoryError as exc:
        _fail(str(exc), EXIT_UNAVAILABLE)
    try:
        inventory = backend.snapshot()
    except InventoryError as exc:
        _fail(str(exc), EXIT_UNAVAILABLE)
    finally:
        backend.close()
    if output == "json":
        click.echo(json.dumps(inventory_as_json(inventory, backend), indent=2))
    else:
        click.echo(format_inventory_table(inventory, backend))


def _source(backend: GpuBackend) -> str:
    if isinstance(backend, FakeGpuBackend):
        return f"{backend.name} ({backend.spec.source})"
    return backend.name


def _capability(gpu: GpuDevice) -> str | None:
    cc = gpu.compute_capability
    return None if cc is None else f"{cc[0]}.{cc[1]}"


def inventory_as_json(inventory: NodeInventory, backend: GpuBackend) -> dict[str, Any]:
    """Everything the snapshot holds, as plain JSON (links once per pair, by index and UUID)."""
    links = []
    gpus = inventory.gpus
    for position, first in enumerate(gpus):
        for second in gpus[position + 1 :]:
            link = inventory.link(first.uuid, second.uuid)
            links.append(
                {
                    "gpus": [first.index, second.index],
                    "uuids": [first.uuid, second.uuid],
                    "pcie": None if link is None else link.pcie.name,
                    "nvlinks": None if link is None else link.nvlinks,
                }
            )
    return {
        "backend": backend.name,
        "source": backend.spec.source if isinstance(backend, FakeGpuBackend) else None,
        "driver_version": inventory.driver_version,
        "cuda_driver_version": inventory.cuda_driver_version,
        "gpus": [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "product_name": gpu.product_name,
                "memory_total_mib": gpu.memory_total_mib,
                "compute_capability": _capability(gpu),
                "pci_bus_id": gpu.pci_bus_id,
                "minor_number": gpu.minor_number,
                "device_node": gpu.device_node,
                "numa_node": gpu.numa_node,
                "mig_enabled": gpu.mig_enabled,
            }
            for gpu in gpus
        ],
        "links": links,
    }


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


_LEGEND = {
    PcieLink.SYS: "crosses the inter-socket link (QPI/UPI)",
    PcieLink.NODE: "within one NUMA node, across PCIe host bridges",
    PcieLink.PHB: "through one PCIe host bridge",
    PcieLink.PXB: "through several PCIe switches",
    PcieLink.PIX: "through one PCIe switch",
    PcieLink.BOARD: "on the same board",
}


def format_inventory_table(inventory: NodeInventory, backend: GpuBackend) -> str:
    """A GPU table and an ``nvidia-smi topo -m`` style matrix."""
    lines = [
        f"Backend: {_source(backend)}   Driver: {_or_dash(inventory.driver_version)}   "
        f"CUDA: {_or_dash(inventory.cuda_driver_version)}   GPUs: {len(inventory)}",
        "",
    ]
    if not len(inventory):
        return "\n".join([*lines, "No GPUs found."])
    mig = {True: "on", False: "off", None: "-"}
    rows = [["IDX", "UUID", "MODEL", "MEMORY MiB", "CC", "BUS ID", "NUMA", "MIG", "DEVICE"]]
    rows += [
        [
            str(gpu.index),
            gpu.uuid,
            gpu.product_name,
            str(gpu.memory_total_mib),
            _or_dash(_capability(gpu)),
            gpu.pci_bus_id,
            _or_dash(gpu.numa_node),
            mig[gpu.mig_enabled],
            gpu.device_node,
        ]
        for gpu in inventory
    ]
    lines += _table(rows)
    lines += ["", "Topology:"]
    header = ["", *(f"GPU{gpu.index}" for gpu in inventory), "NUMA"]
    matrix = [header]
    for first in inventory:
        row = [f"GPU{first.index}"]
        for second in inventory:
            if first.uuid == second.uuid:
                row.append("X")
                continue
            link = inventory.link(first.uuid, second.uuid)
            if link is None:
                row.append("?")
            elif link.nvlinks:
                row.append(f"NV{link.nvlinks}")
            else:
                row.append(link.pcie.name)
        row.append(_or_dash(first.numa_node))
        matrix.append(row)
    lines += _table(matrix)
    lines += ["", "Legend:", "  X     = self", "  NV#   = joined by # NVLink lanes"]
    lines += [f"  {level.name:<5} = {text}" for level, text in _LEGEND.items()]
    lines.append("  ?     = unknown")
    return "\n".join(lines)


@click.command("fake-gpu")
@click.argument("op", type=click.Choice(["xid", "lose", "restore", "status"]))
@click.option(
    "--control",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Control socket of the fake backend (the agent's --fake-control).",
)
@click.option("--gpu", default=None, metavar="INDEX|UUID", help="The GPU to act on.")
@click.option(
    "--xid",
    type=click.IntRange(0, MAX_XID),
    default=None,
    help="Xid code to inject (op xid).",
)
def fake_gpu(op: str, control: Path, gpu: str | None, xid: int | None) -> None:
    """Script a running fake GPU backend: inject an Xid, lose or restore a GPU, show status."""
    fields: dict[str, Any] = {}
    if op != "status":
        if gpu is None:
            _fail(f"fake-gpu {op} needs --gpu INDEX|UUID", EXIT_USAGE)
        fields["gpu"] = gpu
    if op == "xid":
        if xid is None:
            _fail("fake-gpu xid needs --xid N", EXIT_USAGE)
        fields["xid"] = xid
    if control.exists() and not control.is_socket():
        # Not a socket at all is the caller's mistake (2); a socket that is missing or that
        # nobody answers on means the backend is not running (1).
        _fail(f"--control {control} is not a unix socket (the agent's --fake-control)", EXIT_USAGE)
    try:
        reply = send_fake_gpu_command(control, op, **fields)
    except FakeControlError as exc:
        _fail(str(exc), EXIT_UNAVAILABLE)
    click.echo(json.dumps(reply))
    if not reply.get("ok"):
        _fail(str(reply.get("error", "command refused")), EXIT_UNAVAILABLE)
