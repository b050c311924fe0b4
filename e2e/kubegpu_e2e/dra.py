"""The DRA variant of the real cluster (docs/dra.md, issue 16): containerd v2 of our own build
with CDI on, the feature gates for shares by capacity, device taints and extended-resource
requests on every component, and `kubegpu dra-driver` (fake backend, 8xA100-80GB-NVLink) beside
the real kubelet, with the ServiceAccount, ClusterRole and DeviceClasses of
deploy/components/dra-driver. Fake GPUs get real device nodes (character devices made with
mknod under the run folder, the driver's --dev-root), so the runtime's CDI injection is checked
for real: a container sees exactly the /dev/nvidiaN of its claim."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from kubegpu_e2e.cluster import NODE_NAME, Cluster, write_kubeconfig
from kubegpu_e2e.processes import HostProcess, built

REPO = Path(__file__).resolve().parents[2]
COMPONENT = REPO / "deploy" / "components" / "dra-driver"
E2E = Path(__file__).resolve().parents[1]
DRIVER = "gpu.kubegpu.io"
FAKE_GPUS = "8xA100-80GB-NVLink"
GPU_COUNT = 8
NAMESPACE = "kubegpu"
ACCOUNT = "kubegpu-dra-driver"
# The features the DRA scenarios want on: shares by capacity, the unhealthy taint, plain
# extended-resource requests (nvidia.com/gpu) served through a DeviceClass that names one, and
# the kubelet's device-health stream with the pod status field it fills
# (containerStatuses[].allocatedResourcesStatus). DRA itself (DynamicResourceAllocation) is GA
# and on. All four are alpha and off in 1.35, beta and on from 1.36; DRAExtendedResource is GA
# and locked from 1.37, so it is not passed there (kubegpu_e2e/versions.py turns this into
# what each version accepts).
FEATURE_GATES = {
    "DRAConsumableCapacity": True,
    "DRADeviceTaints": True,
    "DRAExtendedResource": True,
    "ResourceHealthStatus": True,
}
# NVIDIA's character-device majors: 195 for the cards (minor = index) and nvidiactl (255);
# nvidia-uvm's major is dynamic on a real host, any free one does here.
_NVIDIA_MAJOR = 195
_UVM_MAJOR = 237


def containerd_bin_dir() -> Path:
    """containerd v2 + shim + ctr, built into the cache by e2e/components/containerd/build.sh
    (e2e/run exports the folder as KUBEGPU_E2E_CONTAINERD)."""
    return built("KUBEGPU_E2E_CONTAINERD", E2E / "components" / "containerd" / "build.sh")


def dra_cluster(bin_dir: Path, out_dir: Path) -> Cluster:
    return Cluster(
        bin_dir=bin_dir,
        out_dir=out_dir,
        feature_gates=dict(FEATURE_GATES),
        containerd_bin_dir=containerd_bin_dir(),
    )


def make_device_nodes(dev_root: Path, gpus: int) -> None:
    """/dev/nvidia0..N-1, /dev/nvidiactl and the uvm nodes as real character devices under
    dev_root: the CDI specs name them, and the runtime stats each one to put it in the
    container (a missing node fails the container)."""
    dev = dev_root / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    nodes = {f"nvidia{i}": (_NVIDIA_MAJOR, i) for i in range(gpus)}
    nodes |= {
        "nvidiactl": (_NVIDIA_MAJOR, 255),
        "nvidia-uvm": (_UVM_MAJOR, 0),
        "nvidia-uvm-tools": (_UVM_MAJOR, 1),
    }
    for name, (major, minor) in nodes.items():
        path = dev / name
        if not path.exists():
            os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))


class DraDriver:
    """`kubegpu dra-driver` as a host process with its ServiceAccount's token."""

    def __init__(
        self, cluster: Cluster, fake_gpus: str = FAKE_GPUS, devices: int = GPU_COUNT
    ) -> None:
        self.cluster = cluster
        # The fake node (a preset or a spec file) and how many devices its slice publishes.
        self.fake_gpus = fake_gpus
        self.device_count = devices
        # The name it publishes under: gpu.kubegpu.io, or gpu.nvidia.com once restarted with
        # --dra-naming=nvidia (e2e/tests/test_16_nvidia_dra.py).
        self.driver = DRIVER
        self.fake_control = cluster.run_dir / "fake-gpu.sock"
        self.state_dir = cluster.run_dir / "dra-state"
        self.dev_root = cluster.run_dir / "fake-host"
        self.process: HostProcess | None = None
        self.kubeconfig: Path | None = None
        self.starts = 0

    def install(self) -> None:
        """The component's RBAC and DeviceClasses, applied with the real kubectl."""
        c = self.cluster
        c.kubectl("create", "namespace", NAMESPACE, check=False)
        for name in ("dra-driver-rbac.yaml", "deviceclasses.yaml"):
            c.kubectl("apply", "--server-side", "-f", str(COMPONENT / name))
        token = c.kubectl(
            "create", "token", ACCOUNT, "-n", NAMESPACE, "--duration=12h"
        ).stdout.strip()
        self.kubeconfig = write_kubeconfig(
            c.run_dir / f"{ACCOUNT}.kubeconfig", c.server, c.ca.cert, user=ACCOUNT, token=token
        )
        make_device_nodes(self.dev_root, GPU_COUNT)  # cards 0..7: enough for any spec here

    def start(self, config: Path | None = None, *extra: str) -> HostProcess:
        """Start the driver with ``config`` (default: the component's shipped config) and
        ``extra`` arguments."""
        c = self.cluster
        env = dict(c.env)
        env.pop("KUBECONFIG", None)
        self.starts += 1
        argv = [
            str(Path(sys.executable).with_name("kubegpu")),
            "dra-driver",
            "--backend=fake",
            f"--fake-gpus={self.fake_gpus}",
            f"--fake-control={self.fake_control}",
            f"--config={config or COMPONENT / 'dra-driver-config.yaml'}",
            f"--node-name={NODE_NAME}",
            f"--kubeconfig={self.kubeconfig}",
            f"--kubelet-dir={c.kubelet_root}",
            f"--cdi-dir={c.cdi_dir}",
            f"--state-dir={self.state_dir}",
            f"--dev-root={self.dev_root}",
            *extra,
        ]
        log = c.logs / f"kubegpu-dra-driver-{self.starts}.log"
        self.process = HostProcess("kubegpu-dra-driver", argv, log, env=env).start()
        self.process.wait_until(
            lambda: len(self.devices()) == self.device_count,
            60,
            "the driver's ResourceSlice devices",
        )
        return self.process

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=15)

    def slices(self) -> list[dict[str, Any]]:
        found = self.cluster.get(
            "resourceslices",
            f"--field-selector=spec.nodeName={NODE_NAME},spec.driver={self.driver}",
        )
        return list(found["items"])

    def devices(self) -> dict[str, dict[str, Any]]:
        """The devices of the node's pool at its newest generation, by name."""
        slices = self.slices()
        if not slices:
            return {}
        newest = max(s["spec"]["pool"]["generation"] for s in slices)
        return {
            d["name"]: d
            for s in slices
            if s["spec"]["pool"]["generation"] == newest
            for d in s["spec"].get("devices", [])
        }
