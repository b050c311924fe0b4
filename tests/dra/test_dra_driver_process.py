"""``kubegpu dra-driver`` as a real process: a fake GPU node, the DRA API over real HTTP
(tests/dra/resource_api.py, served from a thread), the kubelet's side over the real sockets.

It must publish the node's ResourceSlices, prepare a claim into a CDI spec, taint a GPU that
gets a critical Xid and untaint it once the health policy says it recovered, and stop on
SIGTERM with both sockets gone and nothing of its process group left running. A second driver
on the same kubelet folder waits for the first and takes over when it exits; a checkpoint file
it cannot read (a FIFO, bytes that are not UTF-8, ...) exits 1 with one line naming it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from aiohttp import web

from kubegpu.dra.api.dra.v1 import api_pb2 as v1
from kubegpu.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from kubegpu.dra.api.pluginregistration.v1 import api_pb2 as reg
from kubegpu.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubegpu.dra.checkpoint import checksum
from kubegpu.inventory.fake import send_fake_gpu_command
from kubegpu.roles.dra_driver import socket_paths
from kubegpu.socket_claim import socket_identity
from kubegpu.testing.kubeconfig import kubeconfig_dict
from kubegpu.testing.waiting import wait_until

from ..enforcement.fakes import install_fake_mps_control
from .resource_api import ResourceApi

pytestmark = pytest.mark.timeout(180)

NODE = "node-a"
DRIVER = "gpu.kubegpu.io"
WAIT_S = 60.0  # generous: the machine is shared; never an assertion about speed


@contextmanager
def api_in_thread(api: ResourceApi) -> Iterator[str]:
    """Serve ``api`` on 127.0.0.1 from its own loop in a thread; yields the URL."""
    loop = asyncio.new_event_loop()
    ready: list[Any] = []

    async def start() -> web.AppRunner:
        runner = web.AppRunner(api.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ready.append(runner.addresses[0][1])
        return runner

    runner = loop.run_until_complete(start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{ready[0]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def wait_for(check: Callable[[], Any], what: str, proc: subprocess.Popen[bytes], log: Path) -> Any:
    def ready() -> Any:
        value = check()
        if not value and proc.poll() is not None:
            pytest.fail(f"driver exited {proc.returncode} waiting for {what}:\n{log.read_text()}")
        return value

    try:
        return wait_until(ready, timeout_s=WAIT_S, what=lambda: f"{what}:\n{log.read_text()}")
    except TimeoutError as exc:
        pytest.fail(str(exc))


class Driver:
    """``kubegpu dra-driver`` on the folders under ``root``; drivers of one ``root`` share the
    kubelet, CDI and state folders (as two pods of the DaemonSet on one node do), each with
    its own log and fake-GPU control socket, named by ``tag``."""

    def __init__(
        self, root: Path, url: str, config: dict[str, Any], tag: str = "driver", *args: str
    ) -> None:
        self.root = root
        self.kubelet_dir = root / "kubelet"
        self.cdi_dir = root / "cdi"
        self.control = root / f"{tag}-fake.sock"
        self.log = root / f"{tag}.log"
        self.sockets = socket_paths(self.kubelet_dir)
        (root / "kubeconfig").write_text(yaml.safe_dump(kubeconfig_dict(url)))
        (root / "config.yaml").write_text(yaml.safe_dump({"version": "v1", **config}))
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kubegpu.cli.main",
                    "dra-driver",
                    "--backend=fake",
                    "--fake-gpus=4xT4",
                    f"--fake-control={self.control}",
                    f"--kubelet-dir={self.kubelet_dir}",
                    f"--cdi-dir={self.cdi_dir}",
                    f"--state-dir={root / 'state'}",
                    f"--config={root / 'config.yaml'}",
                    f"--kubeconfig={root / 'kubeconfig'}",
                    f"--node-name={NODE}",
                    *args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"},
            )

    def wait(self, check: Callable[[], Any], what: str) -> Any:
        return wait_for(check, what, self.proc, self.log)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(WAIT_S)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def group_is_gone(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return True
        return False


@pytest.fixture
def api() -> ResourceApi:
    return ResourceApi()


@pytest.fixture
def driver(
    short_dir: Path, api: ResourceApi, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Driver]]:
    """Starts a driver on ``short_dir`` with a config (a tag for a second one, then options)."""
    started: list[Driver] = []
    with api_in_thread(api) as url:

        def start(config: dict[str, Any], tag: str = "driver", *args: str) -> Driver:
            d = Driver(short_dir, url, config, tag, *args)
            started.append(d)
            return d

        yield start
        for d in started:
            if d.proc.poll() is None:
                d.stop()


def node_devices(api: ResourceApi) -> dict[str, dict[str, Any]]:
    return {
        d["name"]: d
        for s in list(api.slices.values())
        if s["spec"].get("nodeName") == NODE
        for d in s["spec"]["devices"]
    }


def claim(uid: str, device: str, capacity: dict[str, str]) -> dict[str, Any]:
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    if capacity:
        result |= {"shareID": f"share-{uid}", "consumedCapacity": capacity}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "train", "namespace": "team-a", "uid": uid},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def prepare(sock: Path, uid: str) -> Any:
    with grpc.insecure_channel(f"unix://{sock}") as channel:
        return v1_grpc.DRAPluginStub(channel).NodePrepareResources(
            v1.NodePrepareResourcesRequest(
                claims=[v1.Claim(namespace="team-a", name="train", uid=uid)]
            ),
            timeout=30,
        )


def test_serves_the_kubelet_and_stops_cleanly_on_sigterm(
    driver: Callable[..., Driver], api: ResourceApi
) -> None:
    d = driver({"gpuAllocation": "dra"})
    devices = d.wait(lambda: node_devices(api), "ResourceSlice")
    assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert not any("taints" in dev for dev in devices.values())
    d.wait(lambda: d.sockets.registration.exists() and d.sockets.dra.exists(), "sockets")

    with grpc.insecure_channel(f"unix://{d.sockets.registration}") as channel:
        info = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=30)
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(d.sockets.dra))

    uid = "cccccccc-0000-4000-8000-000000000001"
    api.claims[("team-a", "train")] = claim(uid, "gpu-1", {"memory": "2Gi", "compute": "250"})
    response = prepare(d.sockets.dra, uid)
    assert response.claims[uid].error == ""
    (device,) = response.claims[uid].devices
    assert device.device_name == "gpu-1"
    spec = json.loads((d.cdi_dir / f"kubegpu-dra-{uid}.json").read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    assert "KUBEGPU_GPU_MEMORY_LIMIT_MIB=2048" in env
    assert "KUBEGPU_GPU_ENFORCEMENT=none" in env
    assert not any(e.startswith("CUDA_MPS_") for e in env)

    assert d.stop() == 0, d.log.read_text()
    assert not d.sockets.registration.exists()
    assert not d.sockets.dra.exists()
    assert d.group_is_gone()
    assert "Traceback" not in d.log.read_text()


def test_taints_a_gpu_after_a_critical_xid_and_untaints_it_after_recovery(
    driver: Callable[..., Driver], api: ResourceApi
) -> None:
    # 25 clean health checks (0.2 s each) bring a GPU back.
    d = driver({"gpuAllocation": "dra", "health": {"recoverAfterHealthyChecks": 25}})
    d.wait(lambda: node_devices(api) and d.control.exists(), "ResourceSlice")
    first_generation = next(iter(api.slices.values()))["spec"]["pool"]["generation"]

    reply = send_fake_gpu_command(d.control, "xid", gpu=2, xid=48)
    assert reply["ok"], reply
    tainted = d.wait(lambda: "taints" in node_devices(api)["gpu-2"], "taint on gpu-2")
    assert tainted
    devices = node_devices(api)
    (taint,) = devices["gpu-2"]["taints"]
    assert (taint["key"], taint["effect"]) == (f"{DRIVER}/unhealthy", "NoSchedule")
    assert "48" in taint["value"]
    assert [n for n, dev in devices.items() if "taints" in dev] == ["gpu-2"]

    d.wait(lambda: "taints" not in node_devices(api)["gpu-2"], "gpu-2 untainted")
    generation = next(iter(api.slices.values()))["spec"]["pool"]["generation"]
    assert generation >= first_generation + 2  # tainted, then untainted: two new generations
    assert d.stop() == 0, d.log.read_text()
    assert d.group_is_gone()


def test_each_class_of_nvidias_xid_catalog_taints_the_slice_as_the_catalog_says(
    driver: Callable[..., Driver], api: ResourceApi
) -> None:
    # No quiet-check recovery: only the fake's restore (the GPU reset and answering) clears one.
    d = driver({"gpuAllocation": "dra"})
    d.wait(lambda: node_devices(api) and d.control.exists(), "ResourceSlice")
    # application only (94), no action (63), GPU reset (95), node reboot (79): docs/xid-policy.md
    for gpu, xid in ((0, 94), (1, 63), (2, 95), (3, 79)):
        reply = send_fake_gpu_command(d.control, "xid", gpu=gpu, xid=xid)
        assert reply["ok"], reply
    d.wait(
        lambda: all("taints" in node_devices(api)[name] for name in ("gpu-2", "gpu-3")),
        "taints on gpu-2 and gpu-3",
    )
    # Each GPU's own monitor logs the Xids it lets pass: proof they were judged, not unseen.
    d.wait(
        lambda: all(f"ignoring Xid {xid} " in d.log.read_text() for xid in (94, 63)),
        "Xids 94 and 63 judged",
    )
    devices = node_devices(api)
    assert [n for n, dev in devices.items() if "taints" in dev] == ["gpu-2", "gpu-3"]
    for name, xid in (("gpu-2", "95"), ("gpu-3", "79")):
        (taint,) = devices[name]["taints"]
        assert (taint["key"], taint["effect"]) == (f"{DRIVER}/unhealthy", "NoSchedule")
        assert xid in taint["value"]

    for gpu in (2, 3):
        assert send_fake_gpu_command(d.control, "restore", gpu=gpu)["ok"]
    d.wait(lambda: "taints" not in node_devices(api)["gpu-2"], "gpu-2 untainted after its reset")
    d.wait(
        lambda: "GPU 3 (" in d.log.read_text() and "stays unhealthy" in d.log.read_text(),
        "GPU 3 answering again judged",
    )
    # GPU 3's verdict never flipped, so nothing republished its device: still tainted.
    assert "taints" in node_devices(api)["gpu-3"]
    assert [n for n, dev in node_devices(api).items() if "taints" in dev] == ["gpu-3"]
    assert d.stop() == 0, d.log.read_text()


def test_enforcement_mps_runs_the_daemon_and_hands_a_share_its_limits(
    driver: Callable[..., Driver], api: ResourceApi, short_dir: Path
) -> None:
    daemon = install_fake_mps_control(short_dir)
    mps_dir = short_dir / "mps"
    d = driver(
        {
            "gpuAllocation": "dra",
            "dra": {
                "enforcement": "mps",
                "mps": {"controlCommand": str(daemon), "hostDir": str(mps_dir)},
            },
        }
    )
    d.wait(lambda: node_devices(api) and d.sockets.dra.exists(), "driver up")
    control_log = mps_dir / "log" / "control.log"
    started = d.wait(lambda: control_log.exists() and control_log.read_text(), "MPS daemon")
    gpus = started.split("gpus=")[1].split()[0]
    assert len(gpus.split(",")) == 4  # every GPU of the node

    uid = "dddddddd-0000-4000-8000-000000000001"
    api.claims[("team-a", "train")] = claim(uid, "gpu-0", {"memory": "4Gi", "compute": "250"})
    assert prepare(d.sockets.dra, uid).claims[uid].error == ""
    edits = json.loads((d.cdi_dir / f"kubegpu-dra-{uid}.json").read_text())["devices"][0][
        "containerEdits"
    ]
    env = dict(e.split("=", 1) for e in edits["env"])
    uuid = env["KUBEGPU_GPU_UUID"]
    assert env["KUBEGPU_GPU_ENFORCEMENT"] == "mps"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(mps_dir / "pipe")
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(mps_dir / "log")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{uuid}=4096M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert [m["containerPath"] for m in edits["mounts"]] == [
        str(mps_dir / "pipe"),
        str(mps_dir / "log"),
    ]
    assert d.stop() == 0, d.log.read_text()
    assert d.group_is_gone()
    assert "quit" in control_log.read_text()  # asked to quit, as an operator would


def test_refuses_to_start_when_the_config_gives_the_gpus_to_the_device_plugin(
    driver: Callable[..., Driver],
) -> None:
    d = driver({"gpuAllocation": "devicePlugin"})
    assert d.proc.wait(WAIT_S) == 2
    out = d.log.read_text()
    assert "gpuAllocation is 'devicePlugin'" in out and "kubegpu device-plugin" in out
    assert "Traceback" not in out
    assert not d.sockets.registration.exists()


def test_a_kubelet_refusal_exits_1_without_sockets(
    driver: Callable[..., Driver], api: ResourceApi
) -> None:
    d = driver({"gpuAllocation": "dra"})
    d.wait(lambda: node_devices(api) and d.sockets.registration.exists(), "driver up")
    with grpc.insecure_channel(f"unix://{d.sockets.registration}") as channel:
        reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=False, error="version not supported"),
            timeout=30,
        )
    assert d.proc.wait(WAIT_S) == 1
    out = d.log.read_text()
    assert "version not supported" in out and "Traceback" not in out
    assert not d.sockets.registration.exists() and not d.sockets.dra.exists()
    assert d.group_is_gone()


def test_an_api_server_it_cannot_reach_at_start_exits_1(short_dir: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on once closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    d = Driver(short_dir, f"http://127.0.0.1:{port}", {"gpuAllocation": "dra"})
    try:
        assert d.proc.wait(WAIT_S) == 1
    finally:
        if d.proc.poll() is None:
            d.stop()
    out = d.log.read_text()
    assert f"cannot publish the ResourceSlices of node {NODE}" in out
    assert "Traceback" not in out
    assert not d.sockets.registration.exists() and not d.sockets.dra.exists()
    assert d.group_is_gone()


def test_a_checkpoint_it_cannot_trust_exits_1_naming_the_file(
    driver: Callable[..., Driver], short_dir: Path
) -> None:
    checkpoint = short_dir / "state" / "checkpoint.json"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text('{"version": 1, "checksum": "sha256:0", "claims": {}}')
    d = driver({"gpuAllocation": "dra"})
    assert d.proc.wait(WAIT_S) == 1
    out = d.log.read_text()
    assert str(checkpoint) in out and "Traceback" not in out
    assert not d.sockets.registration.exists() and not d.sockets.dra.exists()
    assert checkpoint.read_text().startswith('{"version": 1')  # left for the operator
    assert d.group_is_gone()


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _sparse(path: Path) -> None:
    with path.open("wb") as f:
        f.truncate(64 * 2**20)


def _wrong_entry(path: Path) -> None:
    claims = {"cccccccc-0000-4000-8000-000000000001": {"namespace": 7, "name": "x", "devices": []}}
    path.write_text(json.dumps({"version": 1, "checksum": checksum(claims), "claims": claims}))


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_fifo, "is a FIFO, not a checkpoint file"),
        (lambda p: p.write_bytes(b'{"version": 1, "claims": {"\xff": 1}}'), "not UTF-8 text"),
        (lambda p: p.mkdir(), "is a directory, not a checkpoint file"),
        (lambda p: p.write_text("[" * 100_000 + "]" * 100_000), "JSON nested too deeply"),
        (_sparse, f"is {64 * 2**20} bytes, more than the"),
        (_wrong_entry, ".namespace is a int, not a string"),
    ],
    ids=["fifo", "non-utf8", "directory", "deep-json", "huge", "entry-type"],
)
def test_a_checkpoint_file_it_cannot_read_exits_1_with_one_line_naming_it(
    driver: Callable[..., Driver], short_dir: Path, make: Callable[[Path], None], reason: str
) -> None:
    # A FIFO used to block the start for ever (SIGTERM unheard); the others were tracebacks.
    checkpoint = short_dir / "state" / "checkpoint.json"
    checkpoint.parent.mkdir(parents=True)
    make(checkpoint)
    d = driver({"gpuAllocation": "dra"})
    try:
        code = d.proc.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the driver did not exit on {checkpoint}:\n{d.log.read_text()}")
    out = d.log.read_text(errors="replace")
    assert code == 1, out
    (line,) = [line for line in out.splitlines() if str(checkpoint) in line]
    assert reason in line and "move the file away" in line
    assert "Traceback" not in out
    assert not d.sockets.registration.exists() and not d.sockets.dra.exists()
    assert d.group_is_gone()


def free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port: int = probe_socket.getsockname()[1]
        return port


def probe(port: int, path: str) -> tuple[int, str]:
    """(status, body) of a GET on the driver's health endpoint."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy from env
    try:
        with direct.open(f"http://127.0.0.1:{port}{path}", timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_a_second_driver_on_the_kubelet_folder_waits_for_the_first_then_takes_over(
    driver: Callable[..., Driver], api: ResourceApi
) -> None:
    # Two pods of the DaemonSet on one node (a rolling update with a surge): the second used to
    # replace the first's sockets at once, and the first's SIGTERM then deleted the second's,
    # so the kubelet de-registered a driver that was still running.
    first = driver({"gpuAllocation": "dra"}, "first")
    sockets = first.sockets
    first.wait(lambda: node_devices(api) and sockets.registration.exists(), "first up")
    first.wait(lambda: sockets.dra.exists(), "first's DRA socket")
    owned = {p: socket_identity(p) for p in (sockets.registration, sockets.dra)}
    uid = "cccccccc-0000-4000-8000-000000000009"
    api.claims[("team-a", "train")] = claim(uid, "gpu-2", {})
    assert prepare(sockets.dra, uid).claims[uid].error == ""

    port = free_port()
    second = driver({"gpuAllocation": "dra"}, "second", f"--health-listen=127.0.0.1:{port}")
    second.wait(lambda: "waiting for it to exit" in second.log.read_text(), "second waiting")
    (line,) = [x for x in second.log.read_text().splitlines() if "waiting for it" in x]
    assert str(sockets.dra) in line and "another DRA driver" in line
    assert f"pid {first.proc.pid} on " in line
    # Alive (not restarted by its liveness probe) but not ready while it waits.
    for path, status in (("/healthz", 200), ("/readyz", 503)):
        code, body = probe(port, path)
        assert (code, body.split(" is served by")[0]) == (status, f"waiting: {sockets.dra}")
    # The first's sockets are untouched and it goes on serving.
    assert {p: socket_identity(p) for p in owned} == owned
    with grpc.insecure_channel(f"unix://{sockets.registration}") as channel:
        reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=30)
    assert first.proc.poll() is None and second.proc.poll() is None

    # The first goes: the second serves, on sockets the first's exit did not remove.
    assert first.stop() == 0, first.log.read_text()
    second.wait(lambda: "the other DRA driver is gone; serving" in second.log.read_text(), "over")
    second.wait(lambda: sockets.registration.exists() and sockets.dra.exists(), "its sockets")
    taken = {p: socket_identity(p) for p in owned}
    assert all(taken[p] not in (None, owned[p]) for p in owned)
    with grpc.insecure_channel(f"unix://{sockets.registration}") as channel:
        info = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=30)
    assert info.endpoint == str(sockets.dra)
    second.wait(
        lambda: probe(port, "/healthz")[0] == 200 and "ok: " in probe(port, "/healthz")[1], "alive"
    )
    # The claim the first prepared is answered from the checkpoint it left.
    (device,) = prepare(sockets.dra, uid).claims[uid].devices
    assert device.device_name == "gpu-2"
    assert f"claim team-a/train ({uid}) already prepared" in second.log.read_text()

    # One more, stopped while it waits: it exits 0 and the serving driver keeps its sockets.
    third = driver({"gpuAllocation": "dra"}, "third")
    third.wait(lambda: f"pid {second.proc.pid} on " in third.log.read_text(), "third waiting")
    assert third.stop() == 0, third.log.read_text()
    assert {p: socket_identity(p) for p in owned} == taken
    assert second.proc.poll() is None

    assert second.stop() == 0, second.log.read_text()
    assert not sockets.registration.exists() and not sockets.dra.exists()
    for d in (first, second, third):
        assert "Traceback" not in d.log.read_text()
        assert d.group_is_gone()


STEERING_WORKLOAD = {
    # 80 % shares of half a card, 20 % of 30 %: a 40 %-used card is a bad home for the common
    # share (it would leave a sliver no share fits), a full one a good one.
    "pods": [
        {"cpuMilli": 1000, "gpuMilli": 500, "gpuCount": 1, "weight": 8},
        {"cpuMilli": 1000, "gpuMilli": 300, "gpuCount": 1, "weight": 2},
    ]
}


def test_steers_its_devices_from_the_claims_allocated_from_its_pool(
    driver: Callable[..., Driver], api: ResourceApi, short_dir: Path
) -> None:
    workload = short_dir / "workload.yaml"
    workload.write_text(yaml.safe_dump(STEERING_WORKLOAD))
    d = driver(
        {
            "gpuAllocation": "dra",
            "dra": {"steering": {"workloadFile": str(workload), "intervalS": 0.1}},
        }
    )
    d.wait(lambda: node_devices(api), "ResourceSlice")
    assert list(node_devices(api)) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    # The scheduler allocated 40 % of gpu-0 (T4: 15360 MiB): first fit in index order would
    # put the next half-card share there; the driver moves gpu-0 to the end.
    uid = "cccccccc-0000-4000-8000-000000000002"
    api.claims[("team-a", "train")] = claim(uid, "gpu-0", {"memory": "6144Mi", "compute": "400"})
    d.wait(lambda: list(node_devices(api)) == ["gpu-1", "gpu-2", "gpu-3", "gpu-0"], "steered order")
    del api.claims[("team-a", "train")]
    d.wait(lambda: list(node_devices(api)) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], "index order")
    assert d.stop() == 0, d.log.read_text()
    assert "steered device order gpu-1,gpu-2,gpu-3,gpu-0" in d.log.read_text()


def test_a_bad_steering_workload_file_is_a_usage_error_naming_the_setting(
    driver: Callable[..., Driver], short_dir: Path
) -> None:
    workload = short_dir / "workload.yaml"
    workload.write_text("pods: []\n")
    d = driver({"gpuAllocation": "dra", "dra": {"steering": {"workloadFile": str(workload)}}})
    assert d.proc.wait(WAIT_S) == 2
    out = d.log.read_text()
    assert "dra.steering.workloadFile" in out and "non-empty 'pods' list" in out
    assert "Traceback" not in out
    assert not d.sockets.registration.exists()


def test_under_nvidias_naming_it_publishes_and_registers_as_gpu_nvidia_com(
    driver: Callable[..., Driver], api: ResourceApi
) -> None:
    d = driver({"gpuAllocation": "dra", "dra": {"naming": "nvidia"}})
    sockets = socket_paths(d.kubelet_dir, "gpu.nvidia.com")
    d.wait(lambda: node_devices(api) and sockets.registration.exists(), "published")
    (published,) = [s for s in api.slices.values() if s["spec"].get("nodeName") == NODE]
    assert published["spec"]["driver"] == "gpu.nvidia.com"
    assert node_devices(api)["gpu-0"]["attributes"]["type"] == {"string": "gpu"}
    d.wait(lambda: sockets.dra.exists(), "its DRA socket")
    with grpc.insecure_channel(f"unix://{sockets.registration}") as channel:
        info = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=30)
    assert (info.name, info.endpoint) == ("gpu.nvidia.com", str(sockets.dra))
    assert d.stop() == 0, d.log.read_text()


def test_beside_another_driver_of_the_same_name_it_refuses_and_touches_nothing(
    driver: Callable[..., Driver], api: ResourceApi, short_dir: Path
) -> None:
    # NVIDIA's driver serving gpu.nvidia.com on this node: its registration socket answers.
    registration = socket_paths(short_dir / "kubelet", "gpu.nvidia.com").registration
    registration.parent.mkdir(parents=True, exist_ok=True)
    nvidia = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    nvidia.bind(str(registration))
    nvidia.listen(8)
    try:
        d = driver({"gpuAllocation": "dra", "dra": {"naming": "nvidia"}})
        assert d.proc.wait(WAIT_S) == 1, d.log.read_text()
        log = d.log.read_text()
        assert "another DRA driver named gpu.nvidia.com already serves this node" in log
        assert str(registration) in log and "dra.naming: kubegpu" in log
        assert "Traceback" not in log
        # Its socket is still there and still its own; no slice was written.
        assert registration.is_socket()
        probe_socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe_socket.connect(str(registration))
        probe_socket.close()
        assert not node_devices(api)
        assert d.group_is_gone()
    finally:
        nvidia.close()
