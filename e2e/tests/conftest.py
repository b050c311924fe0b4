"""The suite's fixtures: one real cluster for the whole session (started once, torn down on
success, failure, Ctrl-C or SIGTERM), the kubegpu roles beside it, a namespace per scenario,
and e2e/out/report.json."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

E2E = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(E2E))

from kubegpu_e2e.cluster import Cluster  # noqa: E402
from kubegpu_e2e.dra import (  # noqa: E402
    FEATURE_GATES,
    DraDriver,
    containerd_bin_dir,
    dra_cluster,
)
from kubegpu_e2e.kubegpu import KubegpuRoles  # noqa: E402
from kubegpu_e2e.processes import built  # noqa: E402
from kubegpu_e2e.release import (  # noqa: E402
    FIXES_FORCED,
    Release,
    archive_tag,
    helm_binary,
    image_archive,
    kubernetes_version,
    prepare,
)
from kubegpu_e2e.versions import gate_table  # noqa: E402

OUT = Path(os.environ.get("KUBEGPU_E2E_OUT", E2E / "out"))
_results: dict[str, dict[str, Any]] = {}
_leftovers: list[str] = []
# The session's default cluster and roles while they run. A machine runs one kubelet at a time
# (its device-plugin socket is a fixed path), so the installed chart's own cluster
# (test_10_install.py) and the DRA scenarios' (test_11_dra.py, the last module) stop these
# first: no later scenario may ask for them.
_running: dict[str, Any] = {}


def _bin_dir() -> Path:
    return built("KUBEGPU_E2E_BIN", E2E / "components" / "build.sh")


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (CI's timeout, `kill`) tears down like Ctrl-C: fixtures' finalizers run.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    config.addinivalue_line("markers", "e2e: runs against the real cluster of e2e/")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    c = Cluster(bin_dir=_bin_dir(), out_dir=OUT)
    try:
        c.start()
        _results["cluster start"] = {
            "outcome": "passed",
            "duration_s": round(time.monotonic() - started, 1),
        }
        _running["cluster"] = c
        yield c
    finally:
        _running.pop("cluster", None)
        _leftovers.extend(c.stop())  # nothing the second time (stop_default_cluster)


@pytest.fixture(scope="session")
def roles(cluster: Cluster) -> Iterator[KubegpuRoles]:
    r = KubegpuRoles(cluster)
    try:
        _running["roles"] = r
        r.start()
        yield r
    finally:
        if _running.pop("roles", None) is r:
            r.stop()


def stop_default_cluster() -> None:
    """Stop the default cluster and its roles now, if this session started them."""
    roles = _running.pop("roles", None)
    if roles is not None:
        roles.stop()
    cluster = _running.pop("cluster", None)
    if cluster is not None:
        _leftovers.extend(cluster.stop())


@pytest.fixture(scope="module")
def dra() -> Iterator[tuple[Cluster, DraDriver]]:
    """The DRA variant of the cluster (kubegpu_e2e/dra.py) for one module: containerd v2 with
    CDI, the DRA feature gates, `kubegpu dra-driver` beside the kubelet. The default cluster
    goes first: one kubelet per machine."""
    stop_default_cluster()
    started = time.monotonic()
    c = dra_cluster(_bin_dir(), OUT / "dra")
    driver = DraDriver(c)
    try:
        c.start()
        driver.install()
        driver.start()
        _results["DRA cluster start"] = {
            "outcome": "passed",
            "duration_s": round(time.monotonic() - started, 1),
        }
        yield c, driver
    finally:
        driver.stop()
        _leftovers.extend(c.stop())


@pytest.fixture(scope="module")
def mig_dra() -> Iterator[tuple[Cluster, DraDriver]]:
    """A DRA cluster whose driver serves fake H100s in MIG mode (e2e/tests/test_17_mig_dra.py):
    the DRA gates plus DRAPartitionableDevices (alpha in 1.35, on by default from 1.36) for
    dynamic MIG, and the MIG capability device nodes the CDI specs name."""
    from kubegpu_e2e.mig_dra import make_cap_nodes, mig_dra_cluster

    stop_default_cluster()
    started = time.monotonic()
    c, driver = mig_dra_cluster(_bin_dir(), OUT / "mig-dra")
    try:
        c.start()
        driver.install()
        make_cap_nodes(driver.dev_root)
        driver.start()
        _results["MIG DRA cluster start"] = {
            "outcome": "passed",
            "duration_s": round(time.monotonic() - started, 1),
        }
        yield c, driver
    finally:
        driver.stop()
        _leftovers.extend(c.stop())


@pytest.fixture
def mig_namespace(
    mig_dra: tuple[Cluster, DraDriver], request: pytest.FixtureRequest
) -> Iterator[str]:
    yield from _test_namespace(mig_dra[0], request)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Release]]:
    """A cluster of its own with kubegpu installed by the real helm from the chart, every role
    a pod of the release (kubegpu_e2e/release.py). The default cluster goes first."""
    stop_default_cluster()
    started = time.monotonic()
    c = Cluster(bin_dir=_bin_dir(), out_dir=OUT / "install")
    version = kubernetes_version()
    release = Release(c, helm_binary(), tmp_path_factory.mktemp("helm-home"), version)
    record: dict[str, Any] = {"outcome": "failed"}
    _results["installed release"] = record
    try:
        c.start()
        record["cluster_start_s"] = round(time.monotonic() - started, 1)
        record["images"] = prepare(c, version)
        record["helm_install_wait_s"] = release.install(archive_tag(image_archive()))
        record["ready_after_s"] = release.ready_times()
        record["outcome"] = "passed"
        record["duration_s"] = round(time.monotonic() - started, 1)
        yield c, release
    finally:
        record["helm"] = release.history
        record["fixes_forced_by_the_real_install"] = list(FIXES_FORCED)
        _leftovers.extend(c.stop())


@pytest.fixture(scope="module")
def small_trace() -> Any:
    """The scale replay's small generated cluster and trace (kubegpu_e2e/scale/trace.py):
    100 nodes, and the pods until 100 % of their GPUs have arrived."""
    from kubegpu_e2e.scale import trace

    return trace.small(nodes=100, pods=1_000)


def started_scale_cluster(factory: Any, out_name: str, record_name: str, t: Any) -> Iterator[Any]:
    """A control plane of KWOK nodes made from trace ``t`` (``factory``: the scale cluster
    class of kubegpu_e2e/scale), for one module; the default cluster goes first."""
    stop_default_cluster()
    started = time.monotonic()
    kwok = built("KUBEGPU_E2E_KWOK", E2E / "components" / "kwok" / "build.sh")
    s = factory(_bin_dir(), OUT / out_name, kwok)
    record = _results.setdefault(record_name, {"outcome": "failed"})
    try:
        s.start()
        record["nodes_created_s"] = round(asyncio.run(s.add_nodes(t)), 1)
        record["outcome"] = "passed"
        record["duration_s"] = round(time.monotonic() - started, 1)
        yield s
    finally:
        _leftovers.extend(s.stop())


def record_install(key: str, value: Any) -> None:
    """A figure of the installed release's scenarios, for report.json."""
    record_figure("installed release", key, value)


def record_figure(section: str, key: str, value: Any) -> None:
    """A figure a scenario measured, under ``section`` in report.json's scenarios."""
    _results.setdefault(section, {})[key] = value


@pytest.fixture
def install_namespace(
    installed: tuple[Cluster, Release], request: pytest.FixtureRequest
) -> Iterator[str]:
    yield from _test_namespace(installed[0], request)


@pytest.fixture
def dra_namespace(dra: tuple[Cluster, DraDriver], request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _test_namespace(dra[0], request)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _test_namespace(cluster, request)


def _test_namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the scenario's own, ready for pods: the API server refuses a pod until
    kube-controller-manager has made the namespace's ``default`` ServiceAccount, which a fast
    scenario once beat ("serviceaccount "default" not found")."""
    # Parametrized scenarios' ids ("[on]") hold characters a namespace name may not.
    name = "e2e-" + re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:50].strip("-")
    cluster.kubectl("create", "namespace", name)
    try:
        cluster.wait_for(
            f"the default ServiceAccount of namespace {name}",
            lambda: cluster.get("serviceaccount", "default", "-n", name),
            timeout=60,
        )
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=true", "--timeout=180s", check=False)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _results.setdefault(report.nodeid, {"outcome": "passed", "duration_s": 0.0})
    entry["duration_s"] = round(entry["duration_s"] + report.duration, 1)
    if report.failed:
        entry["outcome"] = "failed"
        entry.setdefault("phase", report.when)
    elif report.skipped and report.when != "teardown":
        entry["outcome"] = "skipped"


def _version(argv: list[str]) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except OSError as error:
        return f"unavailable: {error}"
    return (result.stdout + result.stderr).strip()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    bin_dir = os.environ.get("KUBEGPU_E2E_BIN", "")
    versions: dict[str, str] = {}
    if bin_dir:
        b = Path(bin_dir)
        versions = {
            "etcd": _version([str(b / "etcd"), "--version"]),
            "kube-apiserver": _version([str(b / "kube-apiserver"), "--version"]),
            "kube-controller-manager": _version([str(b / "kube-controller-manager"), "--version"]),
            "kube-scheduler": _version([str(b / "kube-scheduler"), "--version"]),
            "kubelet": _version([str(b / "kubelet"), "--version"]),
            "kubectl": _version([str(b / "kubectl"), "version", "--client"]),
            "go version -m kube-apiserver (k8s.io/kubernetes)": "\n".join(
                line.strip()
                for line in _version(
                    ["go", "version", "-m", str(b / "kube-apiserver")]
                ).splitlines()
                if "k8s.io/kubernetes" in line or line.startswith(str(b))
            ),
        }
    versions["containerd"] = _version(["containerd", "--version"])
    if os.environ.get("KUBEGPU_E2E_CONTAINERD"):
        versions["containerd (DRA scenarios)"] = _version(
            [str(containerd_bin_dir() / "containerd"), "--version"]
        )
    versions["runc"] = _version(["runc", "--version"]).splitlines()[0] if versions else ""
    OUT.mkdir(parents=True, exist_ok=True)
    version = kubernetes_version()
    report = {
        "exit_status": int(exitstatus),
        "kubernetes_version": version,
        # The DRA scenarios' gates at this version: stage, default and what was passed
        # (kubegpu_e2e/versions.py); the other clusters pass none.
        "dra_feature_gates": gate_table(FEATURE_GATES, version),
        "scenarios": [{"name": name, **entry} for name, entry in _results.items()],
        "versions": versions,
        "cleanup": _leftovers,
    }
    (OUT / "report.json").write_text(json.dumps(report, indent=2) + "\n")
