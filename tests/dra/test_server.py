"""The DRA kubelet plugin over real unix sockets: registration, prepare, unprepare, restart,
and the claim on its sockets (two real processes: tests/dra/test_dra_driver_process.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubegpu.core.container import ENV_COMPUTE, ENV_MEMORY_LIMIT, ENV_UUID
from kubegpu.core.dra import AllocatedDevice, ClaimRef
from kubegpu.dra.api.dra.v1 import api_pb2 as v1
from kubegpu.dra.api.dra.v1 import api_pb2_grpc as v1_grpc
from kubegpu.dra.api.dra.v1beta1 import api_pb2 as v1beta1
from kubegpu.dra.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from kubegpu.dra.api.pluginregistration.v1 import api_pb2 as reg
from kubegpu.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubegpu.dra.cdi import spec_path
from kubegpu.dra.registration import RegistrationStatus
from kubegpu.dra.server import DraPluginServer
from kubegpu.socket_claim import SocketInUse, socket_identity
from kubegpu.unix_channels import unix_aio_channel

from .conftest import NODE, Node

WHOLE = ClaimRef("team-a", "whole", "aaaaaaaa-0000-4000-8000-000000000001")
SHARE = ClaimRef("team-a", "share", "aaaaaaaa-0000-4000-8000-000000000002")
KIND = "gpu.kubegpu.io/claim"


def claim_message(pb: Any, claim: ClaimRef) -> Any:
    return pb.Claim(namespace=claim.namespace, name=claim.name, uid=claim.uid)


async def prepare(node: Node, *claims: ClaimRef, pb: Any = v1, grpc_mod: Any = v1_grpc) -> Any:
    async with unix_aio_channel(node.sockets.dra) as channel:
        stub = grpc_mod.DRAPluginStub(channel)
        request = pb.NodePrepareResourcesRequest(claims=[claim_message(pb, c) for c in claims])
        return await stub.NodePrepareResources(request, timeout=10)


async def unprepare(node: Node, *claims: ClaimRef) -> Any:
    async with unix_aio_channel(node.sockets.dra) as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        request = v1.NodeUnprepareResourcesRequest(claims=[claim_message(v1, c) for c in claims])
        return await stub.NodeUnprepareResources(request, timeout=10)


def cdi_spec(node: Node, claim: ClaimRef) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(spec_path(node.settings.cdi_dir, claim.uid).read_text())
    return spec


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    (device,) = spec["devices"]
    return dict(line.split("=", 1) for line in device["containerEdits"]["env"])


def allocate_share(node: Node) -> None:
    node.claims.allocate(
        SHARE,
        AllocatedDevice(
            "gpu", NODE, "gpu-1", share_id="s-1", memory_bytes=4 * 2**30, compute_milli=250
        ),
    )


async def test_get_info_names_the_driver_its_endpoint_and_v1_first(
    node: Node, served: DraPluginServer
) -> None:
    assert node.sockets.registration == node.sockets.registration.parent / "gpu.kubegpu.io-reg.sock"
    async with unix_aio_channel(node.sockets.registration) as channel:
        info = await reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=10)
    assert info.type == "DRAPlugin"
    assert info.name == "gpu.kubegpu.io"
    assert info.endpoint == str(node.sockets.dra)
    assert node.sockets.dra.name == "dra.sock"
    assert node.sockets.dra.parent.name == "gpu.kubegpu.io"
    # The health service too: from 1.37 the kubelet opens its stream only when it is listed.
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1alpha1.DRAResourceHealth",
    ]


async def test_registration_status_is_recorded_and_reported(node: Node) -> None:
    seen: list[RegistrationStatus] = []
    async with (
        DraPluginServer(node.preparer(), node.sockets, on_status=seen.append) as server,
        unix_aio_channel(node.sockets.registration) as channel,
    ):
        stub = reg_grpc.RegistrationStub(channel)
        await stub.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=True), timeout=10
        )
        await stub.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=False, error="no handler"), timeout=10
        )
    assert seen == [RegistrationStatus(True, ""), RegistrationStatus(False, "no handler")]
    assert server.registration.statuses == seen


async def test_stop_removes_both_sockets_and_start_replaces_stale_ones(node: Node) -> None:
    for path in (node.sockets.registration, node.sockets.dra):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("stale file of a crashed instance")
    async with DraPluginServer(node.preparer(), node.sockets):
        assert node.sockets.dra.is_socket() and node.sockets.registration.is_socket()
    assert not node.sockets.dra.exists()
    assert not node.sockets.registration.exists()


async def test_prepare_whole_gpu_writes_a_cdi_spec_and_returns_its_ids(
    node: Node, served: DraPluginServer
) -> None:
    node.claims.allocate(WHOLE, AllocatedDevice("gpu", NODE, "gpu-0"))
    response = await prepare(node, WHOLE)
    assert list(response.claims) == [WHOLE.uid]
    entry = response.claims[WHOLE.uid]
    assert entry.error == ""
    (device,) = entry.devices
    assert (device.pool_name, device.device_name, list(device.request_names)) == (
        NODE,
        "gpu-0",
        ["gpu"],
    )
    assert list(device.cdi_device_ids) == [f"{KIND}={WHOLE.uid}-gpu-0"]
    assert not device.HasField("share_id")

    spec = cdi_spec(node, WHOLE)
    assert spec["kind"] == KIND
    assert [d["name"] for d in spec["devices"]] == [f"{WHOLE.uid}-gpu-0"]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    env = env_of(spec)
    assert env[ENV_UUID] == node.inventory.gpus[0].uuid
    assert ENV_MEMORY_LIMIT not in env and ENV_COMPUTE not in env


async def test_prepare_share_puts_its_memory_and_compute_in_the_environment(
    node: Node, served: DraPluginServer
) -> None:
    allocate_share(node)
    response = await prepare(node, SHARE)
    (device,) = response.claims[SHARE.uid].devices
    assert device.share_id == "s-1"
    env = env_of(cdi_spec(node, SHARE))
    assert env[ENV_UUID] == node.inventory.gpus[1].uuid
    assert env[ENV_MEMORY_LIMIT] == "4096"
    assert env[ENV_COMPUTE] == "250"


async def test_a_claim_that_consumed_the_whole_card_is_a_whole_gpu_not_a_share(
    node: Node, served: DraPluginServer
) -> None:
    # What the real allocator records for a request naming no capacity: the policies'
    # defaults, i.e. all of the card's usable memory and compute "1000", with a share ID.
    node.claims.allocate(
        WHOLE,
        AllocatedDevice(
            "gpu", NODE, "gpu-0", share_id="s-w", memory_bytes=81920 * 2**20, compute_milli=1000
        ),
    )
    await prepare(node, WHOLE)
    env = env_of(cdi_spec(node, WHOLE))
    assert env[ENV_UUID] == node.inventory.gpus[0].uuid
    assert ENV_MEMORY_LIMIT not in env and ENV_COMPUTE not in env
    assert "KUBEGPU_GPU_ENFORCEMENT" not in env


async def test_a_share_one_step_short_of_the_card_stays_a_share(
    node: Node, served: DraPluginServer
) -> None:
    node.claims.allocate(
        SHARE,
        AllocatedDevice(
            "gpu", NODE, "gpu-0", share_id="s-1", memory_bytes=81664 * 2**20, compute_milli=1000
        ),
    )
    await prepare(node, SHARE)
    env = env_of(cdi_spec(node, SHARE))
    assert (env[ENV_MEMORY_LIMIT], env[ENV_COMPUTE]) == ("81664", "1000")


async def test_a_share_that_consumed_no_compute_has_no_compute_limit(
    node: Node, served: DraPluginServer
) -> None:
    # Under NVIDIA's naming a request for memory alone consumes the compute default, 0: a
    # share by memory, with no compute limit rather than a limit of 0 %.
    node.claims.allocate(
        SHARE,
        AllocatedDevice(
            "gpu", NODE, "gpu-1", share_id="s-1", memory_bytes=2 * 2**30, compute_milli=0
        ),
    )
    await prepare(node, SHARE)
    env = env_of(cdi_spec(node, SHARE))
    assert env[ENV_MEMORY_LIMIT] == "2048"
    assert ENV_COMPUTE not in env


async def test_all_the_memory_and_no_compute_is_a_whole_gpu(
    node: Node, served: DraPluginServer
) -> None:
    # What the allocator records for a request naming nothing under NVIDIA's naming.
    node.claims.allocate(
        WHOLE,
        AllocatedDevice(
            "gpu", NODE, "gpu-0", share_id="s-w", memory_bytes=81920 * 2**20, compute_milli=0
        ),
    )
    await prepare(node, WHOLE)
    env = env_of(cdi_spec(node, WHOLE))
    assert ENV_MEMORY_LIMIT not in env and ENV_COMPUTE not in env


async def test_v1beta1_serves_the_same_claims_without_share_id(
    node: Node, served: DraPluginServer
) -> None:
    allocate_share(node)
    response = await prepare(node, SHARE, pb=v1beta1, grpc_mod=v1beta1_grpc)
    (device,) = response.claims[SHARE.uid].devices
    assert device.device_name == "gpu-1"
    assert list(device.cdi_device_ids) == [f"{KIND}={SHARE.uid}-gpu-1"]


async def test_repeated_prepare_is_answered_from_the_checkpoint_even_after_a_restart(
    node: Node,
) -> None:
    allocate_share(node)
    async with DraPluginServer(node.preparer(), node.sockets):
        first = await prepare(node, SHARE)
        again = await prepare(node, SHARE)  # a second pod / container using the same claim
    assert node.claims.lookups == 1
    # The claim's allocation changes in the API (it cannot, for a prepared claim; this shows that
    # a restarted driver answers from its checkpoint, not by preparing a second share).
    node.claims.allocate(SHARE, AllocatedDevice("gpu", NODE, "gpu-0"))
    async with DraPluginServer(node.preparer(), node.sockets):
        after_restart = await prepare(node, SHARE)
    assert node.claims.lookups == 1
    assert first == again == after_restart
    assert len(list(node.settings.cdi_dir.iterdir())) == 1


async def test_one_claim_with_two_shares_of_one_card_is_one_cdi_device(
    node: Node, served: DraPluginServer
) -> None:
    node.claims.allocate(
        SHARE,
        AllocatedDevice("a", NODE, "gpu-1", share_id="s-a", memory_bytes=2**30, compute_milli=100),
        AllocatedDevice("b", NODE, "gpu-1", share_id="s-b", memory_bytes=2**30, compute_milli=50),
    )
    response = await prepare(node, SHARE)
    devices = response.claims[SHARE.uid].devices
    assert [list(d.request_names) for d in devices] == [["a"], ["b"]]
    assert {tuple(d.cdi_device_ids) for d in devices} == {(f"{KIND}={SHARE.uid}-gpu-1",)}
    env = env_of(cdi_spec(node, SHARE))
    assert (env[ENV_MEMORY_LIMIT], env[ENV_COMPUTE]) == ("2048", "150")


def envs_by_device(spec: dict[str, Any], claim: ClaimRef) -> dict[str, dict[str, str]]:
    """Each CDI device's environment by the slice device it stands for."""
    return {
        d["name"].removeprefix(f"{claim.uid}-"): dict(
            line.split("=", 1) for line in d["containerEdits"]["env"]
        )
        for d in spec["devices"]
    }


async def test_every_device_of_a_request_names_all_the_gpus_the_container_gets(
    node: Node, served: DraPluginServer
) -> None:
    # The runtime applies each CDI device's env in turn, the last value winning: a two-GPU
    # request whose devices each named only themselves showed the container one GPU.
    node.claims.allocate(
        WHOLE, AllocatedDevice("gpu", NODE, "gpu-1"), AllocatedDevice("gpu", NODE, "gpu-0")
    )
    await prepare(node, WHOLE)
    both = ",".join(g.uuid for g in node.inventory.gpus[:2])  # in GPU index order
    envs = envs_by_device(cdi_spec(node, WHOLE), WHOLE)
    assert sorted(envs) == ["gpu-0", "gpu-1"]
    for env in envs.values():
        assert env["NVIDIA_VISIBLE_DEVICES"] == both
        assert env[ENV_UUID] == both


async def test_devices_of_different_requests_name_only_their_own_request_gpus(
    node: Node, served: DraPluginServer
) -> None:
    # A container that names request "a" gets gpu-0 alone and must be told of gpu-0 alone.
    node.claims.allocate(
        WHOLE, AllocatedDevice("a", NODE, "gpu-0"), AllocatedDevice("b/first", NODE, "gpu-1")
    )
    await prepare(node, WHOLE)
    envs = envs_by_device(cdi_spec(node, WHOLE), WHOLE)
    for index in (0, 1):
        uuid = node.inventory.gpus[index].uuid
        assert envs[f"gpu-{index}"]["NVIDIA_VISIBLE_DEVICES"] == uuid


async def test_a_claim_that_cannot_be_prepared_fails_alone(
    node: Node, served: DraPluginServer
) -> None:
    node.claims.allocate(WHOLE, AllocatedDevice("gpu", NODE, "gpu-0"))
    elsewhere = ClaimRef("team-a", "elsewhere", "aaaaaaaa-0000-4000-8000-000000000003")
    node.claims.allocate(elsewhere, AllocatedDevice("gpu", "node-b", "gpu-0"))
    missing = ClaimRef("team-a", "missing", "aaaaaaaa-0000-4000-8000-000000000004")
    no_such_gpu = ClaimRef("team-a", "gpu9", "aaaaaaaa-0000-4000-8000-000000000005")
    node.claims.allocate(no_such_gpu, AllocatedDevice("gpu", NODE, "gpu-9"))
    response = await prepare(node, WHOLE, elsewhere, missing, no_such_gpu)
    assert response.claims[WHOLE.uid].error == ""
    assert "pool 'node-b', not this node's pool 'node-a'" in response.claims[elsewhere.uid].error
    assert "not found" in response.claims[missing.uid].error
    assert "'gpu-9' is not a GPU of node node-a" in response.claims[no_such_gpu.uid].error
    assert [p.name for p in node.settings.cdi_dir.iterdir()] == [f"kubegpu-dra-{WHOLE.uid}.json"]


async def test_a_path_like_uid_is_refused(node: Node, served: DraPluginServer) -> None:
    evil = ClaimRef("team-a", "evil", "../../etc/passwd")
    response = await prepare(node, evil)
    assert "is not a Kubernetes UID" in response.claims[evil.uid].error


async def test_unprepare_removes_the_spec_and_the_checkpoint_entry_and_is_idempotent(
    node: Node, served: DraPluginServer
) -> None:
    allocate_share(node)
    await prepare(node, SHARE)
    never = ClaimRef("team-a", "never", "aaaaaaaa-0000-4000-8000-000000000009")
    response = await unprepare(node, SHARE, never)
    assert {uid: e.error for uid, e in response.claims.items()} == {SHARE.uid: "", never.uid: ""}
    assert not spec_path(node.settings.cdi_dir, SHARE.uid).exists()
    assert node.preparer().checkpoint.claims() == {}
    again = await unprepare(node, SHARE)
    assert again.claims[SHARE.uid].error == ""
    # prepared again after unprepare: a fresh read of the claim
    await prepare(node, SHARE)
    assert node.claims.lookups == 2


async def test_unprepare_after_restart_removes_what_the_last_instance_prepared(
    node: Node,
) -> None:
    allocate_share(node)
    async with DraPluginServer(node.preparer(), node.sockets):
        await prepare(node, SHARE)
    async with DraPluginServer(node.preparer(), node.sockets):
        await unprepare(node, SHARE)
    assert list(node.settings.cdi_dir.iterdir()) == []
    assert node.preparer().checkpoint.claims() == {}


async def test_unknown_method_path_is_unimplemented(node: Node, served: DraPluginServer) -> None:
    async with unix_aio_channel(node.sockets.dra) as channel:
        call = channel.unary_unary("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/Nope")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call(b"", timeout=10)
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_env_and_device_nodes_match_the_device_plugin() -> None:
    from kubegpu.dra import cdi
    from kubegpu.kubelet import coordinator, resources

    # One contract tells a share what it holds, whichever path serves it.
    assert cdi.share_contract is coordinator.share_contract
    assert cdi.CONTROL_DEVICE_NODES == resources.CONTROL_DEVICE_NODES


def test_socket_paths_default_to_the_kubelet_directories() -> None:
    from kubegpu.dra.registration import SocketPaths

    paths = SocketPaths.for_driver("gpu.kubegpu.io")
    assert paths.registration == Path("/var/lib/kubelet/plugins_registry/gpu.kubegpu.io-reg.sock")
    assert paths.dra == Path("/var/lib/kubelet/plugins/gpu.kubegpu.io/dra.sock")


async def test_an_unwritable_cdi_dir_fails_the_claim_not_the_call(node: Node) -> None:
    node.settings.cdi_dir.parent.mkdir(parents=True, exist_ok=True)
    node.settings.cdi_dir.write_text("a file where the CDI directory should be")
    node.claims.allocate(WHOLE, AllocatedDevice("gpu", NODE, "gpu-0"))
    async with DraPluginServer(node.preparer(), node.sockets):
        response = await prepare(node, WHOLE)
    error = response.claims[WHOLE.uid].error
    assert error.startswith(f"claim {WHOLE}: ")
    assert str(node.settings.cdi_dir) in error
    assert node.preparer().checkpoint.claims() == {}


async def test_a_first_available_subrequest_is_reported_under_its_parent_request(
    node: Node, served: DraPluginServer
) -> None:
    node.claims.allocate(WHOLE, AllocatedDevice("gpu/a100", NODE, "gpu-0"))
    response = await prepare(node, WHOLE)
    (device,) = response.claims[WHOLE.uid].devices
    assert list(device.request_names) == ["gpu"]


async def test_a_second_server_on_the_same_sockets_is_refused_and_touches_nothing(
    node: Node, served: DraPluginServer
) -> None:
    before = {p: socket_identity(p) for p in (node.sockets.registration, node.sockets.dra)}
    second = DraPluginServer(node.preparer(), node.sockets)
    with pytest.raises(SocketInUse) as raised:
        await second.start()
    assert str(node.sockets.dra) in str(raised.value)
    assert f"served by another DRA driver (pid {os.getpid()} on " in str(raised.value)
    await second.stop()  # a server that never started removes nothing either
    assert {p: socket_identity(p) for p in before} == before
    async with unix_aio_channel(node.sockets.registration) as channel:
        info = await reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=10)
    assert info.name == "gpu.kubegpu.io"
