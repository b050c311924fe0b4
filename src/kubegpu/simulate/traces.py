"""Reading openb-style node and pod CSVs into placement-engine values.

Every malformed cell is reported as :class:`TraceError` naming file, line and column, so the
CLI can exit 2 with a message a person can act on.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kubegpu.placement.model import MILLI_PER_GPU, GpuState, NodeState, PodRequest

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(Exception):
    """A trace file is missing, lacks a column, or has a bad value."""

    def __init__(self, path: Path, line: int, column: str, message: str) -> None:
        where = f"{path}:{line}" + (f": column {column!r}" if column else "")
        super().__init__(f"{where}: {message}")
        self.path, self.line, self.column = path, line, column


@dataclass(frozen=True)
class TracePod:
    """One pod row: its name, request and model constraint as written (``gpu_spec``: FGD
    keys its pod classes by this string, while the request holds the set of models)."""

    name: str
    request: PodRequest
    gpu_spec: str = ""


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, 0, "", f"cannot open: {exc.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        try:
            header = reader.fieldnames or []
            for column in required:
                if column not in header:
                    raise TraceError(
                        path, 1, column, f"missing column (header: {','.join(header)})"
                    )
            for row in reader:
                yield reader.line_num, row
        except UnicodeDecodeError:
            raise TraceError(path, reader.line_num + 1, "", "not UTF-8 text") from None


def _int(path: Path, line: int, row: dict[str, str], column: str, minimum: int = 0) -> int:
    raw = row.get(column)
    if raw is None:
        raise TraceError(path, line, column, "row is too short")
    try:
        value = int(raw.strip())
    except ValueError:
        try:
            as_float = float(raw)
        except ValueError:
            raise TraceError(path, line, column, f"not an integer: {raw!r}") from None
        if not as_float.is_integer():
            raise TraceError(path, line, column, f"not an integer: {raw!r}") from None
        value = int(as_float)
    if value < minimum:
        raise TraceError(path, line, column, f"must be >= {minimum}, got {value}")
    return value


def _text(path: Path, line: int, row: dict[str, str], column: str) -> str:
    raw = row.get(column)
    if raw is None:
        raise TraceError(path, line, column, "row is too short")
    value = raw.strip()
    if not value:
        raise TraceError(path, line, column, "empty")
    return value


def load_nodes(path: Path) -> list[NodeState]:
    """GPU nodes from an openb node list (columns sn, cpu_milli, memory_mib, gpu, model)."""
    nodes: list[NodeState] = []
    seen: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        name = _text(path, line, row, "sn")
        if name in seen:
            raise TraceError(path, line, "sn", f"duplicate node {name!r}")
        seen.add(name)
        cpu = _int(path, line, row, "cpu_milli")
        memory = _int(path, line, row, "memory_mib")
        count = _int(path, line, row, "gpu")
        model = (row.get("model") or "").strip()
        gpus = tuple(GpuState(i, MILLI_PER_GPU) for i in range(count))
        nodes.append(NodeState(name, cpu, cpu, memory, model, gpus))
    if not nodes:
        raise TraceError(path, 1, "", "no nodes")
    return nodes


def load_pods(path: Path) -> list[TracePod]:
    """Pods from an openb pod list, as the paper's converter reads them.

    Only name, CPU, memory, GPU count, per-card milli and (optional) ``gpu_spec`` matter;
    timestamps and QoS are ignored because the paper's runs never delete a pod. The per-card
    share is clipped to 1000 like the paper's converter does.
    """
    pods: list[TracePod] = []
    seen: set[str] = set()
    for line, row in _rows(path, POD_COLUMNS):
        name = _text(path, line, row, "name")
        if name in seen:
            raise TraceError(path, line, "name", f"duplicate pod {name!r}")
        seen.add(name)
        cpu = _int(path, line, row, "cpu_milli")
        memory = _int(path, line, row, "memory_mib")
        count = _int(path, line, row, "num_gpu")
        milli = _int(path, line, row, "gpu_milli", minimum=-(10**9))
        spec = (row.get("gpu_spec") or "").strip()
        if count == 0:
            # The paper's converter writes the model annotation for GPU pods only.
            milli, models, spec = 0, frozenset[str](), ""
        else:
            milli = min(milli, MILLI_PER_GPU)
            if milli <= 0:
                raise TraceError(path, line, "gpu_milli", "a GPU pod needs gpu_milli > 0")
            if count > 1 and milli != MILLI_PER_GPU:
                raise TraceError(path, line, "gpu_milli", "multi-GPU pods must ask for 1000")
            models = frozenset(m for m in spec.split("|") if m)
        request = PodRequest(cpu, memory, count, milli, gpu_models=models, name=name)
        pods.append(TracePod(name, request, spec))
    if not pods:
        raise TraceError(path, 1, "", "no pods")
    return pods
