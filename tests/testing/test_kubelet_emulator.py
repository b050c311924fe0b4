"""The kubelet emulator against a device plugin double, over real unix sockets."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from kubegpu.testing.kubelet import (
    AllocationError,
    KubeletEmulator,
    SeenDevice,
    is_extended_resource_name,
)
from tests.testing.kubelet_plugin_double import FakeDevice, PluginDouble

RESOURCE = "example.com/gpu"
FOUR = [FakeDevice(f"gpu-{i}", numa=(i // 2,)) for i in range(4)]


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Short path: unix socket paths are limited to 107 bytes, pytest's tmp_path can exceed it.
    path = Path(tempfile.mkdtemp(prefix="kg-kubelet-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[KubeletEmulator]:
    with KubeletEmulator(plugin_dir, dial_timeout_s=1.0) as emulator:
        yield emulator


@pytest.fixture
def plugin(plugin_dir: Path, kubelet: KubeletEmulator) -> Iterator[PluginDouble]:
    double = PluginDouble(plugin_dir, FOUR).serve()
    double.register()
    kubelet.wait_for_devices(RESOURCE, lambda devices: len(devices) == 4)
    yield double
    double.stop()


def all_healthy(devices: Mapping[str, SeenDevice]) -> bool:
    return bool(devices) and all(d.healthy for d in devices.values())


# -- registration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("example.com/gpu", True),
        ("nvidia.com/gpu", True),
        ("kubegpu.io/gpu-shared", True),
        ("a.b-c.example/Gpu_1.x", True),
        ("gpu", False),
        ("kubernetes.io/gpu", False),
        ("foo.kubernetes.io/gpu", False),
        ("requests.example.com/gpu", False),
        ("example.com/", False),
        ("/gpu", False),
        ("Example.com/gpu", False),
        ("example.com/gpu/extra", False),
        ("example.com/-gpu", False),
        ("example.com/" + "g" * 64, False),
    ],
)
def test_extended_resource_names_follow_kubernetes_rules(name: str, valid: bool) -> None:
    assert is_extended_resource_name(name) is valid


def test_accepts_a_valid_registration_and_reads_the_plugin_options(
    plugin_dir: Path, kubelet: KubeletEmulator
) -> None:
    double = PluginDouble(plugin_dir, FOUR, preferred=True, pre_start=True).serve()
    try:
        double.register()
        registration = kubelet.wait_for_registration(RESOURCE, timeout_s=5)
        assert registration.endpoint == "double.sock"
        assert registration.version == "v1beta1"
        assert registration.get_preferred_allocation_available is True
        assert registration.pre_start_required is True
        # GetDevicePluginOptions happens inside Register, ListAndWatch after it.
        assert double.call_names()[0] == "GetDevicePluginOptions"
        kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 4, timeout_s=5)
        assert double.call_names()[:2] == ["GetDevicePluginOptions", "ListAndWatch"]
    finally:
        double.stop()


def test_rejects_an_unsupported_version_with_the_kubelet_error(
    plugin_dir: Path, kubelet: KubeletEmulator
) -> None:
    double = PluginDouble(plugin_dir, FOUR).serve()
    try:
        with pytest.raises(grpc.RpcError) as caught:
            double.register(version="v1alpha1")
        assert caught.value.code() == grpc.StatusCode.UNKNOWN
        assert caught.value.details() == (
            'requested API version "v1alpha1" is not supported by kubelet. '
            'Supported version is ["v1beta1"]'
        )
        assert kubelet.registrations == []
        assert double.calls == []
    finally:
        double.stop()


@pytest.mark.parametrize("name", ["gpu", "kubernetes.io/gpu", "requests.example.com/gpu"])
def test_rejects_an_invalid_resource_name_with_the_kubelet_error(
    plugin_dir: Path, kubelet: KubeletEmulator, name: str
) -> None:
    double = PluginDouble(plugin_dir, FOUR).serve()
    try:
        with pytest.raises(grpc.RpcError) as caught:
            double.register(resource=name)
        assert caught.value.details() == f'the ResourceName "{name}" is invalid'
        assert [r.resource_name for r in kubelet.rejected_registrations] == [name]
        assert kubelet.registrations == []
    finally:
        double.stop()


def test_rejects_a_registration_whose_endpoint_is_not_serving(
    plugin_dir: Path, kubelet: KubeletEmulator
) -> None:
    double = PluginDouble(plugin_dir, FOUR)  # never served
    with pytest.raises(grpc.RpcError) as caught:
        double.register()
    assert "failed to dial device plugin" in (caught.value.details() or "")
    assert kubelet.registrations == []


# -- ListAndWatch ---------------------------------------------------------------------------


def test_list_and_watch_keeps_the_latest_full_device_list(
    kubelet: KubeletEmulator, plugin: PluginDouble
) -> None:
    devices = kubelet.devices(RESOURCE)
    assert devices["gpu-3"] == SeenDevice("gpu-3", "Healthy", (1,))
    before = kubelet.update_count(RESOURCE)

    plugin.set_devices([FOUR[0], FakeDevice("gpu-1", healthy=False, numa=(0,)), FOUR[2]])
    update = kubelet.wait_for_devices(
        RESOURCE, lambda d: len(d) == 3, timeout_s=5, after_sequence=before
    )

    assert update.source == "list_and_watch"
    assert update.sequence == before + 1
    assert update.devices["gpu-1"].health == "Unhealthy"
    assert "gpu-3" not in kubelet.devices(RESOURCE)  # left out of a snapshot = removed
    assert (kubelet.capacity(RESOURCE), kubelet.allocatable(RESOURCE)) == (3, 2)


def test_stream_end_marks_every_device_unhealthy(
    kubelet: KubeletEmulator, plugin: PluginDouble
) -> None:
    plugin.stop()
    update = kubelet.wait_for_devices(
        RESOURCE, lambda d: not any(s.healthy for s in d.values()), timeout_s=5
    )
    assert update.source == "disconnect"
    assert (kubelet.capacity(RESOURCE), kubelet.allocatable(RESOURCE)) == (4, 0)
    assert not kubelet.is_connected(RESOURCE)
    with pytest.raises(AllocationError, match="has been stopped"):
        kubelet.allocate(RESOURCE, 1)


def test_a_new_registration_replaces_the_stream(
    plugin_dir: Path, kubelet: KubeletEmulator, plugin: PluginDouble
) -> None:
    # What a well-behaved plugin does: stop the old server, serve a fresh socket, register.
    plugin.stop()
    kubelet.wait_for_devices(RESOURCE, lambda d: not all_healthy(d), timeout_s=5)
    second = PluginDouble(plugin_dir, [FakeDevice("new-0")], socket_name="second.sock").serve()
    try:
        second.register()
        kubelet.wait_for_registration(RESOURCE, timeout_s=5, count=2)
        kubelet.wait_for_devices(RESOURCE, lambda d: set(d) == {"new-0"}, timeout_s=5)
        assert kubelet.is_connected(RESOURCE)
        assert kubelet.registration(RESOURCE) == kubelet.registrations[-1]
        assert kubelet.allocate(RESOURCE, 1).device_ids == ("new-0",)
    finally:
        second.stop()


def test_an_old_stream_ending_after_reregistration_disconnects_the_new_endpoint(
    plugin_dir: Path, kubelet: KubeletEmulator, plugin: PluginDouble
) -> None:
    """The kubelet's stream cleanup looks the client up by resource name (fact sheet 1.5).

    A plugin that registers again while its old stream is still open loses its new endpoint
    when the old stream ends; this is why plugins stop the old server before re-registering.
    """
    second = PluginDouble(plugin_dir, [FakeDevice("new-0")], socket_name="second.sock").serve()
    try:
        second.register()
        kubelet.wait_for_devices(RESOURCE, lambda d: set(d) == {"new-0"}, timeout_s=5)
        plugin.stop()  # the superseded stream ends now
        update = kubelet.wait_for_devices(RESOURCE, lambda d: not all_healthy(d), timeout_s=5)
        assert update.source == "disconnect"
        assert update.devices == {"new-0": SeenDevice("new-0", "Unhealthy")}
        assert not kubelet.is_connected(RESOURCE)
    finally:
        second.stop()


# -- allocation -----------------------------------------------------------------------------


def test_allocation_asks_for_a_preference_then_allocates_the_preferred_ids(
    kubelet: KubeletEmulator, plugin: PluginDouble
) -> None:
    allocation = kubelet.allocate(RESOURCE, 2, pod_uid="uid-1", container="train")

    assert plugin.call_names()[2:] == ["GetPreferredAllocation", "Allocate"]
    preferred_request = plugin.calls[2][1].container_requests[0]
    assert sorted(preferred_request.available_deviceIDs) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert list(preferred_request.must_include_deviceIDs) == []
    assert preferred_request.allocation_size == 2
    allocate_request = plugin.calls[3][1]
    assert len(allocate_request.container_requests) == 1
    # The double prefers the highest ids; the emulator alone would pick the lowest.
    assert sorted(allocate_request.container_requests[0].devices_ids) == ["gpu-2", "gpu-3"]
    assert sorted(allocation.device_ids) == ["gpu-2", "gpu-3"]
    assert allocation.preferred_device_ids is not None
    assert allocation.envs["FAKE_VISIBLE_DEVICES"] in {"gpu-3,gpu-2", "gpu-2,gpu-3"}
    assert allocation.mounts[0].read_only is True
    assert {d.container_path for d in allocation.devices} == {"/dev/fakegpu-2", "/dev/fakegpu-3"}
    assert set(allocation.cdi_devices) == {"example.com/gpu=gpu-2", "example.com/gpu=gpu-3"}
    assert allocation.numa_nodes == {"gpu-2": (1,), "gpu-3": (1,)}
    assert allocation.pre_start_called is False


def test_must_include_ids_are_offered_and_required(
    kubelet: KubeletEmulator, plugin: PluginDouble
) -> None:
    allocation = kubelet.allocate(RESOURCE, 2, must_include=["gpu-0"])
    request = plugin.calls[2][1].container_requests[0]
    assert list(request.must_include_deviceIDs) == ["gpu-0"]
    assert "gpu-0" in request.available_deviceIDs
    assert sorted(allocation.device_ids) == ["gpu-0", "gpu-3"]


def test_without_the_preferred_option_the_emulator_picks_alone(
    plugin_dir: Path, kubelet: KubeletEmulator
) -> None:
    double = PluginDouble(plugin_dir, FOUR, preferred=False, pre_start=True).serve()
    try:
        double.register()
        kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 4, timeout_s=5)
        allocation = kubelet.allocate(RESOURCE, 2, pod_uid="p", container="c")
        names = double.call_names()
        assert "GetPreferredAllocation" not in names
        assert names[-2:] == ["Allocate", "PreStartContainer"]
        assert list(double.calls[-1][1].devices_ids) == list(allocation.device_ids)
        assert allocation.pre_start_called is True
        # A container restart calls PreStartContainer again but never Allocate.
        assert kubelet.start_container("p", "c") == 1
        assert double.call_names()[-2:] == ["PreStartContainer", "PreStartContainer"]
    finally:
        double.stop()


def test_allocated_and_unhealthy_devices_are_not_offered_again(
    kubelet: KubeletEmulator, plugin: PluginDouble
) -> None:
    first = kubelet.allocate(RESOURCE, 2, pod_uid="a")
    plugin.set_devices([FOUR[0], FOUR[1], FOUR[2], FakeDevice("gpu-3", healthy=False)])
    kubelet.wait_for_devices(RESOURCE, lambda d: not d["gpu-3"].healthy, timeout_s=5)

    second = kubelet.allocate(RESOURCE, 1, pod_uid="b")
    offered = plugin.calls[-2][1].container_requests[0].available_deviceIDs
    assert set(offered).isdisjoint(first.device_ids)
    assert "gpu-3" not in offered
    assert set(second.device_ids) <= set(offered)
    # 4 devices: 2 taken by "a", 1 by "b", and "a"'s gpu-3 is unhealthy besides.
    with pytest.raises(AllocationError, match="Requested: 2, Available: 1"):
        kubelet.allocate(RESOURCE, 2, pod_uid="c")


def test_the_same_container_gets_its_recorded_allocation_without_an_rpc(
    kubelet: KubeletEmulator, plugin: PluginDouble
) -> None:
    first = kubelet.allocate(RESOURCE, 1, pod_uid="a", container="main")
    calls = len(plugin.calls)
    assert kubelet.allocate(RESOURCE, 1, pod_uid="a", container="main") == first
    assert len(plugin.calls) == calls


def test_release_returns_devices_to_the_free_pool(
    kubelet: KubeletEmulator, plugin: PluginDouble
) -> None:
    taken = kubelet.allocate(RESOURCE, 4, pod_uid="a")
    with pytest.raises(AllocationError):
        kubelet.allocate(RESOURCE, 1, pod_uid="b")
    assert sorted(kubelet.release("a")) == sorted(taken.device_ids)
    assert kubelet.allocate(RESOURCE, 1, pod_uid="b").device_ids
    assert [a.pod_uid for a in kubelet.allocations()] == ["b"]


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (["gpu-3"], "1 devices instead of 2"),
        (["gpu-3", "gpu-9"], "outside the available set"),
        (["gpu-3", "gpu-3"], "duplicate ids"),
        (["gpu-2", "gpu-3"], "must-include ids missing"),
    ],
)
def test_an_invalid_preferred_answer_fails_admission(
    plugin_dir: Path, kubelet: KubeletEmulator, answer: list[str], problem: str
) -> None:
    double = PluginDouble(plugin_dir, FOUR, prefer=lambda _request: answer).serve()
    try:
        double.register()
        kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 4, timeout_s=5)
        with pytest.raises(AllocationError, match=problem):
            kubelet.allocate(RESOURCE, 2, must_include=["gpu-0"])
        assert "Allocate" not in double.call_names()
        assert kubelet.allocations() == []
    finally:
        double.stop()


def test_allocate_raw_sends_unknown_ids_and_surfaces_the_plugin_error(
    kubelet: KubeletEmulator, plugin: PluginDouble
) -> None:
    with pytest.raises(AllocationError) as caught:
        kubelet.allocate_raw(RESOURCE, ["gpu-0", "no-such-gpu"])
    assert caught.value.grpc_code == "INVALID_ARGUMENT"
    assert list(plugin.calls[-1][1].container_requests[0].devices_ids) == ["gpu-0", "no-such-gpu"]
    assert kubelet.allocations() == []
    response = kubelet.allocate_raw(RESOURCE, ["gpu-1"])
    assert response.envs == {"FAKE_VISIBLE_DEVICES": "gpu-1"}


# -- restart --------------------------------------------------------------------------------


def test_restart_wipes_sockets_recreates_kubelet_sock_and_keeps_allocations(
    plugin_dir: Path, kubelet: KubeletEmulator, plugin: PluginDouble
) -> None:
    kept = kubelet.allocate(RESOURCE, 1, pod_uid="a")
    regular_file = plugin_dir / "kubelet_internal_checkpoint"
    regular_file.write_text("{}")

    kubelet.restart()

    assert not plugin.socket_path.exists()
    assert regular_file.exists()
    assert kubelet.kubelet_socket.is_socket()
    assert kubelet.devices(RESOURCE) == {}
    assert kubelet.allocations() == [kept]
    assert not kubelet.is_connected(RESOURCE)

    # The plugin comes back on a fresh socket and registers again.
    plugin.stop()
    plugin.serve()
    plugin.register()
    kubelet.wait_for_registration(RESOURCE, timeout_s=5, count=2)
    kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 4, timeout_s=5)
    offered = kubelet.allocate(RESOURCE, 3, pod_uid="b").device_ids
    assert kept.device_ids[0] not in offered


def test_stop_removes_the_kubelet_socket(plugin_dir: Path) -> None:
    emulator = KubeletEmulator(plugin_dir)
    emulator.start()
    assert (plugin_dir / "kubelet.sock").is_socket()
    emulator.stop()
    assert not (plugin_dir / "kubelet.sock").exists()


def test_start_deletes_stale_sockets_like_kubelet_startup(plugin_dir: Path) -> None:
    stale = PluginDouble(plugin_dir, FOUR, socket_name="stale.sock").serve()
    stale.stop()
    server = grpc.server(futures.ThreadPoolExecutor(1))
    server.add_insecure_port(f"unix://{plugin_dir / 'leftover.sock'}")
    server.start()
    try:
        assert (plugin_dir / "leftover.sock").is_socket()
        with KubeletEmulator(plugin_dir):
            assert not (plugin_dir / "leftover.sock").exists()
    finally:
        server.stop(grace=None).wait()


def test_device_state_treats_anything_but_healthy_as_unhealthy() -> None:
    assert SeenDevice("x", "Healthy").healthy
    assert not SeenDevice("x", "healthy").healthy
    assert not SeenDevice("x", "").healthy
    assert dp.Device(ID="x").health == ""
