"""The probes in the manifests work against the real processes: each role is started with the
arguments and config its container has (only paths, ports and the GPU backend moved to what
this machine has), and the probe the kubelet would run is run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from kubegpu.cli.device_plugin import DEFAULT_KUBELET_DIR
from kubegpu.config.model import DEFAULT_RESOURCE, GpuShare
from kubegpu.dra.api.pluginregistration.v1 import api_pb2 as reg
from kubegpu.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubegpu.roles.dra_driver import socket_paths
from kubegpu.testing.apiserver import FakeApiServer, make_node
from kubegpu.testing.kubeconfig import kubeconfig_dict
from kubegpu.testing.kubelet import KubeletEmulator
from kubegpu.testing.waiting import wait_until
from tests.deploy.manifests import (
    DEPLOY,
    Obj,
    arg_value,
    container,
    container_env,
    find,
    materialise_config_volumes,
    render,
    substitute,
)
from tests.dra.resource_api import ResourceApi
from tests.dra.test_dra_driver_process import api_in_thread
from tests.tools import missing

FAKE = ("--backend=fake", "--fake-gpus=4xT4")


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KUBEGPU_") and k.lower() not in ("http_proxy", "https_proxy")
    }
    env.update(extra)
    return env


class Process:
    """A ``kubegpu`` subprocess whose stderr is read on a thread (so it never blocks)."""

    def __init__(self, args: Sequence[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kubegpu", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.output.append(line)
            self.lines.put(line)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._reader.join(5)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return rc


@contextmanager
def running(args: Sequence[str], env: dict[str, str]) -> Iterator[Process]:
    process = Process(args, env)
    try:
        yield process
    finally:
        process.stop()


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as err:
        err.close()
        return err.code
    except OSError:
        return 0


def wait_for_status(url: str, want: int, timeout_s: float = 30.0) -> int:
    """Poll the process's ``url`` until it answers ``want``; the last status either way."""
    last = [http_status(url)]

    def answered() -> bool:
        if last[0] != want:
            last[0] = http_status(url)
        return last[0] == want

    with contextlib.suppress(TimeoutError):
        wait_until(answered, timeout_s=timeout_s, what=f"{url} answering {want}", poll_s=0.1)
    return last[0]


def probe_urls(item: dict[str, Any], manifest_port: int, port: int) -> Callable[[str], str]:
    """The URL each probe of container ``item`` asks, with the port the manifest names
    (``manifest_port``, checked) rebased to ``port``, where the test's process listens."""
    ports = {p["name"]: p["containerPort"] for p in item["ports"]}

    def url(probe: str) -> str:
        target = item[probe]["httpGet"]
        assert ports[target["port"]] == manifest_port  # the manifest's; rebased to `port` here
        return f"http://127.0.0.1:{port}{target['path']}"

    return url


def scrape_gpus(url: str, timeout_s: float = 30.0) -> dict[str, int]:
    """node label -> GPUs with a memory-total sample, once the exporter has refreshed."""

    def gpus() -> dict[str, int]:
        with urllib.request.urlopen(url, timeout=5) as reply:
            text = reply.read().decode()
        found: dict[str, int] = {}
        for family in text_string_to_metric_families(text):
            if family.name == "kubegpu_gpu_memory_total_bytes":
                for sample in family.samples:
                    node = sample.labels["node"]
                    found[node] = found.get(node, 0) + 1
        return found

    try:
        return wait_until(gpus, timeout_s=timeout_s, what="a GPU sample", poll_s=0.1)
    except TimeoutError:
        return {}  # the caller's assertion says what was missing


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_device_plugin_probes_pass_once_it_serves_and_has_registered_and_fail_after(
    tmp_path: Path,
) -> None:
    objs = render("overlays/second-scheduler")
    agent = find(objs, "DaemonSet", "kubegpu-node-agent")
    item = container(agent, "device-plugin")
    env = container_env(item)
    # Unix socket paths must stay under 108 bytes; pytest's tmp_path may not.
    kubelet_dir = Path(tempfile.mkdtemp(prefix="kg-probe-", dir="/tmp"))
    port, metrics_port = free_port(), free_port()
    try:
        paths = materialise_config_volumes(objs, agent, "device-plugin", tmp_path)
        paths[DEFAULT_KUBELET_DIR] = str(kubelet_dir)
        paths["/host/proc"] = "/proc"
        args = substitute(item["args"], env, paths)
        # The manifest's addresses are the pod IP's; here loopback on free ports.
        assert arg_value(args, "--health-listen") is not None
        assert arg_value(args, "--exporter-listen") is not None
        args = [a for a in args if not a.startswith(("--health-listen=", "--exporter-listen="))]
        args += [f"--health-listen=127.0.0.1:{port}", f"--exporter-listen=127.0.0.1:{metrics_port}"]
        ports = {p["name"]: p["containerPort"] for p in item["ports"]}
        url = probe_urls(item, 9401, port)

        probes = ("startupProbe", "livenessProbe", "readinessProbe")
        assert all(http_status(url(p)) == 0 for p in probes)  # nothing listens yet
        # The shipped config turns on GPU sharing, which needs the API server (in a pod: the
        # service account) and the node's Node object.
        with FakeApiServer().run_in_thread() as api, KubeletEmulator(kubelet_dir) as kubelet:
            api.store.put("nodes", make_node(env["NODE_NAME"]))
            kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
            args += [*FAKE, f"--kubeconfig={kubeconfig}"]
            with running(args, _env()) as plugin:
                kubelet.wait_for_registration(DEFAULT_RESOURCE, timeout_s=30)
                # Shared mode is on: the share slots are registered too, and readiness waits
                # for both.
                kubelet.wait_for_registration(GpuShare().resource_name, timeout_s=30)
                for probe in probes:
                    assert wait_for_status(url(probe), 200) == 200, probe
                # What the PodMonitor scrapes: the exporter inside the agent, every GPU.
                monitor = find(render("overlays/monitoring"), "PodMonitor", "kubegpu-node-agent")
                (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
                assert ports[endpoint["port"]] == 9400  # the manifest's; rebased here
                scraped = scrape_gpus(f"http://127.0.0.1:{metrics_port}{endpoint['path']}")
                assert scraped == {env["NODE_NAME"]: 4}
                # The kubelet goes away: not ready, still alive.
                kubelet.stop()
                assert wait_for_status(url("readinessProbe"), 503) == 503
                assert http_status(url("livenessProbe")) == 200
                kubelet.start()
                assert wait_for_status(url("readinessProbe"), 200) == 200
                assert plugin.stop() == 0
            assert all(http_status(url(p)) == 0 for p in probes)
            assert http_status(f"http://127.0.0.1:{metrics_port}/metrics") == 0
    finally:
        for leftover in kubelet_dir.iterdir():
            leftover.unlink()
        kubelet_dir.rmdir()


class HeldResourceApi(ResourceApi):
    """Creates no ResourceSlice until ``release`` is set: the driver's first publish waits."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.held = threading.Event()  # a create has arrived and is waiting

    async def _create_slice(self, request: web.Request) -> web.Response:
        self.held.set()
        await asyncio.to_thread(self.release.wait, 60)
        return await super()._create_slice(request)


def test_dra_driver_probes_pass_once_it_has_published_and_is_registered(tmp_path: Path) -> None:
    # The DRA example: the component's DaemonSet, its ConfigMap, the real command line; the
    # kubelet's side is played over the real registration socket, as its plugin watcher does.
    objs = render("examples/dra")
    daemonset = find(objs, "DaemonSet", "kubegpu-dra-driver")
    item = container(daemonset, "dra-driver")
    env = container_env(item)
    # Unix socket paths must stay under 108 bytes; pytest's tmp_path may not.
    root = Path(tempfile.mkdtemp(prefix="kg-draprobe-", dir="/tmp"))
    port = free_port()
    api = HeldResourceApi()
    try:
        paths = materialise_config_volumes(objs, daemonset, "dra-driver", tmp_path)
        for option in ("--kubelet-dir", "--cdi-dir", "--state-dir"):
            paths[arg_value(item["args"], option)] = str(root / option.strip("-"))
        args = substitute(item["args"], env, paths)
        # The manifest's address is the pod IP's; here loopback on a free port.
        assert arg_value(args, "--health-listen") == "0.0.0.0:9403"
        args = [a for a in args if not a.startswith("--health-listen=")]
        args.append(f"--health-listen=127.0.0.1:{port}")
        url = probe_urls(item, 9403, port)

        probes = ("startupProbe", "livenessProbe", "readinessProbe")
        assert all(http_status(url(p)) == 0 for p in probes)  # nothing listens yet
        sockets = socket_paths(Path(arg_value(args, "--kubelet-dir")))
        with api_in_thread(api) as api_url:
            kubeconfig = tmp_path / "kubeconfig"
            kubeconfig.write_text(yaml.safe_dump(kubeconfig_dict(api_url)))
            args += [*FAKE, f"--kubeconfig={kubeconfig}"]
            with running(args, _env(NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")) as driver:
                # Publishing its slices: the probes answer already, neither alive nor ready.
                assert api.held.wait(30), driver.output
                assert wait_for_status(url("startupProbe"), 503) == 503, driver.output
                assert http_status(url("readinessProbe")) == 503
                api.release.set()
                for probe in ("startupProbe", "livenessProbe"):
                    assert wait_for_status(url(probe), 200) == 200, (probe, driver.output)
                # Serving and published, but no kubelet has registered it: not ready.
                assert api.slices, "alive before its ResourceSlices were published"
                assert http_status(url("readinessProbe")) == 503
                # What the kubelet's plugin watcher does once it finds the socket.
                with grpc.insecure_channel(f"unix://{sockets.registration}") as channel:
                    stub = reg_grpc.RegistrationStub(channel)
                    info = stub.GetInfo(reg.InfoRequest(), timeout=30)
                    assert info.endpoint == str(sockets.dra)
                    stub.NotifyRegistrationStatus(
                        reg.RegistrationStatus(plugin_registered=True), timeout=30
                    )
                assert wait_for_status(url("readinessProbe"), 200) == 200, driver.output
                assert http_status(url("livenessProbe")) == 200
                assert http_status(f"http://127.0.0.1:{port}/metrics") == 404
                assert driver.stop() == 0, driver.output
            assert all(http_status(url(p)) == 0 for p in probes)
            assert "Traceback" not in "".join(driver.output)
    finally:
        api.release.set()  # a failed assertion must not leave a create waiting
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(
    ("listen", "code", "message"),
    [
        # A port without the host: a usage error, before anything starts.
        ("9403", 2, "--health-listen: expected HOST:PORT (e.g. 0.0.0.0:9401), got '9403'"),
        # A port something else holds: it cannot start.
        ("127.0.0.1:{busy}", 1, "--health-listen: cannot serve /healthz and /readyz on"),
    ],
)
def test_dra_driver_refuses_a_health_listen_it_cannot_serve_naming_the_flag(
    tmp_path: Path, listen: str, code: int, message: str
) -> None:
    root = Path(tempfile.mkdtemp(prefix="kg-draflag-", dir="/tmp"))
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\ngpuAllocation: dra\n")
    kubeconfig = tmp_path / "kubeconfig"
    # An API server nobody answers at: the driver must fail before it asks.
    kubeconfig.write_text(yaml.safe_dump(kubeconfig_dict(f"http://127.0.0.1:{free_port()}")))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        args = [
            "dra-driver",
            *FAKE,
            "--node-name=n0",
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--kubelet-dir={root / 'kubelet'}",
            f"--cdi-dir={root / 'cdi'}",
            f"--state-dir={root / 'state'}",
            f"--health-listen={listen.format(busy=taken.getsockname()[1])}",
        ]
        try:
            with running(args, _env()) as driver:
                assert driver.proc.wait(30) == code, driver.output
        finally:
            shutil.rmtree(root, ignore_errors=True)
    out = "".join(driver.output)
    assert f"kubegpu dra-driver: {message}" in out
    assert "Traceback" not in out


def _extender_probe_urls(item: Obj, port: int) -> dict[str, str]:
    """probe -> the URL the kubelet would GET, with the manifest's metrics port rebased to
    ``port`` on loopback (the kubelet sends it to the pod IP)."""
    named = {p["name"]: p["containerPort"] for p in item.get("ports", [])}
    urls = {}
    for probe in ("livenessProbe", "readinessProbe"):
        target = item[probe]["httpGet"]
        assert target.get("scheme", "HTTP") == "HTTP"
        assert named[target["port"]] in (9402, 10262)  # the manifests'; rebased here
        urls[probe] = f"http://127.0.0.1:{port}{target['path']}"
    return urls


def _metrics_families(url: str) -> set[str]:
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return {family.name for family in text_string_to_metric_families(text)}


def test_extender_probes_pass_once_it_has_synced_with_the_api_server(tmp_path: Path) -> None:
    # The second-scheduler overlay: the extender beside kube-scheduler, the verbs on loopback
    # HTTP, the probes on its metrics listener (plain HTTP, read-only) on the pod IP.
    objs = render("overlays/second-scheduler")
    pod = find(objs, "Deployment", "kubegpu-scheduler")
    item = container(pod, "extender")
    paths = materialise_config_volumes(objs, pod, "extender", tmp_path)
    port, metrics_port = free_port(), free_port()
    urls = _extender_probe_urls(item, metrics_port)
    assert all(http_status(u) == 0 for u in urls.values())  # nothing listens yet

    # Hold the first list of pods, to see readiness wait for it.
    release = asyncio.Event()  # set on the fake API server's loop, which awaits it
    with FakeApiServer().run_in_thread() as api:

        async def held(_store: object) -> None:
            await release.wait()

        api.server.before("list", "pods", held)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        args = [
            *substitute(item["args"], container_env(item), paths),
            f"--port={port}",
            "--metrics-host=127.0.0.1",
            f"--metrics-port={metrics_port}",
            f"--kubeconfig={kubeconfig}",
        ]
        with running(args, _env()):
            assert wait_for_status(urls["livenessProbe"], 200) == 200
            assert http_status(urls["readinessProbe"]) == 503  # not synced yet
            api.loop.call_soon_threadsafe(release.set)
            assert wait_for_status(urls["readinessProbe"], 200) == 200
            # What the ServiceMonitor scrapes, through the Service's target port.
            (endpoint,) = find(render("overlays/monitoring"), "ServiceMonitor", "kubegpu-extender")[
                "spec"
            ]["endpoints"]
            scraped = f"http://127.0.0.1:{metrics_port}{endpoint['path']}"
            assert "kubegpu_extender_request_duration_seconds" in _metrics_families(scraped)
            # The verbs are not on the metrics listener; they are on loopback as before.
            assert http_status(f"http://127.0.0.1:{metrics_port}/filter") == 404
            assert http_status(f"http://127.0.0.1:{port}/readyz") == 200
        assert all(http_status(u) == 0 for u in urls.values())


def _https_status(url: str, context: ssl.SSLContext) -> int | str:
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as err:
        err.close()
        return err.code
    except (OSError, ssl.SSLError) as err:
        return type(err).__name__


def test_default_scheduler_extender_serves_only_clients_with_the_scheduler_certificate(
    tmp_path: Path,
) -> None:
    # Certificates made by the overlay's script, as docs/install.md tells the admin to.
    if shutil.which("openssl") is None:
        missing("the openssl command is not installed", "apt-get install openssl")
    overlay = DEPLOY / "overlays" / "default-scheduler"
    certs = tmp_path / "certs"
    subprocess.run(
        [str(overlay / "make-certs.sh"), str(certs)],
        env={**_env(), "BITS": "2048"},
        check=True,
        capture_output=True,
        timeout=120,
    )
    objs = render("overlays/default-scheduler")
    daemonset = find(objs, "DaemonSet", "kubegpu-extender")
    item = container(daemonset, "extender")
    paths = materialise_config_volumes(objs, daemonset, "extender", tmp_path / "config")
    tls_mount = "/etc/kubegpu/tls"
    assert tls_mount in {m["mountPath"] for m in item["volumeMounts"]}
    config_file = Path(paths["/etc/kubegpu/config.yaml"])
    config_file.write_text(config_file.read_text().replace(tls_mount, str(certs)))
    scheduler = yaml.safe_load((overlay / "kube-scheduler-config.yaml").read_text())
    (extender,) = scheduler["extenders"]
    port, metrics_port = free_port(), free_port()
    url = extender["urlPrefix"].replace(":8443", f":{port}") + "/readyz"
    probes = _extender_probe_urls(item, metrics_port)

    # What kube-scheduler does with its tlsConfig: verify the server against caFile (by IP)
    # and present certFile/keyFile.
    tls = extender["tlsConfig"]
    like_scheduler = ssl.create_default_context(cafile=str(certs / Path(tls["caFile"]).name))
    like_scheduler.load_cert_chain(
        str(certs / Path(tls["certFile"]).name), str(certs / Path(tls["keyFile"]).name)
    )
    # What the kubelet's HTTPS probe does: no client certificate, no verification.
    like_kubelet = ssl.create_default_context()
    like_kubelet.check_hostname = False
    like_kubelet.verify_mode = ssl.CERT_NONE

    with FakeApiServer().run_in_thread() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        args = [
            *substitute(item["args"], container_env(item), paths),
            f"--port={port}",
            "--metrics-host=127.0.0.1",
            f"--metrics-port={metrics_port}",
            f"--kubeconfig={kubeconfig}",
        ]
        with running(args, _env()):
            with contextlib.suppress(TimeoutError):
                wait_until(
                    lambda: _https_status(url, like_scheduler) == 200,
                    timeout_s=30,
                    what=f"{url} answering 200",
                    poll_s=0.2,
                )
            assert _https_status(url, like_scheduler) == 200
            # An HTTPS probe of the verbs' listener would never see 200: the handshake fails
            # without a certificate. The manifest's probes ask the metrics listener instead.
            assert _https_status(url, like_kubelet) != 200
            for probe_url in probes.values():
                assert wait_for_status(probe_url, 200) == 200
            # Which answers plain HTTP, and only the read-only endpoints.
            assert http_status(f"http://127.0.0.1:{metrics_port}/bind") == 404
