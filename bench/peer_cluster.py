"""The cluster side of ``bench/peer_gpushare.py``: a bare control plane, the two extenders as
processes, and the nodes and pods each one expects.

* **Control plane**: etcd and kube-apiserver built by ``e2e/components/build.sh`` (the suite's
  cache, ``~/.cache/kubegpu-e2e``), on loopback ports of their own, with certificates from the
  suite's ``kubegpu_e2e.pki``. No kubelet, no controller-manager, no kube-scheduler: nodes are
  plain Node objects, and the bench plays kube-scheduler by calling the extenders' verbs.
* **Gpushare's extender** is built from a checkout of its repository with ``go build`` (its
  dependencies from the Go module proxy) into a folder keyed by a hash of its sources and the Go
  version, and reused from there.
* **Nodes**, as each system's node agent would publish them: for kubegpu, the inventory
  annotation and the device counts its node-agent code computes for a fake backend of the cards
  (as ``kubegpu_e2e/scale/fleet.py`` does), plus the peer figures of aliyun compat mode; for
  gpushare, ``aliyun.com/gpu-mem`` (the node's total, in GiB: each card's MiB rounded down to
  GiB, as its device plugin counts) and ``aliyun.com/gpu-count`` (the cards).
* **Pods**: one container asking ``aliyun.com/gpu-mem`` in limits. kubegpu's pods are created
  in the form kubegpu's peer webhook makes of them (``kubegpu.sharing.peers.admission_patch``:
  one share slot added), since nothing here runs the webhook.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import lightkube
import yaml
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, Pod, ServiceAccount
from lightkube.types import PatchType

from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.inventory.spec import parse_fake_spec
from kubegpu.kube.client import load_kubeconfig_file
from kubegpu.kube.inventory import publish_node_inventory_async
from kubegpu.kubelet.cluster import inventory_records
from kubegpu.sharing.peers import (
    ALIYUN,
    ALIYUN_COUNT,
    ALIYUN_MEMORY,
    admission_patch,
    admission_refusal,
    node_capacity,
    peer_compat,
)
from kubegpu.sharing.resources import ResourceNames

REPO = Path(__file__).resolve().parents[1]
E2E = REPO / "e2e"
sys.path.insert(0, str(E2E))
# The e2e suite's own pieces: certificates, host processes, the components' build and the
# device counts kubegpu's node agent advertises.
from kubegpu_e2e.cluster import free_port, http_ok, write_kubeconfig  # noqa: E402
from kubegpu_e2e.pki import CertificateAuthority, service_account_keys  # noqa: E402
from kubegpu_e2e.processes import HostProcess, built  # noqa: E402
from kubegpu_e2e.scale.fleet import advertised  # noqa: E402
from kubegpu_e2e.scale.replay import delete_run  # noqa: E402

PEER_MODULE = "github.com/AliyunContainerService/gpushare-scheduler-extender"
PEER_BINARY = "gpushare-sche-extender"
# gpushare's annotations on a pod it binds (its pkg/utils/const.go): the card's index and the
# pod's memory in GiB.
PEER_CARD_INDEX = "ALIYUN_COM_GPU_MEM_IDX"
PEER_POD_MEMORY = "ALIYUN_COM_GPU_MEM_POD"
PEERS = peer_compat([ALIYUN])
NAMES = ResourceNames(peers=PEERS)
# Ample for any packing: GPU memory is the only limit.
NODE_BASE = {"cpu": "256", "memory": "2048Gi", "pods": "1000"}
POD_REQUESTS = {"cpu": "100m", "memory": "256Mi"}
IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: nothing runs the pods
SCHEDULER_NAME = "kubegpu-bench"  # no scheduler of that name runs: the bench binds
_UUIDS = uuid.UUID("9a1c3f0e-6b2d-4e57-8f14-2d0b5c7a9e31")


def k8s_bin_dir() -> Path:
    """The e2e suite's Kubernetes binaries: KUBEGPU_E2E_BIN, else e2e/components/build.sh's
    cache (built there on first use, 10-20 minutes)."""
    found: Path = built("KUBEGPU_E2E_BIN", E2E / "components" / "build.sh")
    return found


# --------------------------------------------------------------------------- control plane
class ControlPlane:
    """etcd and kube-apiserver on loopback, files and logs under ``work``."""

    def __init__(self, bin_dir: Path, work: Path) -> None:
        self.bin_dir = bin_dir
        self.work = work
        self.logs = work / "logs"
        self.processes: list[HostProcess] = []
        self.server = ""
        self.kubeconfig = work / "admin.kubeconfig"

    def start(self) -> None:
        pki = self.work / "pki"
        ca = CertificateAuthority(pki)
        sa = service_account_keys(pki)
        serving = ca.issue(
            "apiserver",
            common_name="kube-apiserver",
            ips=("127.0.0.1",),
            dns_names=("localhost",),
            server=True,
        )
        admin = ca.issue(
            "admin", common_name="kubegpu-bench-admin", organizations=("system:masters",)
        )
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        client_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = self._start(
            "etcd",
            [
                "--name=bench",
                f"--data-dir={self.work / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=bench={peer_url}",
                "--unsafe-no-fsync",  # a throw-away cluster
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        etcd.wait_until(lambda: http_ok(f"{client_url}/health"), 60, "etcd health")
        self.server = f"https://127.0.0.1:{api_port}"
        apiserver = self._start(
            "kube-apiserver",
            [
                f"--etcd-servers={client_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={ca.cert}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={sa.cert}",
                f"--service-account-signing-key-file={sa.key}",
                "--service-cluster-ip-range=10.96.0.0/24",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
            ],
        )
        context = ssl.create_default_context(cafile=str(ca.cert))
        context.load_cert_chain(str(admin.cert), str(admin.key))
        apiserver.wait_until(
            lambda: http_ok(f"{self.server}/readyz", context), 180, "API server /readyz"
        )
        write_kubeconfig(self.kubeconfig, self.server, ca.cert, user="admin", client=admin)

    def _start(self, name: str, args: Sequence[str]) -> HostProcess:
        process = HostProcess(
            name, [str(self.bin_dir / name), *args], self.logs / f"{name}.log"
        ).start()
        self.processes.append(process)
        return process

    def client(self) -> lightkube.AsyncClient:
        config = load_kubeconfig_file(self.kubeconfig)
        return lightkube.AsyncClient(config, field_manager="kubegpu-bench-peer")

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop(grace=10)
        self.processes.clear()


# --------------------------------------------------------------------------- gpushare's binary
def _sources(source: Path) -> list[Path]:
    return sorted(
        p
        for p in source.rglob("*")
        if p.is_file()
        and ".git" not in p.relative_to(source).parts
        and (p.suffix == ".go" or p.name in ("go.mod", "go.sum"))
    )


def source_commit(source: Path) -> str:
    """The checkout's commit (with ``-dirty`` when it has changes), or ``""`` outside git."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(source), *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    if commit and git("status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    return commit


def peer_binary(source: Path, cache_root: Path) -> Path:
    """gpushare's extender built from the checkout ``source``: from the cache when a build of
    the same sources by the same Go is there, else ``go build ./cmd`` of a copy of the checkout
    (the checkout is never written to), at nice 19."""
    go_mod = source / "go.mod"
    if not go_mod.is_file() or f"module {PEER_MODULE}" not in go_mod.read_text():
        raise SystemExit(
            f"--peer-source {source}: no go.mod of {PEER_MODULE} there; get it with "
            "git clone https://github.com/AliyunContainerService/gpushare-scheduler-extender"
        )
    go_version = subprocess.run(
        ["go", "env", "GOVERSION"], capture_output=True, text=True, check=True
    ).stdout.strip()
    digest = hashlib.sha256(go_version.encode())
    for path in _sources(source):
        digest.update(str(path.relative_to(source)).encode() + b"\0")
        digest.update(path.read_bytes())
    folder = cache_root / f"gpushare-{digest.hexdigest()[:16]}"
    binary = folder / PEER_BINARY
    if binary.is_file():
        return binary
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpushare-build-") as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns(".git"))
        flags = f"{os.environ.get('GOFLAGS', '')} -mod=mod".strip()
        print(f"building gpushare's extender from {source} ({go_version}) ...", file=sys.stderr)
        done = subprocess.run(
            ["nice", "-n", "19", "go", "build", "-o", str(Path(tmp) / PEER_BINARY), "./cmd"],
            cwd=copy,
            env={**os.environ, "GOFLAGS": flags},
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"go build of {source} failed:\n{done.stderr[-4000:]}")
        shutil.move(str(Path(tmp) / PEER_BINARY), binary)
    (folder / "source.txt").write_text(
        f"{source.resolve()}\n{source_commit(source) or 'not a git checkout'}\n{go_version}\n"
    )
    return binary


# --------------------------------------------------------------------------- extenders
@dataclass
class Extender:
    """One extender process: where it listens and the process (for its CPU time)."""

    process: HostProcess
    base: str  # http://127.0.0.1:<port>
    prefix: str  # the verbs are base + prefix + "/filter", "/prioritize", "/bind"
    ready_path: str  # answers 200 once the extender serves

    def verb(self, name: str) -> str:
        return f"{self.base}{self.prefix}/{name}"

    @property
    def pid(self) -> int:
        assert self.process.popen is not None
        pid: int = self.process.popen.pid
        return pid

    def stop(self) -> None:
        self.process.stop(grace=15)


def start_kubegpu(plane: ControlPlane, policy: str) -> Extender:
    port = free_port()
    process = HostProcess(
        f"kubegpu-extender-{policy}",
        [
            sys.executable,
            "-m",
            "kubegpu",
            "--log-level",
            "warning",
            "extender",
            f"--kubeconfig={plane.kubeconfig}",
            f"--port={port}",
            f"--policy={policy}",
            f"--peer-compat={ALIYUN}",
            # One extender and no kube-scheduler Lease to follow: binds are never gated.
            "--leader-lease=none",
        ],
        plane.logs / f"kubegpu-extender-{policy}.log",
        env={**os.environ, "NO_PROXY": "*"},
    ).start()
    return Extender(process, f"http://127.0.0.1:{port}", "", "/readyz")


def start_peer(plane: ControlPlane, binary: Path, log_level: str) -> Extender:
    port = free_port()
    process = HostProcess(
        "gpushare-extender",
        [str(binary)],
        plane.logs / "gpushare-extender.log",
        # Its whole configuration: KUBECONFIG, PORT, LOG_LEVEL (cmd/main.go).
        env={
            **os.environ,
            "KUBECONFIG": str(plane.kubeconfig),
            "PORT": str(port),
            "LOG_LEVEL": log_level,
            "NO_PROXY": "*",
        },
    ).start()
    # Its routes (pkg/routes/routes.go): POST /gpushare-scheduler/filter and /bind, GET /version;
    # it listens once its informers have synced.
    return Extender(process, f"http://127.0.0.1:{port}", "/gpushare-scheduler", "/version")


# --------------------------------------------------------------------------- nodes
def card_spec(name: str, cards: int, model: str, card_mib: int) -> str:
    """The fake-GPU spec of a node's cards (the YAML ``--fake-gpus`` reads)."""
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-{uuid.uuid5(_UUIDS, f'{name}/{i}')}",
            "product_name": model,
            "memory_total_mib": card_mib,
            "pci_bus_id": f"00000000:{0x10 + i:02X}:00.0",
        }
        for i in range(cards)
    ]
    return yaml.safe_dump({"description": f"bench node {name}", "gpus": gpus})


def _node(name: str, capacity: dict[str, str]) -> Node:
    return cast(
        Node,
        Node.from_dict(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                # The API server keeps a Node's status on create: capacity as a kubelet reports it.
                "status": {"capacity": capacity, "allocatable": dict(capacity)},
            }
        ),
    )


async def create_nodes(
    client: lightkube.AsyncClient,
    names: Sequence[str],
    *,
    kubegpu: bool,
    cards: int,
    model: str,
    card_mib: int,
) -> None:
    """The nodes as kubegpu's node agent (``kubegpu``) or gpushare's device plugin would
    publish them."""
    gate = asyncio.Semaphore(16)

    async def one(name: str) -> None:
        async with gate:
            if kubegpu:
                spec = parse_fake_spec(
                    card_spec(name, cards, model, card_mib), name=name, source=name
                )
                inventory = FakeGpuBackend(spec).snapshot()
                capacity = {
                    **NODE_BASE,
                    **advertised(inventory),
                    **node_capacity(PEERS, [card_mib] * cards),
                }
            else:
                capacity = {
                    **NODE_BASE,
                    ALIYUN_MEMORY: str(cards * (card_mib // 1024)),
                    ALIYUN_COUNT: str(cards),
                }
            await client.create(_node(name, capacity))
            # TaintNodesByCondition gives a new Node the not-ready taint; no node lifecycle
            # controller runs to lift it.
            await client.patch(Node, name, {"spec": {"taints": None}}, patch_type=PatchType.MERGE)
            if kubegpu:
                await publish_node_inventory_async(client, name, inventory_records(inventory))

    await asyncio.gather(*(one(n) for n in names))


async def delete_nodes(client: lightkube.AsyncClient, names: Sequence[str]) -> None:
    gate = asyncio.Semaphore(16)

    async def one(name: str) -> None:
        async with gate:
            with contextlib.suppress(lightkube.ApiError):
                await client.delete(Node, name)

    await asyncio.gather(*(one(n) for n in names))


# --------------------------------------------------------------------------- pods
def _apply_adds(doc: dict[str, Any], ops: Sequence[dict[str, Any]]) -> None:
    """Apply JSON Patch ``add`` operations (the only kind the peer webhook emits)."""
    for op in ops:
        assert op["op"] == "add", op
        *parents, last = (
            part.replace("~1", "/").replace("~0", "~") for part in op["path"].split("/")[1:]
        )
        target: Any = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        target[last] = op["value"]


def pod_manifest(name: str, namespace: str, gib: int, *, kubegpu: bool) -> dict[str, Any]:
    """A pod asking ``gib`` GiB of ``aliyun.com/gpu-mem``; for kubegpu, as its peer webhook
    admits it."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "resources": {
                        "limits": {ALIYUN_MEMORY: str(gib)},
                        "requests": dict(POD_REQUESTS),
                    },
                }
            ],
        },
    }
    if kubegpu:
        key = f"{namespace}/{name}"
        refusal = admission_refusal(pod, PEERS, whole_gpu=NAMES.whole_gpu, key=key)
        assert not refusal, refusal
        _apply_adds(pod, admission_patch(pod, PEERS, NAMES.share_slot))
    return pod


async def create_namespace(client: lightkube.AsyncClient, namespace: str) -> None:
    """The namespace and its ``default`` ServiceAccount (which kube-controller-manager would
    make; the API server refuses pods until it exists)."""
    await client.create(Namespace(metadata=ObjectMeta(name=namespace)))
    await client.create(ServiceAccount(metadata=ObjectMeta(name="default", namespace=namespace)))


async def create_pods(
    client: lightkube.AsyncClient, namespace: str, sizes: Sequence[int], *, kubegpu: bool
) -> list[dict[str, Any]]:
    """Every pod, Pending, ``pod-00000`` on; returns them in that order as the API server
    answered (what kube-scheduler's informer would hand the extenders)."""
    gate = asyncio.Semaphore(16)

    async def one(index: int, gib: int) -> dict[str, Any]:
        name = f"pod-{index:05d}"
        async with gate:
            pod = cast(Pod, Pod.from_dict(pod_manifest(name, namespace, gib, kubegpu=kubegpu)))
            created = await client.create(pod)
        return cast(dict[str, Any], created.to_dict())

    return list(await asyncio.gather(*(one(i, g) for i, g in enumerate(sizes))))


async def list_pods(client: lightkube.AsyncClient, namespace: str) -> list[dict[str, Any]]:
    return [p.to_dict() async for p in client.list(Pod, namespace=namespace)]


async def delete_pods(client: lightkube.AsyncClient, namespace: str) -> None:
    await delete_run(client, namespace)
