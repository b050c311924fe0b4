"""One real Kubernetes cluster on this machine, inside the network namespace e2e/run makes for
the suite (nothing in it reaches beyond this machine): etcd, kube-apiserver (RBAC,
service-account tokens), kube-controller-manager, the default kube-scheduler, containerd with a
point-to-point CNI (each pod its own network namespace, with a veth to the suite's namespace and
a route to the kubernetes Service only), and one kubelet with its default root folder
(/var/lib/kubelet, where the chart's host paths point). Every other file, socket and mount lives
under one run folder in /tmp (unix socket paths must stay under 108 bytes), every log under the
suite's out folder."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kubegpu_e2e import images
from kubegpu_e2e.pki import CertificateAuthority, KeyPair, service_account_keys
from kubegpu_e2e.processes import HostProcess, StartError, kill_all, pids_mentioning
from kubegpu_e2e.versions import binary_version, effective_gates

NODE_NAME = "kubegpu-e2e-node"
SERVICE_CIDR = "10.96.0.0/24"
# The kubernetes Service's ClusterIP (the first address of SERVICE_CIDR). e2e/run puts it on the
# suite's namespace's loopback, and the API server listens on every address of that namespace
# at the Service's port: a pod's in-cluster client (KUBERNETES_SERVICE_HOST/PORT) reaches it
# over its veth, with no kube-proxy. The serving certificate names this address.
KUBERNETES_SERVICE_IP = "10.96.0.1"
KUBERNETES_SERVICE_PORT = 443
# Pod addresses (host-local IPAM of the ptp plugin); the suite's namespace holds one /32 route
# per live pod and nothing else of this range. A /22: the churn scenario keeps 200 pods.
POD_CIDR = "10.244.0.0/22"
POD_GATEWAY = "10.244.0.1"
_CGROUP_HIERARCHIES = Path("/sys/fs/cgroup")
KUBELET_DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
# Host paths the kubelet writes whatever its flags say; created ones are removed at the end.
# The kubelet's root folder is its default, /var/lib/kubelet, because the chart's DaemonSets
# mount the kubelet's sockets from there; /var/run/cdi is where the chart's node agent and DRA
# driver write CDI specs, /var/lib/kubegpu the DRA driver's state (hostPath DirectoryOrCreate).
KUBELET_ROOT = Path("/var/lib/kubelet")
_FIXED_HOST_PATHS = (
    KUBELET_ROOT,
    Path("/var/log/containers"),
    Path("/var/run/cdi"),
    Path("/var/lib/kubegpu"),  # the chart's DRA driver keeps its checkpoint there
)
CREATED_HOST_PATHS = "created-host-paths"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, timeout=2, context=context) as response:
        return bool(response.status == 200)


def component_healthz(port: int) -> bool:
    """/healthz of a control-plane component on its secure port (self-signed certificate)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return http_ok(f"https://127.0.0.1:{port}/healthz", context)


def write_kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    *,
    user: str,
    client: KeyPair | None = None,
    token: str | None = None,
) -> Path:
    credentials: dict[str, str] = {}
    if client is not None:
        credentials = {"client-certificate": str(client.cert), "client-key": str(client.key)}
    if token is not None:
        credentials = {"token": token}
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "e2e", "user": user}}],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)
    return path


def _own_cgroup_base() -> str:
    """Our own memory cgroup, so that the pods' memory is accounted inside this job's."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path.rstrip("/")
    return ""


@dataclass
class Cluster:
    bin_dir: Path
    out_dir: Path
    # The features the scenarios want on or off; what each component is given is
    # `passed_gates`, this turned into what the built version accepts (kubegpu_e2e/versions.py).
    feature_gates: dict[str, bool] = field(default_factory=dict)
    # A containerd of our own build (e2e/components/containerd) instead of Debian's, with CDI
    # on and the run's CDI folder as its spec folder: what the DRA scenarios need.
    containerd_bin_dir: Path | None = None
    # Added to kube-controller-manager's flags (the scale replay turns node lifecycle off).
    controller_manager_flags: list[str] = field(default_factory=list)
    run_dir: Path = field(init=False)
    processes: dict[str, HostProcess] = field(init=False, default_factory=dict)
    stopped: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.kubernetes_version = binary_version(self.bin_dir)
        self.passed_gates = effective_gates(self.feature_gates, self.kubernetes_version)
        self.run_dir = Path(tempfile.mkdtemp(prefix="kgpu-e2e-", dir="/tmp"))
        self.logs = self.out_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pki_dir = self.run_dir / "pki"
        self.kubelet_root = KUBELET_ROOT
        # The real kubelet ignores --root-dir for device plugins: its registration socket is
        # always /var/lib/kubelet/device-plugins/kubelet.sock (pluginapi.KubeletSocket).
        self.device_plugin_dir = KUBELET_DEVICE_PLUGINS
        self.pod_resources_socket = self.kubelet_root / "pod-resources" / "kubelet.sock"
        self.cdi_dir = self.run_dir / "cdi"
        self.containerd_dir = self.run_dir / "containerd"
        self.containerd_socket = self.containerd_dir / "containerd.sock"
        self.cgroup_root = f"{_own_cgroup_base()}/{self.run_dir.name}"
        self.ports = {
            name: free_port()
            for name in (
                "etcd",
                "etcd-peer",
                "controller-manager",
                "scheduler",
                "kubelet",
                "kubelet-healthz",
            )
        }
        self.ports["apiserver"] = KUBERNETES_SERVICE_PORT
        self.server = f"https://127.0.0.1:{self.ports['apiserver']}"
        self.env = {
            **os.environ,
            "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}",
        }
        if self.containerd_bin_dir is not None:
            # containerd finds its shim (containerd-shim-runc-v2) on PATH: ours, not Debian's.
            self.env["PATH"] = f"{self.containerd_bin_dir}:{self.env['PATH']}"

    # ---------------------------------------------------------------- helpers for scenarios
    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig or self.admin)]
        result = subprocess.run(
            [*argv, *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}"
            )
        return result

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def wait_for(self, what: str, check: Any, timeout: float = 120, interval: float = 0.5) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except Exception as error:  # a scenario's probe may race an object's creation
                last = error
            else:
                if last:
                    return last
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")

    # ---------------------------------------------------------------- start
    def start(self) -> None:
        self.start_control_plane()
        self._start_default_scheduler()
        self._start_containerd()
        self._import_images()
        self.start_kubelet()

    def start_control_plane(self) -> None:
        """etcd, the API server and the controller-manager only: what a cluster of KWOK nodes
        (kubegpu_e2e/scale) needs, with no kubelet, runtime or default scheduler."""
        _require_own_network_namespace()
        self._claim_host_paths()
        self._pki()
        self._start_etcd()
        self._start_apiserver()
        self._start_controller_manager()

    def _claim_host_paths(self) -> None:
        socket_path = KUBELET_DEVICE_PLUGINS / "kubelet.sock"
        if socket_path.exists():
            with socket.socket(socket.AF_UNIX) as probe:
                probe.settimeout(1)
                try:
                    probe.connect(str(socket_path))
                except OSError:
                    socket_path.unlink()  # a stale socket of an earlier run
                else:
                    raise StartError(
                        f"a kubelet already serves {socket_path} on this machine; the suite "
                        "runs its own and cannot share that fixed path"
                    )
        created = [str(p) for p in _FIXED_HOST_PATHS if not p.exists()]
        (self.run_dir / CREATED_HOST_PATHS).write_text("\n".join(created))

    def _pki(self) -> None:
        ca = self.ca = CertificateAuthority(self.pki_dir)
        self.sa_keys = service_account_keys(self.pki_dir)
        self.apiserver_serving = ca.issue(
            "apiserver",
            common_name="kube-apiserver",
            ips=("127.0.0.1", KUBERNETES_SERVICE_IP),
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            server=True,
        )
        self.kubelet_serving = ca.issue(
            "kubelet-serving",
            common_name=NODE_NAME,
            ips=("127.0.0.1",),
            dns_names=(NODE_NAME, "localhost"),
            server=True,
        )
        self.apiserver_kubelet_client = ca.issue(
            "apiserver-kubelet-client",
            common_name="kube-apiserver-kubelet-client",
            organizations=("system:masters",),
        )
        clients = {
            "admin": ("kubegpu-e2e-admin", ("system:masters",)),
            "controller-manager": ("system:kube-controller-manager", ()),
            "scheduler": ("system:kube-scheduler", ()),
            "kubelet": (f"system:node:{NODE_NAME}", ("system:nodes",)),
        }
        self.kubeconfigs: dict[str, Path] = {}
        for name, (common_name, groups) in clients.items():
            pair = ca.issue(name, common_name=common_name, organizations=groups)
            self.kubeconfigs[name] = write_kubeconfig(
                self.pki_dir / f"{name}.kubeconfig",
                self.server,
                ca.cert,
                user=name,
                client=pair,
            )
        self.admin = self.kubeconfigs["admin"]
        self.admin_client = ca.issue(
            "admin-direct", common_name="kubegpu-e2e-admin", organizations=("system:masters",)
        )

    def _process(self, name: str, argv: Sequence[str]) -> HostProcess:
        process = HostProcess(name, argv, self.logs / f"{name}.log", env=self.env).start()
        self.processes[name] = process
        return process

    def _bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        process = self._process(
            "etcd",
            [
                self._bin("etcd"),
                "--name=e2e",
                f"--data-dir={self.run_dir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=e2e={peer}",
                "--unsafe-no-fsync",  # a throw-away cluster: durability buys nothing here
                "--log-level=warn",
            ],
        )
        process.wait_until(lambda: http_ok(f"{client}/health"), 60, "etcd health")

    def _tls_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        context.load_cert_chain(str(self.admin_client.cert), str(self.admin_client.key))
        return context

    def _gate_flags(self) -> list[str]:
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.passed_gates.items()))
        return [f"--feature-gates={gates}"] if gates else []

    def start_apiserver(self) -> None:
        """The API server again after a stop (the scale replay's fault scenario)."""
        self._start_apiserver()

    def _start_apiserver(self) -> None:
        argv = [
            self._bin("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            # Every address of the suite's own network namespace: 127.0.0.1 for the host
            # processes, the kubernetes Service's address for pods (KUBERNETES_SERVICE_IP).
            "--bind-address=0.0.0.0",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}",
            f"--tls-cert-file={self.apiserver_serving.cert}",
            f"--tls-private-key-file={self.apiserver_serving.key}",
            f"--client-ca-file={self.ca.cert}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.sa_keys.cert}",
            f"--service-account-signing-key-file={self.sa_keys.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--kubelet-client-certificate={self.apiserver_kubelet_client.cert}",
            f"--kubelet-client-key={self.apiserver_kubelet_client.key}",
            f"--kubelet-certificate-authority={self.ca.cert}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            # The kubernetes Service's endpoints would be 127.0.0.1, which Endpoints validation
            # refuses: nothing in the suite uses that Service.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        ]
        argv += self._gate_flags()
        process = self._process("kube-apiserver", argv)
        context = self._tls_context()
        process.wait_until(
            lambda: http_ok(f"{self.server}/readyz", context), 180, "API server /readyz"
        )

    def _component_auth(self, kubeconfig: Path) -> list[str]:
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
        ]

    def _start_controller_manager(self) -> None:
        port = self.ports["controller-manager"]
        process = self._process(
            "kube-controller-manager",
            [
                self._bin("kube-controller-manager"),
                *self._component_auth(self.kubeconfigs["controller-manager"]),
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--service-account-private-key-file={self.sa_keys.key}",
                f"--root-ca-file={self.ca.cert}",
                "--use-service-account-credentials=true",
                f"--cluster-signing-cert-file={self.ca.cert}",
                f"--cluster-signing-key-file={self.ca.key}",
                "--leader-elect=false",
                "--v=1",
                *self._gate_flags(),
                *self.controller_manager_flags,
            ],
        )
        process.wait_until(lambda: component_healthz(port), 120, "controller-manager /healthz")

    def start_default_scheduler(self) -> None:
        """The default kube-scheduler (the scale replay's "scheduler alone" run starts it on a
        control plane started alone)."""
        self._start_default_scheduler()

    def _start_default_scheduler(self) -> None:
        port = self.ports["scheduler"]
        process = self._process(
            "kube-scheduler",
            [
                self._bin("kube-scheduler"),
                *self._component_auth(self.kubeconfigs["scheduler"]),
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
                "--v=1",
                *self._gate_flags(),
            ],
        )
        process.wait_until(lambda: component_healthz(port), 120, "kube-scheduler /healthz")

    def _start_containerd(self) -> None:
        config = self.write_containerd_config(self.containerd_dir, self._cni_network())
        process = self._process(
            "containerd", [self._containerd("containerd"), "--config", str(config)]
        )
        process.wait_until(self.containerd_socket.exists, 60, "containerd's socket")

    def write_containerd_config(
        self, d: Path, cni_network: dict[str, Any], cdi_dir: Path | None = None
    ) -> Path:
        """containerd's config with root, state and sockets under ``d`` (``d/containerd.sock``)
        and ``cni_network`` as its only network; the multi-node cluster writes one per node."""
        cni_conf = d.parent / f"{d.name}-cni"
        cni_conf.mkdir()
        (cni_conf / "10-kubegpu-e2e.conflist").write_text(json.dumps(cni_network))
        config = d / "config.toml"
        d.mkdir()
        config.write_text(
            f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
[grpc]
  address = "{d / "containerd.sock"}"
[ttrpc]
  address = "{d / "containerd.sock.ttrpc"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{images.PAUSE_IMAGE}"
  # This machine withholds CAP_SYS_RESOURCE: a negative oom_score_adj cannot be set.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
{self._cdi_config(cdi_dir or self.cdi_dir)}  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
"""
        )
        return config

    def _cni_network(
        self,
        subnet: str = POD_CIDR,
        gateway: str = POD_GATEWAY,
        ipam_dir: Path | None = None,
    ) -> dict[str, Any]:
        """Each pod: its own network namespace with lo and an eth0 (containerd needs one: with
        lo alone it fails the sandbox, "failed to find network info for sandbox"), the other
        end of whose veth is in the suite's namespace. The pod's only routes are to the gateway
        and to the Service range (the API server), none by default: anything else is
        unreachable from inside the pod, and the suite's namespace has no route out either."""
        return {
            "cniVersion": "1.0.0",
            "name": "kubegpu-e2e",
            "plugins": [
                {
                    "type": "ptp",
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(ipam_dir or self.run_dir / "cni-ipam"),
                        "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                        "routes": [{"dst": SERVICE_CIDR}],
                    },
                }
            ],
        }

    def _containerd(self, name: str) -> str:
        """containerd or ctr: ours when the cluster has its own build, else the machine's."""
        return str(self.containerd_bin_dir / name) if self.containerd_bin_dir else name

    def _cdi_config(self, cdi_dir: Path) -> str:
        # A version-2 config, which containerd 2 migrates on load (its CRI section splits into
        # io.containerd.cri.v1.runtime and .images); the same file then serves both versions.
        if self.containerd_bin_dir is None:
            return ""
        # The run's folder for the driver as a host process, /var/run/cdi for the chart's.
        return f'  enable_cdi = true\n  cdi_spec_dirs = ["{cdi_dir}", "/var/run/cdi"]\n'

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                self._containerd("ctr"),
                "--address",
                str(self.containerd_socket),
                "--namespace",
                "k8s.io",
                *args,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )

    def _import_images(self) -> None:
        build = self.run_dir / "images"
        build.mkdir()
        pause_source = _pause_source()
        for tar in (images.build_pause(build, pause_source), images.build_workload(build)):
            self.ctr("images", "import", "--no-unpack=false", str(tar))

    def import_image(self, archive: Path) -> None:
        """An OCI archive into the cluster's containerd (namespace k8s.io): no registry."""
        self.ctr("images", "import", "--no-unpack=false", str(archive))

    def _kubelet_config(self) -> Path:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": self.ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.ports["kubelet-healthz"],
            "tlsCertFile": str(self.kubelet_serving.cert),
            "tlsPrivateKeyFile": str(self.kubelet_serving.key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.ca.cert)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            # The machines here are cgroup v1; kubelet >= 1.35 refuses v1 unless told not to.
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "podLogsDir": str(self.run_dir / "pod-logs"),
            # No cluster DNS and no host resolv.conf in pods: nothing to resolve, nowhere to ask.
            "resolvConf": "",
            "maxPods": 400,
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "protectKernelDefaults": False,
            "featureGates": dict(self.passed_gates),
            "shutdownGracePeriod": "0s",
        }
        path = self.run_dir / "kubelet-config.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def _make_cgroups(self) -> None:
        for hierarchy in _cgroup_hierarchies():
            (hierarchy / self.cgroup_root.lstrip("/")).mkdir(parents=True, exist_ok=True)

    def start_kubelet(self) -> None:
        self._make_cgroups()
        self.kubelet_root.mkdir(exist_ok=True)
        process = self._process(
            "kubelet",
            [
                self._bin("kubelet"),
                f"--config={self._kubelet_config()}",
                f"--kubeconfig={self.kubeconfigs['kubelet']}",
                f"--root-dir={self.kubelet_root}",
                f"--cert-dir={self.run_dir / 'kubelet-pki'}",
                f"--hostname-override={NODE_NAME}",
                "--node-ip=127.0.0.1",
                "--v=2",
            ],
        )
        healthz = f"http://127.0.0.1:{self.ports['kubelet-healthz']}/healthz"
        process.wait_until(lambda: http_ok(healthz), 120, "kubelet /healthz")
        process.wait_until(self._node_ready, 120, f"Node {NODE_NAME} Ready")
        self._give_node_its_address()

    def stop_kubelet(self) -> None:
        self.processes["kubelet"].stop(grace=15)

    def _node_ready(self) -> bool:
        node = self.get("node", NODE_NAME)
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]
        )

    def _give_node_its_address(self) -> None:
        # The kubelet refuses a loopback --node-ip ("nodeIP can't be loopback address") and so
        # publishes no address at all; the API server then cannot reach it for logs. Its later
        # status updates leave addresses alone after that validation fails, so the address we
        # set here stays.
        node = self.get("node", NODE_NAME)
        if node["status"].get("addresses"):
            return
        patch = {
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": NODE_NAME},
                ]
            }
        }
        self.kubectl(
            "patch",
            "node",
            NODE_NAME,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(patch),
        )

    # ---------------------------------------------------------------- stop
    def stop(self) -> list[str]:
        """Stop everything and leave nothing behind; returns what had to be cleaned by force.
        A second call does nothing (the DRA scenarios stop the default cluster early)."""
        if self.stopped:
            return []
        self.stopped = True
        leftovers: list[str] = []
        order = [n for n in reversed(self.processes) if n not in ("etcd", "kube-apiserver")]
        for name in order:
            self.processes[name].stop(grace=10)
        # containerd does not stop its shims on exit, by design; the containers' processes
        # live in our cgroups. Both go now.
        control_plane = {
            self.processes[n].popen.pid  # type: ignore[union-attr]
            for n in ("kube-apiserver", "etcd")
            if n in self.processes and self.processes[n].running
        }
        for _ in range(20):
            pids = [
                pid
                for pid in pids_mentioning(str(self.run_dir)) + cgroup_pids(self.run_dir.name)
                if pid not in control_plane
            ]
            if not pids:
                break
            leftovers.append(f"killed {len(pids)} container/shim processes")
            kill_all(pids)
            time.sleep(0.25)
        for name in ("kube-apiserver", "etcd"):
            if name in self.processes:
                self.processes[name].stop(grace=10)
        leftovers += unmount_all(self.run_dir)
        leftovers += unmount_all(self.kubelet_root)
        leftovers += remove_cgroups(self.run_dir.name)
        leftovers += remove_created_host_paths(self.run_dir)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.run_dir.exists():
            leftovers.append(f"could not remove {self.run_dir}")
        return leftovers


def _require_own_network_namespace() -> None:
    """The cluster binds the API server to every address of its network namespace and gives
    pods routes into it: that must be the namespace e2e/run makes, with no route out of this
    machine and the kubernetes Service's address on its loopback, never the machine's own."""
    routes = Path("/proc/self/net/route").read_text().splitlines()[1:]
    default = [line for line in routes if line.split()[1] == "00000000"]
    addresses = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "dev", "lo"], capture_output=True, text=True
    ).stdout
    if default or f" {KUBERNETES_SERVICE_IP}/32 " not in addresses:
        raise StartError(
            "the e2e cluster runs only inside the network namespace e2e/run makes for it, "
            "with no default route and the kubernetes Service's address on lo (run the suite "
            "as e2e/run [pytest args], not pytest directly)"
        )


def cgroup_pids(run_name: str) -> list[int]:
    """Every process in a cgroup of the run (named after its folder), in any hierarchy."""
    pids: set[int] = set()
    for hierarchy in _cgroup_hierarchies():
        for root in hierarchy.rglob(run_name):
            for procs in root.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
    return sorted(pids)


def unmount_all(run_dir: Path) -> list[str]:
    done = []
    for _ in range(5):
        points = mounts_under(run_dir)
        if not points:
            break
        for point in points:
            if subprocess.run(["umount", point], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True)
            done.append(f"unmounted {point}")
    return done


def remove_cgroups(run_name: str) -> list[str]:
    """Remove the run's cgroups, deepest first; name those that would not go."""
    left = []
    for hierarchy in _cgroup_hierarchies():
        for root in hierarchy.rglob(run_name):
            for directory in sorted(
                (p for p in root.rglob("*") if p.is_dir()),
                key=lambda p: len(p.parts),
                reverse=True,
            ):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()
            if root.exists():
                left.append(f"cgroup {root} still there")
    return left


def remove_created_host_paths(run_dir: Path) -> list[str]:
    """The fixed host paths this run created (kubelet.sock and the checkpoint live there)."""
    record = run_dir / CREATED_HOST_PATHS
    if not record.exists():
        return []
    removed = []
    for line in record.read_text().splitlines():
        path = Path(line)
        if line and path.exists():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(f"removed {path}")
    return removed


def mounts_under(folder: Path) -> list[str]:
    """Mount points at or below `folder`, deepest first."""
    points = []
    prefix = str(folder)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"), reverse=True)


def _cgroup_hierarchies() -> list[Path]:
    if not _CGROUP_HIERARCHIES.exists():
        return []
    return [
        p
        for p in sorted(_CGROUP_HIERARCHIES.iterdir())
        if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists()
    ]


def _pause_source() -> Path:
    """Kubernetes' pause.c, from the module cache the component build filled."""
    gomodcache = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
    ).stdout.strip()
    version = os.environ.get("KUBEGPU_E2E_K8S_VERSION", "")
    candidates = sorted(Path(gomodcache, "k8s.io").glob(f"kubernetes@{version or 'v'}*"))
    for module in reversed(candidates):
        source = module / "build" / "pause" / "linux" / "pause.c"
        if source.exists():
            return source
    raise StartError(f"pause.c not found under {gomodcache}/k8s.io/kubernetes@{version}")
