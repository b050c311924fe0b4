"""A node with card-level sharing on: the fake API server (real HTTP, lightkube), the kubelet
emulator serving PodResources, and a real ``kubegpu device-plugin`` process; plus helpers that
write pods and decisions exactly as the scheduler extender would."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightkube
from lightkube.resources.core_v1 import Pod

from kubegpu.core.gpu import GpuDevice
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.sharing.accounting import over_capacity
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    INVENTORY_ANNOTATION,
    AllocationDecision,
    CardShare,
    ContainerAllocation,
    decode_allocation,
    decode_inventory,
    encode_allocation,
)
from kubegpu.sharing.findings import DRIFT_ANNOTATION, MISMATCH_ANNOTATION
from kubegpu.sharing.ledger import ALLOCATED_ANNOTATION, Ledger, decode_ledger
from kubegpu.sharing.podstate import read_pod
from kubegpu.sharing.resources import ResourceNames
from kubegpu.testing.apiserver import FakeApiServer, ServerThread, make_node
from kubegpu.testing.kubelet import Allocation, ContainerKind, KubeletEmulator
from kubegpu.testing.waiting import wait_until
from tests.kubelet.conftest import PluginProcess, short_tempdir

NODE = "test-node"
WHOLE = "nvidia.com/gpu"
SLOT = "kubegpu.io/gpu-shared"
MEMORY = "kubegpu.io/gpu-memory"
COMPUTE = "kubegpu.io/gpu-compute"

SHARE_CONFIG = """\
version: v1
sharing:
  gpuShare:
    enabled: true
    slotsPerCard: {slots}
    enforcement: {enforcement}
    syncIntervalS: 0.2
    reconcileIntervalS: {reconcile}
    inventoryIntervalS: 60
    podResourcesSocket: {pod_resources}
    mps:
      controlCommand: {mps_command}
      hostDir: {mps_dir}
      restartInitialS: 0.1
      restartMaxS: 1.0
"""


def real_gpus() -> tuple[GpuDevice, ...]:
    """This machine's GPUs through NVML (``-m gpu`` tests)."""
    from kubegpu.inventory.nvml import NvmlBackend

    backend = NvmlBackend()
    try:
        return backend.snapshot().gpus
    finally:
        backend.close()


@dataclass(frozen=True)
class ShareSpec:
    """One container's share in a test pod."""

    name: str
    compute_milli: int
    memory_mib: int
    init: bool = False
    sidecar: bool = False  # an init container with restartPolicy: Always (``init`` implied)

    @property
    def in_init(self) -> bool:
        return self.init or self.sidecar


class SharedNode:
    def __init__(
        self,
        root: Path,
        *,
        preset: str = "4xT4",
        slots: int = 4,
        enforcement: str = "none",
        reconcile_s: float = 0.3,
        mps_command: str = "nvidia-cuda-mps-control",
        backend: str = "fake",
    ) -> None:
        self.root = root
        self.preset = preset
        self.backend = backend
        self.gpus = real_gpus() if backend == "nvml" else resolve_fake_spec(preset).inventory.gpus
        self.api: ServerThread = FakeApiServer().run_in_thread()
        self.api.store.put("nodes", make_node(NODE))
        self.client: lightkube.Client = self.api.client()
        self.kubeconfig = self.api.write_kubeconfig(root / "kubeconfig")
        self.kubelet_dir = root / "dp"
        self.pod_resources_socket = root / "pr.sock"
        self.kubelet = KubeletEmulator(
            self.kubelet_dir, pod_resources_socket=self.pod_resources_socket, node_name=NODE
        )
        self.kubelet.start()
        self.mps_dir = root / "mps"
        self.config = root / "config.yaml"
        self.config.write_text(
            SHARE_CONFIG.format(
                slots=slots,
                enforcement=enforcement,
                reconcile=reconcile_s,
                pod_resources=self.pod_resources_socket,
                mps_command=mps_command,
                mps_dir=self.mps_dir,
            )
        )
        self.plugin = self.start_plugin()
        self._created = 0

    def start_plugin(self) -> PluginProcess:
        plugin = PluginProcess(
            self.kubelet_dir,
            preset=self.preset,
            config=self.config,
            backend=self.backend,
            extra=("--kubeconfig", str(self.kubeconfig)),
        )
        self.kubelet.wait_for_registration(SLOT, timeout_s=30)
        return plugin

    def wait_ready(self) -> None:
        n = len(self.gpus)
        self.kubelet.wait_for_devices(WHOLE, lambda d: len(d) == n, timeout_s=30)
        # Healthy ones: after a plugin dies the kubelet keeps its ids, marked Unhealthy.
        self.kubelet.wait_for_devices(
            SLOT, lambda d: any(s.healthy for s in d.values()), timeout_s=30
        )

    def close(self) -> int:
        rc = self.plugin.stop()
        self.kubelet.stop()
        self.client.close()
        self.api.stop()
        return rc

    # -- pods ------------------------------------------------------------------------------

    def card(self, index: int) -> CardShare:
        gpu = next(g for g in self.gpus if g.index == index)
        return CardShare(str(gpu.uuid), gpu.index, 0, 0)

    def add_shared_pod(
        self,
        name: str,
        card_index: int | None,
        containers: Sequence[ShareSpec],
        *,
        decide: bool = True,
    ) -> str:
        """A pod bound to this node asking for shares; with ``decide`` the extender's decision
        (all containers on ``card_index``) is on it. Returns the pod's UID."""
        self._created += 1
        spec: dict[str, Any] = {"nodeName": NODE, "containers": [], "initContainers": []}
        for c in containers:
            limits = {SLOT: "1", MEMORY: str(c.memory_mib), COMPUTE: str(c.compute_milli)}
            entry: dict[str, Any] = {"name": c.name, "image": "x", "resources": {"limits": limits}}
            if c.sidecar:
                entry["restartPolicy"] = "Always"
            spec["initContainers" if c.in_init else "containers"].append(entry)
        annotations: dict[str, str] = {}
        if decide and card_index is not None:
            card = self.card(card_index)
            # The extender's (kube-scheduler's) rule: app containers and sidecars add up; a
            # regular init container counts with the sidecars started before it.
            running, peak = (0, 0), (0, 0)
            for c in containers:
                if c.sidecar:
                    running = (running[0] + c.compute_milli, running[1] + c.memory_mib)
                    step = running
                elif c.init:
                    step = (running[0] + c.compute_milli, running[1] + c.memory_mib)
                else:
                    continue
                peak = (max(peak[0], step[0]), max(peak[1], step[1]))
            app = [c for c in containers if not c.in_init]
            total = CardShare(
                card.uuid,
                card.index,
                max(sum(c.compute_milli for c in app) + running[0], peak[0]),
                max(sum(c.memory_mib for c in app) + running[1], peak[1]),
            )
            decision = AllocationDecision(
                node=NODE,
                cards=(total,),
                containers=tuple(
                    ContainerAllocation(
                        c.name,
                        c.in_init,
                        (CardShare(card.uuid, card.index, c.compute_milli, c.memory_mib),),
                    )
                    for c in containers
                ),
                decided_at=f"2026-01-01T00:00:{self._created:02d}.000000Z",
                policy="test",
                shared=True,
            )
            annotations[ALLOCATION_ANNOTATION] = encode_allocation(decision)
        return self._put_bound_pod(name, annotations, spec)

    def add_whole_pod(self, name: str, card_indices: Sequence[int]) -> str:
        """A pod bound to this node with the extender's decision for whole cards (one
        container, ``main``, asking for all of them). Returns the pod's UID."""
        self._created += 1
        cards = tuple(
            CardShare(c.uuid, c.index, 1000, self.memory_mib(c.index))
            for c in (self.card(i) for i in card_indices)
        )
        decision = AllocationDecision(
            node=NODE,
            cards=cards,
            containers=(ContainerAllocation("main", False, cards),),
            decided_at=f"2026-01-01T00:00:{self._created:02d}.000000Z",
            policy="test",
            shared=False,
        )
        limits = {WHOLE: str(len(cards))}
        return self._put_bound_pod(
            name,
            {ALLOCATION_ANNOTATION: encode_allocation(decision)},
            {
                "nodeName": NODE,
                "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}],
            },
        )

    def _put_bound_pod(self, name: str, annotations: dict[str, str], spec: dict[str, Any]) -> str:
        """Store a Pending pod in ``default`` with ``spec`` (whose nodeName binds it here) and
        ``annotations``, its creation time taken from the count the caller just advanced.
        Returns its UID."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "default",
                "annotations": annotations,
                # Distinct, ordered creation times: the kubelet admits the oldest pod first.
                "creationTimestamp": f"2026-01-01T00:{self._created:02d}:00Z",
            },
            "spec": spec,
            "status": {"phase": "Pending"},
        }
        return str(self.api.store.put("pods", pod)["metadata"]["uid"])

    def memory_mib(self, index: int) -> int:
        return next(g.memory_total_mib for g in self.gpus if g.index == index)

    def decision(self, name: str) -> AllocationDecision:
        return decode_allocation(self.annotations(name)[ALLOCATION_ANNOTATION])

    def over_capacity(self) -> list[str]:
        """What the extender's own arithmetic finds over capacity on this node's cards, from
        the records on the pods (as a restarted extender would rebuild them)."""
        names = ResourceNames(WHOLE, MEMORY, COMPUTE, SLOT)
        raw = self.api.store.get("nodes", None, NODE) or {}
        inventory = decode_inventory(raw["metadata"]["annotations"][INVENTORY_ANNOTATION])
        usages = []
        for pod in self.client.list(Pod, namespace="*"):
            usage = read_pod(pod.to_dict(), names).usage
            if usage is not None:
                usages.append(usage)
        return over_capacity(inventory, usages)

    def pod(self, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.client.get(Pod, name, namespace="default").to_dict()
        return got

    def annotations(self, name: str) -> Mapping[str, str]:
        return self.pod(name)["metadata"].get("annotations") or {}

    def ledger(self, name: str) -> Ledger | None:
        raw = self.annotations(name).get(ALLOCATED_ANNOTATION)
        return None if raw is None else decode_ledger(raw)

    def drift(self, name: str) -> str | None:
        return self.annotations(name).get(DRIFT_ANNOTATION)

    def mismatch(self, name: str) -> str | None:
        return self.annotations(name).get(MISMATCH_ANNOTATION)

    def assert_records_match(self, pod: str, got: Mapping[str, Allocation]) -> None:
        """The pod's records say, container by container, what ``got`` (the kubelet's
        Allocate answers) handed out: card, slot, MiB and milli in the ledger and in the
        decision the extender reads back."""
        ledger = self.ledger(pod)
        assert ledger is not None, pod
        decided = {c.name: c.cards for c in self.decision(pod).containers}
        for container, allocation in got.items():
            env = allocation.envs
            entry = ledger.get(container)
            assert entry is not None, (pod, container)
            told = (
                env["NVIDIA_VISIBLE_DEVICES"],
                int(env["KUBEGPU_GPU_MEMORY_LIMIT_MIB"]),
                int(env["KUBEGPU_GPU_COMPUTE_MILLI"]),
            )
            assert (entry.uuid, entry.gpu_memory_mib, entry.compute_milli) == told, (pod, container)
            assert entry.slot == allocation.device_ids[0]
            (card,) = decided[container]
            assert (card.uuid, card.gpu_memory_mib, card.compute_milli) == told, (pod, container)

    def container_kind(self, pod: str, container: str) -> ContainerKind:
        """What ``container`` is in ``pod``'s spec, as the kubelet knows it (read from the
        store: the test's own reads must not reach the API server's request log)."""
        stored = self.api.store.get("pods", "default", pod) or {}
        for item in (stored.get("spec") or {}).get("initContainers") or []:
            if item.get("name") == container:
                return "sidecar" if item.get("restartPolicy") == "Always" else "init"
        return "app"

    def allocate_share(
        self, uid: str, pod: str, container: str, must_include: Sequence[str] = ()
    ) -> Allocation:
        return self.kubelet.allocate(
            SLOT,
            1,
            pod_uid=uid,
            pod_name=pod,
            container=container,
            must_include=must_include,
            kind=self.container_kind(pod, container),
        )

    def wait_until(self, check: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
        wait_until(
            check,
            timeout_s=timeout_s,
            what=lambda: f"{what}; plugin log:\n{self.plugin.log()[-3000:]}",
        )

    def wait_verified(self, pod: str, containers: int) -> Ledger:
        """Wait until ``pod``'s ledger records ``containers`` containers, each confirmed by
        PodResources except the regular init containers, which it never lists."""

        def done() -> bool:
            ledger = self.ledger(pod)
            return (
                ledger is not None
                and len(ledger.containers) == containers
                and all(
                    c.verified != (self.container_kind(pod, c.name) == "init")
                    for c in ledger.containers
                )
            )

        self.wait_until(done, f"pod {pod}: {containers} containers recorded and verified")
        ledger = self.ledger(pod)
        assert ledger is not None
        return ledger


@contextmanager
def ready_shared_node() -> Iterator[SharedNode]:
    """A default :class:`SharedNode` in its own short temporary directory, its devices
    registered; closed and its directory removed afterwards."""
    root = short_tempdir()
    shared = SharedNode(root)
    try:
        shared.wait_ready()
        yield shared
    finally:
        shared.close()
        shutil.rmtree(root, ignore_errors=True)


def card_totals(node: SharedNode, pods: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Per card: (compute milli, memory MiB) held by the app containers and sidecars the
    ledgers record (regular init containers run before them and do not add up)."""
    totals: dict[str, list[int]] = {}
    for name in pods:
        ledger = node.ledger(name)
        assert ledger is not None
        for c in ledger.containers:
            if node.container_kind(name, c.name) == "init":
                continue
            slot = totals.setdefault(c.uuid, [0, 0])
            slot[0] += c.compute_milli
            slot[1] += c.gpu_memory_mib
    return {k: (v[0], v[1]) for k, v in totals.items()}


# Loopback only: no proxy from the environment may take these requests elsewhere.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ExtenderProcess:
    """``kubegpu extender`` as a separate process against the node's fake API server, asked
    over HTTP as kube-scheduler asks it (node-cache-capable: node names only)."""

    def __init__(self, node: SharedNode, policy: str = "kubegpu") -> None:
        self.log_path = node.root / "extender.log"
        self._log = self.log_path.open("wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEGPU_")}
        env["NO_PROXY"] = "*"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubegpu",
                "extender",
                "--kubeconfig",
                str(node.kubeconfig),
                "--port",
                "0",
                "--policy",
                policy,
                "--leader-lease",
                "none",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.url = self._wait_listening()
        node.wait_until(self._ready, "extender ready")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_listening(self, timeout_s: float = 60.0) -> str:
        pattern = re.compile(r"kubegpu extender on (https?://\S+?),? policy")

        def listening() -> re.Match[str] | None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"extender exited; log:\n{self.log()[-3000:]}")
            return pattern.search(self.log())

        match = wait_until(
            listening,
            timeout_s=timeout_s,
            what=lambda: f"extender listening; log:\n{self.log()[-3000:]}",
        )
        return match.group(1)

    def _ready(self) -> bool:
        try:
            with _DIRECT.open(f"{self.url}/readyz", timeout=5) as response:
                return int(response.status) == 200
        except OSError:
            return False

    def post(self, verb: str, body: Mapping[str, Any]) -> Any:
        request = urllib.request.Request(
            f"{self.url}/{verb}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with _DIRECT.open(request, timeout=30) as response:
            return json.loads(response.read())

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._log.close()
        return rc
