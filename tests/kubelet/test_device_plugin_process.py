"""The device plugin as a separate process, driven through the kubelet emulator."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.health import CATALOG_IGNORED_XIDS
from kubegpu.inventory.fake import send_fake_gpu_command
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.testing.kubelet import AllocationError, KubeletEmulator, SeenDevice
from tests.inventory.contract import nvml_present
from tests.kubelet.conftest import RESOURCE, Node, PluginProcess

A100 = resolve_fake_spec("8xA100-80GB-NVLink").inventory
UUIDS = [g.uuid for g in A100.gpus]


def link_score(combo: tuple[str, ...]) -> int:
    """Total pairwise score, written apart from the plugin: 100 per NVLink lane + PCIe level,
    +5 when both GPUs sit on the same NUMA node."""
    total = 0
    for a, b in itertools.combinations(combo, 2):
        ga, gb = A100.by_uuid(GpuUuid(a)), A100.by_uuid(GpuUuid(b))
        link = A100.link(ga.uuid, gb.uuid)
        total += 0 if link is None else 100 * link.nvlinks + link.pcie.value
        total += 5 if ga.numa_node is not None and ga.numa_node == gb.numa_node else 0
    return total


def brute_force_best_score(ids: Sequence[str], must: Sequence[str], size: int) -> int:
    return max(link_score(c) for c in itertools.combinations(ids, size) if set(must) <= set(c))


def all_healthy(devices: Mapping[str, SeenDevice]) -> bool:
    return len(devices) == 8 and all(d.healthy for d in devices.values())


def test_registers_with_the_kubelet_and_lists_every_gpu_with_numa(a100_node: Node) -> None:
    reg = a100_node.kubelet.registration(RESOURCE)
    assert reg is not None
    assert reg.version == "v1beta1"
    assert reg.endpoint == "kubegpu-nvidia.com_gpu.sock"
    assert reg.get_preferred_allocation_available
    assert not reg.pre_start_required
    devices = a100_node.kubelet.devices(RESOURCE)
    assert sorted(devices) == sorted(UUIDS)
    for gpu in A100.gpus:
        want = () if gpu.numa_node is None else (gpu.numa_node,)
        assert devices[gpu.uuid].numa_nodes == want
    assert (a100_node.kubelet_dir / reg.endpoint).is_socket()


def test_allocate_sets_visible_devices_for_the_chosen_gpus(a100_node: Node) -> None:
    alloc = a100_node.kubelet.allocate(RESOURCE, 2, pod_uid="pod-alloc")
    try:
        assert sorted(alloc.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(alloc.device_ids)
        assert alloc.devices == ()  # passDeviceSpecs is off by default
        assert alloc.cdi_devices == ()
    finally:
        a100_node.kubelet.release("pod-alloc")


@pytest.mark.parametrize(
    ("size", "must_idx"),
    [(2, []), (3, [5]), (4, [1, 6]), (5, []), (7, [0])],
    ids=["2", "3-must5", "4-must1,6", "5", "7-must0"],
)
def test_preferred_allocation_is_optimal_and_honours_must_include(
    a100_node: Node, size: int, must_idx: list[int]
) -> None:
    must = [UUIDS[i] for i in must_idx]
    alloc = a100_node.kubelet.allocate(RESOURCE, size, must_include=must, pod_uid="pod-pref")
    try:
        assert alloc.preferred_device_ids is not None
        chosen = list(alloc.preferred_device_ids)
        assert set(must) <= set(chosen)
        assert link_score(tuple(chosen)) == brute_force_best_score(list(UUIDS), must, size)
        assert list(alloc.device_ids) == chosen
    finally:
        a100_node.kubelet.release("pod-pref")


def test_allocate_of_an_unknown_id_is_invalid_argument_naming_it(a100_node: Node) -> None:
    with pytest.raises(AllocationError) as err:
        a100_node.kubelet.allocate_raw(RESOURCE, [UUIDS[0], "GPU-does-not-exist"])
    assert err.value.grpc_code == "INVALID_ARGUMENT"
    assert "GPU-does-not-exist" in str(err.value)


def test_reregisters_after_twenty_kubelet_restarts_with_the_device_list_intact(
    a100_node: Node,
) -> None:
    kubelet = a100_node.kubelet
    before = sum(r.resource_name == RESOURCE for r in kubelet.registrations)
    for n in range(1, 21):
        kubelet.restart()
        kubelet.wait_for_registration(RESOURCE, timeout_s=20, count=before + n)
        kubelet.wait_for_devices(RESOURCE, all_healthy, timeout_s=20)
        assert sorted(kubelet.devices(RESOURCE)) == sorted(UUIDS)
    assert kubelet.is_connected(RESOURCE)


def test_recreates_its_socket_and_reregisters_when_the_socket_is_deleted(
    a100_node: Node,
) -> None:
    kubelet = a100_node.kubelet
    reg = kubelet.registration(RESOURCE)
    assert reg is not None
    sock = a100_node.kubelet_dir / reg.endpoint
    before = sum(r.resource_name == RESOURCE for r in kubelet.registrations)
    sock.unlink()
    kubelet.wait_for_registration(RESOURCE, timeout_s=20, count=before + 1)
    kubelet.wait_for_devices(RESOURCE, all_healthy, timeout_s=20)
    assert sock.is_socket()


# Health tests change GPU state for good (no recovery by default), so they run last in this
# module and each uses its own GPU.


def ignored_xid_line(index: int, xid: int) -> str:
    """What the agent logs when its health policy lets an Xid pass (node, GPU and Xid named)."""
    return f"node test-node: GPU {index} ({UUIDS[index]}): ignoring Xid {xid} "


def test_application_xid_13_keeps_the_gpu_healthy(a100_node: Node) -> None:
    kubelet = a100_node.kubelet
    reply = send_fake_gpu_command(a100_node.plugin.control, "xid", gpu=2, xid=13)
    assert reply["ok"], reply
    # Each GPU has its own monitor thread, so only this GPU's own verdict proves the Xid 13 was
    # read and judged: the agent logs it by node, GPU and Xid. Had it counted as critical, the
    # line would never come and the GPU would be reported Unhealthy instead.
    a100_node.plugin.wait_for_log(ignored_xid_line(2, 13), timeout_s=10)
    assert kubelet.devices(RESOURCE)[UUIDS[2]].healthy
    assert f"GPU 2 ({UUIDS[2]}) unhealthy" not in a100_node.plugin.log()


def test_critical_xid_79_marks_that_gpu_unhealthy_on_the_stream(a100_node: Node) -> None:
    kubelet = a100_node.kubelet
    send_fake_gpu_command(a100_node.plugin.control, "xid", gpu=4, xid=79)
    update = kubelet.wait_for_devices(RESOURCE, lambda d: not d[UUIDS[4]].healthy, timeout_s=10)
    unhealthy = {i for i, d in update.devices.items() if not d.healthy}
    assert UUIDS[4] in unhealthy
    assert UUIDS[5] not in unhealthy
    assert kubelet.allocatable(RESOURCE) == 8 - len(unhealthy)
    assert kubelet.capacity(RESOURCE) == 8


def test_lost_gpu_is_unhealthy_on_the_stream(a100_node: Node) -> None:
    kubelet = a100_node.kubelet
    send_fake_gpu_command(a100_node.plugin.control, "lose", gpu=6)
    kubelet.wait_for_devices(RESOURCE, lambda d: not d[UUIDS[6]].healthy, timeout_s=10)
    logged = a100_node.plugin.log()
    assert f"GPU {UUIDS[6]} is Unhealthy" in logged
    assert "resource nvidia.com/gpu" in logged


def test_nvidia_healthcheck_env_reaches_the_running_agent(tempdir: Path) -> None:
    # NVIDIA's DaemonSets set these; the agent must read them from its own environment.
    env = {"DP_DISABLE_HEALTHCHECKS": "79", "DP_ENABLE_HEALTHCHECKS": "13"}
    node = Node(tempdir, env=env)
    try:
        kubelet, plugin = node.kubelet, node.plugin
        kubelet.wait_for_devices(RESOURCE, all_healthy, timeout_s=30)
        # The start-up line states the effective set: 79 added, 13 taken back out.
        ignored = sorted((CATALOG_IGNORED_XIDS | {79}) - {13})
        plugin.wait_for_log(
            f"node test-node: watching 8 GPUs; ignoring Xids {ignored}; "
            "Xids [54, 151] wait for a node reboot",
            timeout_s=10,
        )

        send_fake_gpu_command(plugin.control, "xid", gpu=0, xid=79)
        plugin.wait_for_log(ignored_xid_line(0, 79), timeout_s=10)
        assert kubelet.devices(RESOURCE)[UUIDS[0]].healthy

        seq = kubelet.update_count(RESOURCE)
        send_fake_gpu_command(plugin.control, "xid", gpu=1, xid=13)
        update = kubelet.wait_for_devices(
            RESOURCE, lambda d: not d[UUIDS[1]].healthy, timeout_s=10, after_sequence=seq
        )
        assert {i for i, d in update.devices.items() if not d.healthy} == {UUIDS[1]}
        assert f"GPU 1 ({UUIDS[1]}) unhealthy: Xid 13" in plugin.log()
    finally:
        assert node.close() == 0


def test_sigterm_exits_zero_and_removes_the_socket(tempdir: Path) -> None:
    node = Node(tempdir)
    try:
        reg = node.kubelet.wait_for_registration(RESOURCE, timeout_s=30)
        sock = node.kubelet_dir / reg.endpoint
        assert sock.is_socket()
        node.plugin.send(signal.SIGTERM)
        assert node.plugin.proc.wait(20) == 0
        assert not sock.exists()
        assert not node.plugin.control.exists()
    finally:
        node.close()


def missing_control_socket(tempdir: Path) -> tuple[str, ...]:
    """Flags that make the fake backend fail to start: its control socket cannot be bound.

    They follow PluginProcess's own ``--fake-control`` and win, as click keeps the last value.
    """
    return ("--fake-control", str(tempdir / "missing-dir" / "ctl.sock"))


def test_backend_error_exits_one_with_its_message(tempdir: Path) -> None:
    plugin = PluginProcess(tempdir / "dp", extra=missing_control_socket(tempdir))
    assert plugin.proc.wait(30) == 1
    assert f"cannot listen on the fake GPU control socket {tempdir}/missing-dir" in plugin.log()
    plugin.stop()


def test_without_fail_on_init_error_a_backend_error_idles_until_sigterm(tempdir: Path) -> None:
    plugin = PluginProcess(
        tempdir / "dp", extra=(*missing_control_socket(tempdir), "--no-fail-on-init-error")
    )
    plugin.wait_for_log("idling until stopped", timeout_s=30)
    assert plugin.proc.poll() is None
    assert plugin.stop() == 0


def device_plugin(tempdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEGPU_")}
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", "device-plugin", "--kubelet-dir", str(tempdir), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


@pytest.mark.parametrize("fail_on_init_error", ["--fail-on-init-error", "--no-fail-on-init-error"])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ("--backend", "fake"),
            "--backend fake needs --fake-gpus (a preset name or a YAML file)",
            id="fake without --fake-gpus",
        ),
        pytest.param(
            ("--backend", "fake", "--fake-gpus", "no-such-preset"),
            "no-such-preset: neither a preset nor a readable file",
            id="unknown preset",
        ),
        pytest.param(
            ("--backend", "auto", "--fake-gpus", "4xT4"),
            "--fake-gpus and --fake-control only apply to --backend fake",
            id="--fake-gpus without the fake backend",
        ),
    ],
)
def test_usage_errors_exit_two_naming_the_option_whatever_fail_on_init_error_says(
    tempdir: Path, args: tuple[str, ...], message: str, fail_on_init_error: str
) -> None:
    # failOnInitError=false idles on a node whose GPUs cannot be opened; a typo in the
    # invocation is not that, and must not leave a pod Running that advertises nothing.
    result = device_plugin(tempdir, *args, fail_on_init_error)
    assert result.returncode == 2, result.stderr
    assert f"kubegpu device-plugin: {message}" in result.stderr
    assert list(tempdir.iterdir()) == []


@pytest.mark.skipif(nvml_present(), reason="this node has NVML; auto would find it")
@pytest.mark.parametrize(
    ("backend", "message"),
    [
        pytest.param(
            "auto",
            "kubegpu device-plugin: no NVIDIA GPU or NVML found on this node (NVML library not "
            "found while initialising NVML)",
            id="auto",
        ),
        pytest.param(
            "nvml",
            "kubegpu device-plugin: NVML library not found while initialising NVML",
            id="nvml",
        ),
    ],
)
def test_without_nvml_the_nvml_backends_exit_one_and_never_fake_gpus(
    tempdir: Path, backend: str, message: str
) -> None:
    kubelet = KubeletEmulator(tempdir / "dp")
    kubelet.start()
    try:
        result = device_plugin(tempdir / "dp", "--backend", backend)
        assert result.returncode == 1, result.stderr
        assert message in result.stderr
        assert "is the NVIDIA driver installed" in result.stderr
        if backend == "auto":
            assert "for development without a GPU use --backend fake --fake-gpus PRESET" in (
                result.stderr
            )
        # Nothing was advertised: no registration, no socket of ours beside kubelet.sock.
        assert kubelet.registrations == []
        assert sorted(p.name for p in (tempdir / "dp").iterdir()) == ["kubelet.sock"]
    finally:
        kubelet.stop()


def test_a_missing_or_malformed_kubeconfig_exits_two_naming_it(tempdir: Path) -> None:
    fake = ("--backend", "fake", "--fake-gpus", "4xT4")
    missing = device_plugin(tempdir, *fake, "--kubeconfig", str(tempdir / "nope.yaml"))
    assert missing.returncode == 2, missing.stderr
    assert "'--kubeconfig'" in missing.stderr
    assert "nope.yaml" in missing.stderr and "does not exist" in missing.stderr

    broken = tempdir / "broken.yaml"
    broken.write_text("apiVersion: v1\nkind: Config\n")  # no clusters
    result = device_plugin(tempdir, *fake, "--kubeconfig", str(broken))
    assert result.returncode == 2, result.stderr
    assert f"kubegpu device-plugin: cannot use kubeconfig {broken}: " in result.stderr
    assert "Traceback" not in result.stderr


def imported_modules(log: str) -> set[str]:
    """Module names from ``-X importtime`` lines (``import time: self | cumulative | name``)."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in log.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


def test_without_api_access_the_agent_never_imports_the_api_sharing_or_exporter_stack(
    tempdir: Path,
) -> None:
    # Peak RSS has a target (docs/benchmarks.md): what a whole-GPU node without API access
    # does not use must not be loaded, on start, on a health change or on stop.
    node = Node(tempdir, env={"PYTHONPROFILEIMPORTTIME": "1"})
    try:
        node.kubelet.wait_for_registration(RESOURCE, timeout_s=30)
        node.kubelet.wait_for_devices(RESOURCE, all_healthy, timeout_s=30)
        send_fake_gpu_command(node.plugin.control, "xid", gpu=1, xid=79)
        node.kubelet.wait_for_devices(RESOURCE, lambda d: not d[UUIDS[1]].healthy, timeout_s=10)
    finally:
        assert node.close() == 0
    modules = imported_modules(node.plugin.log())
    assert {"grpc", "kubegpu.kubelet.agent", "kubegpu.inventory.health"} <= modules
    unwanted_packages = (
        "lightkube",
        "httpx",
        "httpx2",
        "prometheus_client",
        "kubegpu.kube",
        "kubegpu.sharing",
        "kubegpu.enforcement",
        "kubegpu.kubelet.cluster",
        "kubegpu.kubelet.coordinator",
        "kubegpu.kubelet.shares",
        # The probes serve /healthz on kubegpu.httpd; nothing else of the exporter.
        "kubegpu.exporter.collector",
        "kubegpu.exporter.refresher",
        "kubegpu.exporter.server",
        "kubegpu.exporter.pods",
        "kubegpu.exporter.health",
    )
    unwanted = {m for m in modules for p in unwanted_packages if m == p or m.startswith(p + ".")}
    assert sorted(unwanted) == []
