"""What the demo cluster looks like and which pods it replays, as plain values and manifests.

Owns: the node layout (fake-GPU presets, CPU and memory per node, per-node card UUIDs so that
no two nodes share one, as on real hardware), the built-in scenario shipped as package data
(``scenario.yaml``), the conversion of an openb pod CSV slice into demo pods, and the Pod
manifests submitted to the API server. Pure apart from reading the scenario and preset files.

openb rows give CPU, memory, whole-GPU count and, for fractional pods, milli-GPU only; a share
also needs card memory, so a fractional openb pod asks for the same fraction of a 16 GiB card
(rounded up to 256 MiB). The trace's ``gpu_spec`` model names (``V100M16`` ...) are not our fake
cards' product names and are dropped.
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kubegpu.sharing.resources import GPU_MODELS_ANNOTATION, ResourceNames

DEMO_NAMESPACE = "default"
DEMO_LABEL = "kubegpu.io/demo"
# Node presets in the order nodes are made, with CPU and memory like the openb cluster's
# machines of that shape (its 4 x T4 nodes have 96 cores and 384 GiB, for instance).
NODE_PRESETS: tuple[tuple[str, str, str], ...] = (
    ("8xA100-80GB-NVLink", "128", "768Gi"),
    ("4xT4", "96", "384Gi"),
    ("2xV100-2xT4", "64", "256Gi"),
)
OPENB_SHARE_CARD_MIB = 16384
_UUID_NAMESPACE = uuid.UUID("6b1f3c2e-7d4a-4f0e-9a51-0c9b8e2d4a17")


class ScenarioError(ValueError):
    """The scenario or trace cannot be read; the message names the file and the problem."""


@dataclass(frozen=True)
class DemoNode:
    name: str
    preset: str
    cpu: str
    memory: str


@dataclass(frozen=True)
class DemoPod:
    """One pod to submit: whole cards (``gpus``), a share (``gpu_milli`` + ``gpu_memory_mib``)
    or neither (CPU only)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    models: str = ""

    @property
    def shared(self) -> bool:
        return self.gpus == 0 and self.gpu_milli > 0


def node_layout(count: int) -> list[DemoNode]:
    """``count`` nodes cycling through :data:`NODE_PRESETS` (so 3+ nodes mix every model)."""
    nodes = []
    for i in range(count):
        preset, cpu, memory = NODE_PRESETS[i % len(NODE_PRESETS)]
        nodes.append(DemoNode(f"gpu-node-{i}", preset, cpu, memory))
    return nodes


def node_gpu_spec(node: DemoNode) -> str:
    """The preset's YAML with card UUIDs derived from the node name (stable across runs)."""
    source = resources.files("kubegpu.inventory.presets") / f"{node.preset}.yaml"
    doc = yaml.safe_load(source.read_text(encoding="utf-8"))
    for gpu in doc["gpus"]:
        key = f"{node.name}/{gpu['index']}"
        gpu["uuid"] = f"GPU-{uuid.uuid5(_UUID_NAMESPACE, key)}"
    return yaml.safe_dump(doc, sort_keys=False)


def _int(item: dict[str, Any], key: str, where: str) -> int:
    value = item.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScenarioError(f"{where}: {key} must be a non-negative integer, got {value!r}")
    return value


def builtin_pods() -> list[DemoPod]:
    source = resources.files("kubegpu.demo") / "scenario.yaml"
    doc = yaml.safe_load(source.read_text(encoding="utf-8"))
    pods = []
    for i, item in enumerate(doc.get("pods") or []):
        where = f"built-in scenario pods[{i}]"
        pods.append(
            DemoPod(
                name=str(item["name"]),
                cpu_milli=_int(item, "cpuMilli", where),
                memory_mib=_int(item, "memoryMiB", where),
                gpus=_int(item, "gpus", where),
                gpu_milli=_int(item, "gpuMilli", where),
                gpu_memory_mib=_int(item, "gpuMemoryMiB", where),
                models=str(item.get("models") or ""),
            )
        )
    return pods


def take(pods: list[DemoPod], count: int | None) -> list[DemoPod]:
    """The first ``count`` pods; past the end the list repeats with a round suffix."""
    if count is None or count <= len(pods):
        return pods[: count if count is not None else len(pods)]
    out = list(pods)
    round_ = 1
    while len(out) < count:
        out.extend(
            DemoPod(
                f"{p.name}-r{round_}",
                p.cpu_milli,
                p.memory_mib,
                p.gpus,
                p.gpu_milli,
                p.gpu_memory_mib,
                p.models,
            )
            for p in pods[: count - len(out)]
        )
        round_ += 1
    return out


def trace_pods(path: Path, count: int, seed: int) -> list[DemoPod]:
    """A slice of an openb pod CSV: ``count`` consecutive rows from a seeded start."""
    from kubegpu.simulate.traces import TraceError, load_pods

    try:
        rows = load_pods(path)
    except TraceError as exc:
        raise ScenarioError(str(exc)) from None
    start = random.Random(seed).randrange(max(1, len(rows) - count + 1))
    out = []
    for row in rows[start : start + count]:
        request = row.request
        name = row.name.lower().replace("_", "-")
        if request.gpu_count > 1 or request.gpu_milli >= 1000:
            out.append(DemoPod(name, request.cpu_milli, request.memory_mib, gpus=request.gpu_count))
        elif request.gpu_count == 1:
            milli = request.gpu_milli
            memory = math.ceil(milli * OPENB_SHARE_CARD_MIB / 1000 / 256) * 256
            out.append(
                DemoPod(
                    name,
                    request.cpu_milli,
                    request.memory_mib,
                    gpu_milli=milli,
                    gpu_memory_mib=memory,
                )
            )
        else:
            out.append(DemoPod(name, request.cpu_milli, request.memory_mib))
    return out


def pod_manifest(
    pod: DemoPod,
    *,
    scheduler_name: str,
    names: ResourceNames | None = None,
    namespace: str = DEMO_NAMESPACE,
) -> dict[str, Any]:
    """The Pod a user would apply for ``pod``: GPU resources in limits (requests follow)."""
    names = names or ResourceNames()
    limits: dict[str, str] = {}
    if pod.gpus:
        limits[names.whole_gpu] = str(pod.gpus)
    elif pod.shared:
        limits[names.share_slot] = "1"
        limits[names.gpu_compute] = str(pod.gpu_milli)
        limits[names.gpu_memory] = str(pod.gpu_memory_mib)
    annotations = {GPU_MODELS_ANNOTATION: pod.models} if pod.models else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": namespace,
            "labels": {DEMO_LABEL: "true"},
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": scheduler_name,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"},
                        "limits": limits,
                    },
                }
            ],
        },
    }
