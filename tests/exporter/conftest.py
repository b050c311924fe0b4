"""A node with pods for exporter tests: a fake 4xT4 GPU node, a hand-made ``/proc`` tree, a
kubelet pod log directory and PodResources assignments, all built in ``tmp_path``.

The scenario (every expected value in the tests is computed from these inputs):

* GPU 0 is held whole by ``ml/trainer`` (container ``main``), one process of 6 GiB;
* GPU 1 is shared by ``web/infer-a`` (a kubegpu share slot) and ``web/infer-b`` (a
  time-slicing replica), each with a 4 GiB share;
  infer-a uses 3 GiB (one process), infer-b uses 5 GiB over two processes — over its share;
  a host process (not in any pod) uses 512 MiB;
* GPU 2 is idle;
* GPU 3 has one share slot held by ``batch/job`` with no share annotation (its grant is
  unknown, and the kubelet and the extender disagree about it: a share mismatch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.core.health_feed import HealthFeed
from kubegpu.core.metrics import DeviceAssignment, PodGpuShare, PodKey
from kubegpu.exporter.cgroups import ProcPodResolver
from kubegpu.exporter.pods import PodLogDirectory, StaticPodResources, StaticShares
from kubegpu.exporter.refresher import Refresher
from kubegpu.inventory.fake_metrics import FakeMetricsSource
from kubegpu.inventory.spec import resolve_fake_spec

GIB = 1024**3
MIB = 1024**2

TRAINER = PodKey("ml", "trainer")
INFER_A = PodKey("web", "infer-a")
INFER_B = PodKey("web", "infer-b")
JOB = PodKey("batch", "job")

UIDS = {
    TRAINER: "0f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
    INFER_A: "11111111-2222-4333-8444-555555555555",
    INFER_B: "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee",
    JOB: "99999999-8888-4777-8666-555555555555",
}


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def write_cgroup(proc: Path, pid: int, text: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(text)


def cgroupfs_v1(uid: str, qos: str = "burstable") -> str:
    return (
        f"12:memory:/kubepods/{qos}/pod{uid}/3f2a9c\n"
        f"11:cpu,cpuacct:/kubepods/{qos}/pod{uid}/3f2a9c\n"
        "1:name=systemd:/system.slice/containerd.service\n"
    )


def systemd_v2(uid: str, qos: str = "burstable") -> str:
    u = uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/"
        "cri-containerd-7c1e.scope\n"
    )


@dataclass
class Node:
    inventory: NodeInventory
    uuids: list[GpuUuid]
    metrics: FakeMetricsSource
    pod_resources: StaticPodResources
    shares: StaticShares
    health: HealthFeed
    clock: FakeClock
    proc: Path
    pod_logs: Path

    def refresher(self, **kwargs: object) -> Refresher:
        options: dict[str, object] = {
            "node": "node-a",
            "inventory": lambda: self.inventory,
            "metrics": self.metrics,
            "pod_resources": self.pod_resources,
            "pod_directory": PodLogDirectory(self.pod_logs),
            "shares": self.shares,
            "pids": ProcPodResolver(self.proc),
            "clock": self.clock,
            "read_timeout_s": 5.0,
        }
        options.update(kwargs)
        return Refresher(**options)  # type: ignore[arg-type]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    inventory = resolve_fake_spec("4xT4").inventory
    uuids = [gpu.uuid for gpu in inventory.gpus]
    proc = tmp_path / "proc"
    pod_logs = tmp_path / "var-log-pods"
    for pod, uid in UIDS.items():
        (pod_logs / f"{pod.namespace}_{pod.name}_{uid}").mkdir(parents=True)
    # Every cgroup shape the kubelet produces, across the pods' processes.
    write_cgroup(proc, 100, cgroupfs_v1(UIDS[TRAINER], qos="").replace("//", "/"))
    write_cgroup(proc, 101, systemd_v2(UIDS[INFER_A], qos="besteffort"))
    write_cgroup(proc, 201, cgroupfs_v1(UIDS[INFER_B]))
    # As a containerised exporter in its own cgroup namespace reads it (no "kubepods" left).
    write_cgroup(proc, 202, f"0::/../../burstable/pod{UIDS[INFER_B]}/7c1e\n")
    write_cgroup(proc, 300, "0::/system.slice/nvidia-persistenced.service\n")

    metrics = FakeMetricsSource(inventory)
    metrics.set_processes(uuids[0], {100: 6 * GIB})
    metrics.set_processes(uuids[1], {101: 3 * GIB, 201: 2 * GIB, 202: 3 * GIB, 300: 512 * MIB})
    metrics.set(
        uuids[0],
        utilization_ratio=0.75,
        temperature_celsius=61.0,
        power_watts=70.5,
        memory_clock_hertz=5.001e9,
        graphics_clock_hertz=1.59e9,
    )
    # "not supported" on GPU 2
    metrics.set(uuids[2], sm_clock_hertz=None, memory_clock_hertz=None, power_watts=None)

    resource = "nvidia.com/gpu"
    pod_resources = StaticPodResources(
        [
            DeviceAssignment(TRAINER, "main", resource, uuids[0]),
            DeviceAssignment(INFER_A, "server", resource, f"{uuids[1]}::slot-0"),
            DeviceAssignment(INFER_B, "server", resource, f"{uuids[1]}::1"),
            DeviceAssignment(JOB, "worker", resource, f"{uuids[3]}::slot-2"),
            DeviceAssignment(JOB, "worker", "example.com/other", "not-a-gpu"),
        ]
    )
    shares = StaticShares(
        {
            INFER_A: [PodGpuShare(uuids[1], memory_bytes=4 * GIB, compute_ratio=0.5)],
            INFER_B: [PodGpuShare(uuids[1], memory_bytes=4 * GIB, compute_ratio=0.25)],
        }
    )
    return Node(
        inventory=inventory,
        uuids=uuids,
        metrics=metrics,
        pod_resources=pod_resources,
        shares=shares,
        health=HealthFeed(uuids),
        clock=FakeClock(),
        proc=proc,
        pod_logs=pod_logs,
    )
