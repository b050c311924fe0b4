"""The node agent's side of the compat modes, in-process over real HTTP to the fake API server:
a peer-style container's ``Allocate`` answer carries the peer's environment beside ours, and the
peer's node figures land in the Node's capacity and allocatable (and come back when dropped)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from kubegpu.config.model import AgentConfig
from kubegpu.core.health_feed import HealthFeed
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.kube.agent_api import LightkubeNodeApi
from kubegpu.kubelet.board import DeviceBoard
from kubegpu.kubelet.coordinator import SharingCoordinator
from kubegpu.kubelet.peer_compat import publish_peer_capacity
from kubegpu.kubelet.plans import build_plans
from kubegpu.kubelet.resources import slot_id
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    AllocationDecision,
    CardShare,
    ContainerAllocation,
    encode_allocation,
)
from kubegpu.testing.apiserver import FakeApiServer, make_node

NODE = "n1"
INVENTORY = resolve_fake_spec("4xT4").inventory
GPUS = sorted(INVENTORY.gpus, key=lambda g: g.index)
CARD_MIB = GPUS[0].memory_total_mib


def config(*modes: str, unit: str = "GiB") -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "sharing": {
                "gpuShare": {
                    "enabled": True,
                    "slotsPerCard": 4,
                    "compat": {"modes": list(modes), "aliyunMemoryUnit": unit},
                }
            }
        }
    )


def peer_pod(name: str, card: int, containers: dict[str, dict[str, str]]) -> dict[str, object]:
    """A peer-style pod as the webhook leaves it, with the decision the extender records."""
    shares = {
        c: CardShare(str(GPUS[card].uuid), card, 1, mib) for c, (_, mib) in _mib(containers).items()
    }
    total = CardShare(
        str(GPUS[card].uuid),
        card,
        sum(s.compute_milli for s in shares.values()),
        sum(s.gpu_memory_mib for s in shares.values()),
    )
    decision = AllocationDecision(
        NODE,
        (total,),
        tuple(ContainerAllocation(c, False, (s,)) for c, s in shares.items()),
        "2026-01-01T00:00:00Z",
        "test",
        True,
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {ALLOCATION_ANNOTATION: encode_allocation(decision)},
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": c,
                    "image": "x",
                    "resources": {"limits": {**limits, "kubegpu.io/gpu-shared": "1"}},
                }
                for c, limits in containers.items()
            ],
        },
    }


def _mib(containers: dict[str, dict[str, str]]) -> dict[str, tuple[str, int]]:
    out = {}
    for c, limits in containers.items():
        if "volcano.sh/gpu-memory" in limits:
            out[c] = ("volcano", int(limits["volcano.sh/gpu-memory"]))
        else:
            out[c] = ("aliyun", int(limits["aliyun.com/gpu-mem"]) * 1024)
    return out


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as api:
        api.store.put("nodes", make_node(NODE))
        yield api


@pytest.fixture
async def coordinator_for(
    server: FakeApiServer,
) -> AsyncIterator[Callable[[AgentConfig], SharingCoordinator]]:
    clients = []

    def make(cfg: AgentConfig) -> SharingCoordinator:
        client = server.async_client()
        clients.append(client)
        coordinator = SharingCoordinator(
            NODE, cfg, LightkubeNodeApi(client, NODE), DeviceBoard(HealthFeed())
        )
        coordinator.set_plans(build_plans(cfg, INVENTORY))
        return coordinator

    yield make
    for client in clients:
        await client.close()


Make = Callable[[AgentConfig], SharingCoordinator]


async def test_a_volcano_container_is_told_volcanos_variables_beside_ours(
    server: FakeApiServer, coordinator_for: Make
) -> None:
    coordinator = coordinator_for(config("volcano"))
    server.store.put(
        "pods", peer_pod("gpu-pod1", 1, {"cuda-container-1": {"volcano.sh/gpu-memory": "1024"}})
    )
    plan = next(p for p in coordinator.plans if p.share_slots)
    answer = await coordinator.allocate(plan, [slot_id(GPUS[1].uuid, 0)])
    assert answer.envs["VOLCANO_GPU_ALLOCATED"] == "1024"
    assert answer.envs["VOLCANO_GPU_TOTAL"] == str(CARD_MIB)
    assert answer.envs["VOLCANO_GPU_MEMORY_TOTAL"] == str(CARD_MIB)
    assert answer.envs["KUBEGPU_GPU_MEMORY_LIMIT_MIB"] == "1024"
    assert answer.envs["KUBEGPU_GPU_UUID"] == str(GPUS[1].uuid)
    assert "ALIYUN_COM_GPU_MEM_IDX" not in answer.envs


async def test_aliyun_containers_are_told_card_pod_and_container_in_gib(
    server: FakeApiServer, coordinator_for: Make
) -> None:
    coordinator = coordinator_for(config("volcano", "aliyun"))
    server.store.put(
        "pods",
        peer_pod(
            "binpack-1",
            2,
            {"a": {"aliyun.com/gpu-mem": "2"}, "b": {"aliyun.com/gpu-mem": "3"}},
        ),
    )
    plan = next(p for p in coordinator.plans if p.share_slots)
    first = await coordinator.allocate(plan, [slot_id(GPUS[2].uuid, 0)])
    second = await coordinator.allocate(plan, [slot_id(GPUS[2].uuid, 1)])
    for answer, mine in ((first, "2"), (second, "3")):
        assert answer.envs["ALIYUN_COM_GPU_MEM_IDX"] == "2"
        assert answer.envs["ALIYUN_COM_GPU_MEM_POD"] == "5"
        assert answer.envs["ALIYUN_COM_GPU_MEM_CONTAINER"] == mine
        assert answer.envs["ALIYUN_COM_GPU_MEM_DEV"] == str(CARD_MIB // 1024)
        assert "VOLCANO_GPU_TOTAL" not in answer.envs


async def test_a_kubegpu_style_share_gets_no_peer_variables(
    server: FakeApiServer, coordinator_for: Make
) -> None:
    coordinator = coordinator_for(config("volcano", "aliyun"))
    pod = peer_pod("ours", 0, {"main": {"volcano.sh/gpu-memory": "100"}})
    limits = pod["spec"]["containers"][0]["resources"]["limits"]  # type: ignore[index]
    del limits["volcano.sh/gpu-memory"]
    limits.update({"kubegpu.io/gpu-memory": "100", "kubegpu.io/gpu-compute": "1"})
    server.store.put("pods", pod)
    plan = next(p for p in coordinator.plans if p.share_slots)
    answer = await coordinator.allocate(plan, [slot_id(GPUS[0].uuid, 0)])
    assert not [k for k in answer.envs if k.startswith(("VOLCANO_", "ALIYUN_"))]


async def test_the_peer_figures_are_written_into_capacity_and_allocatable_and_reasserted(
    server: FakeApiServer,
) -> None:
    api = LightkubeNodeApi(server.async_client(), NODE)
    cards = [g.memory_total_mib for g in GPUS]
    cfg = config("volcano", "aliyun")
    assert await publish_peer_capacity(api, cfg, cards)
    status = server.store.get("nodes", "", NODE)["status"]  # type: ignore[index]
    expected = {
        "volcano.sh/gpu-memory": str(sum(cards)),
        "volcano.sh/gpu-number": "0",
        "aliyun.com/gpu-mem": str(sum(c // 1024 for c in cards)),
        "aliyun.com/gpu-count": "0",
    }
    for part in ("capacity", "allocatable"):
        assert {k: status[part][k] for k in expected} == expected
    assert status["capacity"]["cpu"]  # the rest of the status is kept
    # Already current: nothing written.
    patches = server.count("patch", "nodes")
    assert not await publish_peer_capacity(api, cfg, cards)
    assert server.count("patch", "nodes") == patches
    # The kubelet dropped them (node re-registered): the next round puts them back.
    node = server.store.get("nodes", "", NODE)
    assert node is not None
    for part in ("capacity", "allocatable"):
        for key in expected:
            del node["status"][part][key]
    server.store.put("nodes", node)
    assert await publish_peer_capacity(api, cfg, cards)
    await api.close()


async def test_without_compat_modes_nothing_is_written(server: FakeApiServer) -> None:
    api = LightkubeNodeApi(server.async_client(), NODE)
    assert not await publish_peer_capacity(api, config(), [15360])
    assert server.count("patch", "nodes") == 0
    await api.close()


def test_compat_modes_need_gpu_share_enabled() -> None:
    with pytest.raises(ValueError, match=r"sharing\.gpuShare\.compat\.modes"):
        AgentConfig.model_validate({"sharing": {"gpuShare": {"compat": {"modes": ["volcano"]}}}})
    with pytest.raises(ValueError, match="modes"):
        config("hami")
