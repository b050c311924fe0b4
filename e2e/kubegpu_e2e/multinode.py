"""Three real kubelets on this machine (issue 27, item 5): one control plane
(Cluster.start_control_plane), and per node its own mount namespace, containerd (v2, with CDI,
as the DRA cluster's), kubelet, CNI subnet, cgroup root, ports and node name, with a kubegpu
node agent (or DRA driver) of its own over a different fake GPU layout.

The kubelet's device-plugin socket is the fixed path /var/lib/kubelet/device-plugins/kubelet.sock
whatever its --root-dir says, so three kubelets cannot share one mount namespace. Each node gets
one, made by `unshare --mount --propagation private` around a holder process that bind-mounts the
node's own folder onto /var/lib/kubelet/device-plugins there and then waits; the node's containerd
and kubelet join it with `nsenter --mount`. containerd must be in the kubelet's namespace: the
kubelet mounts pod volumes (and its root folder, made rshared) where only its namespace sees them.
Everything else is a path under the run folder, which every namespace sees alike, so the node
agent and the DRA driver run in the suite's own namespace and talk to the kubelet through the
node's folder: the agent's --kubelet-dir is the folder mounted over the fixed path. The mounts
of a node's namespace go with its last process; its processes are the cluster's, stopped with it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.sharing.resources import parse_quantity
from kubegpu_e2e import images
from kubegpu_e2e.cluster import (
    KUBELET_DEVICE_PLUGINS,
    Cluster,
    _cgroup_hierarchies,
    _pause_source,
    free_port,
    http_ok,
    write_kubeconfig,
)
from kubegpu_e2e.dra import FEATURE_GATES, containerd_bin_dir, make_device_nodes
from kubegpu_e2e.kubegpu import DEPLOY, NODE_STATUS_PERIOD_S, KubegpuRoles
from kubegpu_e2e.processes import HostProcess


@dataclass(frozen=True)
class NodeSpec:
    name: str
    fake_gpus: str  # a preset of src/kubegpu/inventory/presets
    subnet: str  # the node's pod addresses (host-local IPAM, ptp)
    gateway: str


# Three layouts, so that a node's cards are not the others': four T4s, two V100s and two T4s,
# eight A100s.
NODES = (
    NodeSpec("kgpu-t4", "4xT4", "10.244.16.0/24", "10.244.16.1"),
    NodeSpec("kgpu-mixed", "2xV100-2xT4", "10.244.17.0/24", "10.244.17.1"),
    NodeSpec("kgpu-a100", "8xA100-80GB-NVLink", "10.244.18.0/24", "10.244.18.1"),
)
SLOTS_PER_CARD = 32  # the node agent's shared slots per card (deploy/base/node-agent-config)
# kube-scheduler logs every plugin's and extender's score per node, and each node's total, at
# -v=10 in schedule_one.go (prioritizeNodes); --vmodule raises only that file, so the rest of
# the scheduler (its client's request bodies among them) stays at -v=2.
SCORE_LOG_FLAGS = ("--vmodule=schedule_one=10",)


@dataclass
class Node:
    spec: NodeSpec
    dir: Path
    ports: dict[str, int] = field(default_factory=dict)
    holder: HostProcess | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    @property
    def device_plugins(self) -> Path:
        """Mounted over /var/lib/kubelet/device-plugins in the node's namespace."""
        return self.dir / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    @property
    def cdi_dir(self) -> Path:
        return self.dir / "cdi"

    @property
    def gpu_count(self) -> int:
        return len(resolve_fake_spec(self.spec.fake_gpus).inventory.gpus)

    def nsenter(self) -> list[str]:
        assert self.holder is not None and self.holder.popen is not None
        return ["nsenter", f"--mount=/proc/{self.holder.popen.pid}/ns/mnt", "--"]


class MultiNodeCluster:
    """A control plane and three kubelets, each in a mount namespace of its own."""

    def __init__(self, bin_dir: Path, out_dir: Path) -> None:
        self.cluster = Cluster(
            bin_dir=bin_dir,
            out_dir=out_dir,
            feature_gates=dict(FEATURE_GATES),
            containerd_bin_dir=containerd_bin_dir(),
        )
        c = self.cluster
        self.nodes = [Node(spec, c.run_dir / f"n{i}") for i, spec in enumerate(NODES)]

    # -------------------------------------------------------------- start
    def start(self) -> None:
        c = self.cluster
        c.start_control_plane()
        # The mount point every node's namespace mounts its own folder over (the host's stays
        # empty); /var/lib/kubelet is removed at the end if the run created it.
        KUBELET_DEVICE_PLUGINS.mkdir(parents=True, exist_ok=True)
        build = c.run_dir / "images"
        build.mkdir()
        archives = [images.build_pause(build, _pause_source()), images.build_workload(build)]
        for node in self.nodes:
            self._start_runtime(node, archives)
        for node in self.nodes:
            self._start_kubelet(node)
        for node in self.nodes:
            c.wait_for(f"Node {node.name} Ready", lambda n=node: self._ready(n.name), 120)
            self._give_address(node.name)

    def _start_runtime(self, node: Node, archives: Iterable[Path]) -> None:
        c = self.cluster
        node.dir.mkdir()
        node.device_plugins.mkdir()
        node.kubelet_root.mkdir()
        node.cdi_dir.mkdir()
        ready = node.dir / "namespace-ready"
        script = (
            f"mount --bind {node.device_plugins} {KUBELET_DEVICE_PLUGINS} && touch {ready} "
            "&& while :; do sleep 3600; done"
        )
        node.holder = c._process(
            f"{node.name}-mount-namespace",
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
        )
        node.holder.wait_until(ready.exists, 30, "the node's mount namespace")
        network = c._cni_network(node.spec.subnet, node.spec.gateway, node.dir / "cni-ipam")
        config = c.write_containerd_config(node.dir / "containerd", network, node.cdi_dir)
        process = c._process(
            f"{node.name}-containerd",
            [*node.nsenter(), c._containerd("containerd"), "--config", str(config)],
        )
        process.wait_until(node.containerd_socket.exists, 60, "containerd's socket")
        for archive in archives:
            _ctr(c, node, "images", "import", "--no-unpack=false", str(archive))

    def _start_kubelet(self, node: Node) -> None:
        c = self.cluster
        node.ports = {"kubelet": free_port(), "kubelet-healthz": free_port()}
        serving = c.ca.issue(
            f"{node.name}-serving",
            common_name=node.name,
            ips=("127.0.0.1",),
            dns_names=(node.name, "localhost"),
            server=True,
        )
        client = c.ca.issue(
            f"{node.name}-kubelet",
            common_name=f"system:node:{node.name}",
            organizations=("system:nodes",),
        )
        kubeconfig = write_kubeconfig(
            node.dir / "kubelet.kubeconfig", c.server, c.ca.cert, user=node.name, client=client
        )
        config = yaml.safe_load(c._kubelet_config().read_text())
        config.update(
            port=node.ports["kubelet"],
            healthzPort=node.ports["kubelet-healthz"],
            tlsCertFile=str(serving.cert),
            tlsPrivateKeyFile=str(serving.key),
            cgroupRoot=f"{c.cgroup_root}/{node.dir.name}",
            containerRuntimeEndpoint=f"unix://{node.containerd_socket}",
            podLogsDir=str(node.dir / "pod-logs"),
            maxPods=110,
        )
        config_path = node.dir / "kubelet-config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        for hierarchy in _cgroup_hierarchies():
            (hierarchy / config["cgroupRoot"].lstrip("/")).mkdir(parents=True, exist_ok=True)
        process = c._process(
            f"{node.name}-kubelet",
            [
                *node.nsenter(),
                c._bin("kubelet"),
                f"--config={config_path}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={node.kubelet_root}",
                f"--cert-dir={node.dir / 'kubelet-pki'}",
                f"--hostname-override={node.name}",
                "--node-ip=127.0.0.1",
                "--v=2",
            ],
        )
        healthz = f"http://127.0.0.1:{node.ports['kubelet-healthz']}/healthz"
        process.wait_until(lambda: http_ok(healthz), 120, f"{node.name} kubelet /healthz")

    def _ready(self, name: str) -> bool:
        node = self.cluster.get("node", name)
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]
        )

    def _give_address(self, name: str) -> None:
        # As Cluster._give_node_its_address: the kubelet publishes no loopback address itself.
        patch = {
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": name},
                ]
            }
        }
        self.cluster.kubectl(
            "patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(patch)
        )

    def stop(self) -> list[str]:
        return self.cluster.stop()

    # -------------------------------------------------------------- kubegpu on the nodes
    def start_agents(self, roles: KubegpuRoles) -> None:
        """One `kubegpu device-plugin` per node over its own fake GPUs, registered with its
        own kubelet through the node's device-plugin folder."""
        for node in self.nodes:
            health = free_port()
            roles.start_role(
                f"kubegpu-node-agent-{node.name}",
                [
                    str(Path(sys.executable).with_name("kubegpu")),
                    "device-plugin",
                    "--backend=fake",
                    f"--fake-gpus={node.spec.fake_gpus}",
                    f"--fake-control={node.dir / 'fake-gpu.sock'}",
                    f"--config={DEPLOY / 'base' / 'node-agent-config.yaml'}",
                    f"--kubelet-dir={node.device_plugins}",
                    f"--node-name={node.name}",
                    f"--kubeconfig={roles.kubeconfigs['kubegpu-node-agent']}",
                    f"--pod-resources-socket={node.pod_resources_socket}",
                    f"--cdi-dir={node.cdi_dir}",
                    f"--health-listen=127.0.0.1:{health}",
                ],
            ).wait_until(
                lambda port=health: http_ok(f"http://127.0.0.1:{port}/readyz"),
                60,
                f"the node agent of {node.name} registered with its kubelet",
            )
        self.wait_advertised()

    def wait_advertised(self) -> None:
        """Until every Node shows its agent's cards and slots, and still does a whole status
        period later (the kubelet's sync can drop them once after a registration)."""

        def advertised() -> bool:
            for node in self.nodes:
                status = self.cluster.get("node", node.name)["status"]
                if status["capacity"].get("nvidia.com/gpu") != str(node.gpu_count):
                    return False
                slots = str(node.gpu_count * SLOTS_PER_CARD)
                if status["allocatable"].get("kubegpu.io/gpu-shared") != slots:
                    return False
            return True

        for _ in range(3):
            self.cluster.wait_for("every Node to advertise its cards and slots", advertised, 90)
            held_until = time.monotonic() + NODE_STATUS_PERIOD_S + 2
            while time.monotonic() < held_until and advertised():
                time.sleep(0.5)
            if time.monotonic() >= held_until:
                return
        raise AssertionError("the Nodes' GPUs and slots keep coming and going")

    def dra_driver_argv(self, node: Node, kubeconfig: Path, config: Path) -> list[str]:
        """`kubegpu dra-driver` for ``node``: its kubelet's root, its own state, CDI folder
        (its containerd's) and device nodes."""
        dev_root = node.dir / "fake-host"
        make_device_nodes(dev_root, node.gpu_count)
        return [
            str(Path(sys.executable).with_name("kubegpu")),
            "dra-driver",
            "--backend=fake",
            f"--fake-gpus={node.spec.fake_gpus}",
            f"--fake-control={node.dir / 'fake-gpu-dra.sock'}",
            f"--config={config}",
            f"--node-name={node.name}",
            f"--kubeconfig={kubeconfig}",
            f"--kubelet-dir={node.kubelet_root}",
            f"--cdi-dir={node.cdi_dir}",
            f"--state-dir={node.dir / 'dra-state'}",
            f"--dev-root={dev_root}",
        ]


def _ctr(c: Cluster, node: Node, *args: str) -> None:
    subprocess.run(
        [
            c._containerd("ctr"),
            "--address",
            str(node.containerd_socket),
            "--namespace",
            "k8s.io",
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )


# ------------------------------------------------------------------ kube-scheduler's own words
_LINE = re.compile(
    r'"(?P<msg>Plugin scored node for pod|Extender scored node for pod|'
    r"Calculated node's final score for pod|Successfully bound pod to node)\"(?P<kv>.*)$"
)
_KV = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


@dataclass
class ScoringCycle:
    """One prioritizeNodes of kube-scheduler for one pod, from its -v=10 lines: each node's
    in-tree plugin scores (weighted, as the scheduler adds them), the extenders' raw scores
    (0..10, before weight), and the node's final score."""

    plugins: dict[str, dict[str, int]] = field(default_factory=dict)
    extenders: dict[str, list[int]] = field(default_factory=dict)
    final: dict[str, int] = field(default_factory=dict)

    def in_tree(self) -> dict[str, int]:
        return {node: sum(scores.values()) for node, scores in self.plugins.items()}

    def extender_total(self) -> dict[str, int]:
        return {node: sum(scores) for node, scores in self.extenders.items()}


@dataclass
class Scheduling:
    cycles: list[ScoringCycle]
    bound_to: str
    bound_line: str


def _fields(kv: str) -> dict[str, str]:
    return {k: v.strip('"') for k, v in _KV.findall(kv)}


def scheduling_of(log: Path, pod: str) -> Scheduling | None:
    """kube-scheduler's scoring cycles for ``pod`` (namespace/name) and where it bound it,
    from its log; None until it logged the bind."""
    cycles: list[ScoringCycle] = []
    current: ScoringCycle | None = None
    for line in log.read_text(errors="replace").splitlines():
        found = _LINE.search(line)
        if not found:
            continue
        f = _fields(found.group("kv"))
        if f.get("pod") != pod:
            continue
        message = found.group("msg")
        if message == "Successfully bound pod to node":
            return Scheduling(cycles, f["node"], line)
        if current is None or (
            current.final and message != "Calculated node's final score for pod"
        ):
            current = ScoringCycle()
            cycles.append(current)
        node = f["node"]
        if message == "Plugin scored node for pod":
            current.plugins.setdefault(node, {})[f["plugin"]] = int(f["score"])
        elif message == "Extender scored node for pod":
            current.extenders.setdefault(node, []).append(int(f["score"]))
        else:
            current.final[node] = int(f["score"])
    return None


def allocatable(node: dict[str, Any]) -> tuple[int, int]:
    """A Node's allocatable CPU (milli) and memory (MiB), as the extender reads them."""
    values = node["status"]["allocatable"]
    return (
        int(parse_quantity(values["cpu"]) * 1000),
        int(parse_quantity(values["memory"]) / 2**20),
    )
