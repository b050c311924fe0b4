"""A claim of several requests, over the real gRPC socket: a container naming the whole claim
is told of every GPU it gets, one naming a request of that request's GPUs only.

What a container gets is modelled on the kubelet and the runtime (:func:`container_view`): the
kubelet hands a container that names request R the CDI ids of the answer's devices whose
``request_names`` hold R (or are empty), and one that names no request every device's
(``ClaimInfo.cdiDevicesAsList`` in kubelet/cm/dra); the runtime then applies each CDI device's
edits in that order, a variable's last value winning. The DRA example driver's
``basic-multiple-requests`` demo is such a claim: its container names the whole claim.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kubegpu.config.model import Dra
from kubegpu.core.dra import WHOLE_CLAIM_REQUEST, AllocatedDevice, ClaimRef
from kubegpu.dra.server import DraPluginServer

from .conftest import NODE, Node
from .test_server import KIND, cdi_spec, prepare

CLAIM = ClaimRef("team-a", "two-requests", "dddddddd-0000-4000-8000-000000000001")


def container_view(
    answer: Any, spec: dict[str, Any], request: str | None
) -> tuple[dict[str, str], list[str]]:
    """The environment and GPU device nodes of a container naming ``request`` of the claim
    (None: the whole claim), from the driver's answer and the claim's CDI spec."""
    ids = [
        cdi_id
        for device in answer.devices
        if request is None or not device.request_names or request in device.request_names
        for cdi_id in device.cdi_device_ids
    ]
    by_id = {f"{spec['kind']}={d['name']}": d["containerEdits"] for d in spec["devices"]}
    env: dict[str, str] = {}
    nodes: list[str] = []
    for cdi_id in ids:
        edits = by_id[cdi_id]
        env.update(line.split("=", 1) for line in edits.get("env", []))
        nodes += [n["path"] for n in edits.get("deviceNodes", [])]
    return env, nodes


def uuids(node: Node, *indexes: int) -> str:
    return ",".join(node.inventory.gpus[i].uuid for i in indexes)


async def test_a_container_naming_the_whole_claim_is_told_of_every_request_gpus(
    node: Node, served: DraPluginServer
) -> None:
    # It was told of the last request's GPU only, while its /dev held both.
    node.claims.allocate(
        CLAIM, AllocatedDevice("gpu0", NODE, "gpu-0"), AllocatedDevice("gpu1", NODE, "gpu-1")
    )
    answer = (await prepare(node, CLAIM)).claims[CLAIM.uid]
    assert answer.error == ""
    spec = cdi_spec(node, CLAIM)
    env, nodes = container_view(answer, spec, None)
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["KUBEGPU_GPU_UUID"] == uuids(node, 0, 1)
    assert nodes == ["/dev/nvidia0", "/dev/nvidia1"]
    for request, index in (("gpu0", 0), ("gpu1", 1)):
        env, nodes = container_view(answer, spec, request)
        assert env["NVIDIA_VISIBLE_DEVICES"] == uuids(node, index)
        assert nodes == [f"/dev/nvidia{index}"]


async def test_the_answer_ends_with_a_device_no_container_naming_a_request_gets(
    node: Node,
) -> None:
    node.claims.allocate(
        CLAIM, AllocatedDevice("a", NODE, "gpu-1"), AllocatedDevice("b/first", NODE, "gpu-0")
    )
    async with DraPluginServer(node.preparer(), node.sockets):
        answer = (await prepare(node, CLAIM)).claims[CLAIM.uid]
    *per_request, whole = answer.devices
    assert [list(d.request_names) for d in per_request] == [["a"], ["b"]]
    assert list(whole.request_names) == [WHOLE_CLAIM_REQUEST]
    # It stands for the last device, whose health the kubelet shows for it.
    assert (whole.pool_name, whole.device_name) == (NODE, "gpu-0")
    assert list(whole.cdi_device_ids) == [f"{KIND}={CLAIM.uid}-claim"]
    assert not whole.HasField("share_id")
    (claim_device,) = [d for d in cdi_spec(node, CLAIM)["devices"] if d["name"].endswith("-claim")]
    assert set(claim_device["containerEdits"]) == {"env"}  # nodes come with the GPUs' devices
    # A restarted driver answers the same from its checkpoint.
    async with DraPluginServer(node.preparer(), node.sockets):
        again = (await prepare(node, CLAIM)).claims[CLAIM.uid]
    assert again == answer
    assert node.claims.lookups == 1


async def test_one_request_of_several_gpus_needs_no_claim_device(
    node: Node, served: DraPluginServer
) -> None:
    node.claims.allocate(
        CLAIM, AllocatedDevice("gpu", NODE, "gpu-0"), AllocatedDevice("gpu", NODE, "gpu-1")
    )
    answer = (await prepare(node, CLAIM)).claims[CLAIM.uid]
    assert [d.device_name for d in answer.devices] == ["gpu-0", "gpu-1"]
    assert len(cdi_spec(node, CLAIM)["devices"]) == 2
    env, _ = container_view(answer, cdi_spec(node, CLAIM), None)
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuids(node, 0, 1)


async def test_two_requests_sharing_one_card_need_no_claim_device(
    node: Node, served: DraPluginServer
) -> None:
    node.claims.allocate(
        CLAIM,
        AllocatedDevice("a", NODE, "gpu-1", share_id="s-a", memory_bytes=2**30, compute_milli=100),
        AllocatedDevice("b", NODE, "gpu-1", share_id="s-b", memory_bytes=2**30, compute_milli=50),
    )
    answer = (await prepare(node, CLAIM)).claims[CLAIM.uid]
    assert WHOLE_CLAIM_REQUEST not in {r for d in answer.devices for r in d.request_names}


async def test_under_mps_the_whole_claim_is_told_every_cards_memory_limit(node: Node) -> None:
    settings = replace(node.settings, shares=Dra.model_validate({"enforcement": "mps"}))
    node.claims.allocate(
        CLAIM,
        AllocatedDevice("a", NODE, "gpu-0", share_id="s-a", memory_bytes=2**30, compute_milli=100),
        AllocatedDevice("b", NODE, "gpu-1", share_id="s-b", memory_bytes=2**31, compute_milli=200),
    )
    preparer = replace(node, settings=settings).preparer()
    async with DraPluginServer(preparer, node.sockets):
        answer = (await prepare(node, CLAIM)).claims[CLAIM.uid]
    spec = cdi_spec(node, CLAIM)
    env, _ = container_view(answer, spec, None)
    gpus = node.inventory.gpus
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{gpus[0].uuid}=1024M,{gpus[1].uuid}=2048M"
    env, _ = container_view(answer, spec, "a")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{gpus[0].uuid}=1024M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "10"
