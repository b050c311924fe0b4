"""Resource plans, Allocate responses, backoff (fake time) and the health board, in-process."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubegpu.config import load_config
from kubegpu.config.health import health_policy
from kubegpu.config.model import AgentConfig
from kubegpu.core.gpu import NodeInventory
from kubegpu.core.health import HealthEvent, HealthEventKind
from kubegpu.core.health_feed import HealthFeed
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.kubelet.board import DeviceBoard
from kubegpu.kubelet.plans import build_plans
from kubegpu.kubelet.resources import AllocationError, PlanError
from kubegpu.kubelet.retry import RetryBackoff, retry_with_backoff

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

T4: NodeInventory = resolve_fake_spec("4xT4").inventory
MIXED: NodeInventory = resolve_fake_spec("2xV100-2xT4").inventory


def config(**overrides: Any) -> AgentConfig:
    return load_config(None, overrides)


# --- plans ------------------------------------------------------------------------------------


def test_default_plan_advertises_every_gpu_by_uuid() -> None:
    (plan,) = build_plans(config(), T4)
    assert plan.resource_name == "nvidia.com/gpu"
    assert [d.device_id for d in plan.devices] == [g.uuid for g in T4.gpus]
    assert not plan.shared


def test_per_model_resource_names_split_a_mixed_node() -> None:
    plans = build_plans(
        config(
            **{
                "resources.gpus": [
                    {"pattern": "*V100*", "name": "v100"},
                    {"pattern": "*", "name": "nvidia.com/gpu"},
                ]
            }
        ),
        MIXED,
    )
    by_name = {p.resource_name: p for p in plans}
    assert set(by_name) == {"nvidia.com/v100", "nvidia.com/gpu"}
    assert all("V100" in g.product_name for g in by_name["nvidia.com/v100"].gpus)
    assert all("V100" not in g.product_name for g in by_name["nvidia.com/gpu"].gpus)
    assert by_name["nvidia.com/v100"].socket_name != by_name["nvidia.com/gpu"].socket_name


def test_explicit_rename_and_device_subset_leave_the_rest_whole() -> None:
    plans = build_plans(
        config(
            **{
                "sharing.timeSlicing.resources": [
                    {
                        "name": "nvidia.com/gpu",
                        "replicas": 2,
                        "rename": "example.com/slice",
                        "devices": 1,
                    }
                ]
            }
        ),
        T4,
    )
    whole, shared = plans
    assert whole.resource_name == "nvidia.com/gpu"
    assert [g.index for g in whole.gpus] == [1, 2, 3]
    assert shared.resource_name == "example.com/slice"
    assert [d.device_id for d in shared.devices] == [f"{T4.gpus[0].uuid}::{k}" for k in (0, 1)]


def test_devices_naming_a_missing_gpu_is_a_plan_error() -> None:
    cfg = config(
        **{
            "sharing.timeSlicing.renameByDefault": True,
            "sharing.timeSlicing.resources": [
                {"name": "nvidia.com/gpu", "replicas": 2, "devices": [9]}
            ],
        }
    )
    with pytest.raises(PlanError, match="9"):
        build_plans(cfg, T4)


def test_unhealthy_gpu_marks_every_replica_id_unhealthy() -> None:
    cfg = config(**{"sharing.timeSlicing.resources": [{"name": "nvidia.com/gpu", "replicas": 3}]})
    (plan,) = build_plans(cfg, T4)
    bad = T4.gpus[2].uuid
    states = plan.states({bad})
    assert {s.device_id for s in states if not s.healthy} == {f"{bad}::{k}" for k in range(3)}
    assert len([s for s in states if s.healthy]) == 9


# --- Allocate responses -----------------------------------------------------------------------


def test_allocate_resolves_replicas_to_their_gpu_once_in_index_order() -> None:
    cfg = config(**{"sharing.timeSlicing.resources": [{"name": "nvidia.com/gpu", "replicas": 2}]})
    (plan,) = build_plans(cfg, T4)
    u0, u3 = T4.gpus[0].uuid, T4.gpus[3].uuid
    alloc = plan.allocate(cfg, [f"{u3}::1", f"{u0}::0", f"{u3}::0"])
    assert alloc.envs == {"NVIDIA_VISIBLE_DEVICES": f"{u0},{u3}"}


def test_index_strategy_and_device_specs_under_a_dev_root() -> None:
    cfg = config(
        **{
            "flags.plugin.deviceIDStrategy": "index",
            "flags.plugin.passDeviceSpecs": True,
            "flags.plugin.devRoot": "/run/nvidia/driver",
        }
    )
    (plan,) = build_plans(cfg, T4)
    alloc = plan.allocate(cfg, [T4.gpus[1].uuid])
    assert alloc.envs == {"NVIDIA_VISIBLE_DEVICES": "1"}
    nodes = {d.container_path: d.host_path for d in alloc.device_nodes}
    gpu_node = T4.gpus[1].device_node
    assert nodes[gpu_node] == f"/run/nvidia/driver{gpu_node}"
    assert nodes["/dev/nvidiactl"] == "/run/nvidia/driver/dev/nvidiactl"


def test_volume_mounts_strategy_mounts_dev_null_per_device() -> None:
    cfg = config(**{"flags.plugin.deviceListStrategy": "volume-mounts"})
    (plan,) = build_plans(cfg, T4)
    uuid = T4.gpus[0].uuid
    alloc = plan.allocate(cfg, [uuid])
    assert alloc.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert [(m.container_path, m.host_path) for m in alloc.mounts] == [
        (f"/var/run/nvidia-container-devices/{uuid}", "/dev/null")
    ]


def test_unknown_id_is_refused_with_its_name() -> None:
    cfg = config()
    (plan,) = build_plans(cfg, T4)
    with pytest.raises(AllocationError, match="GPU-nope"):
        plan.allocate(cfg, [T4.gpus[0].uuid, "GPU-nope"])


def test_fail_requests_greater_than_one_allows_exactly_one() -> None:
    cfg = config(
        **{
            "sharing.timeSlicing.failRequestsGreaterThanOne": True,
            "sharing.timeSlicing.resources": [{"name": "nvidia.com/gpu", "replicas": 2}],
        }
    )
    (plan,) = build_plans(cfg, T4)
    ids = [d.device_id for d in plan.devices]
    plan.allocate(cfg, ids[:1])
    with pytest.raises(AllocationError, match="maximum request size for shared resources is 1"):
        plan.allocate(cfg, ids[:2])


# --- backoff with fake time -------------------------------------------------------------------


async def test_registration_retries_back_off_exponentially_up_to_the_cap() -> None:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    failures = 7
    calls = 0

    async def register() -> str:
        nonlocal calls
        calls += 1
        if calls <= failures:
            raise OSError("kubelet.sock: connection refused")
        return "registered"

    backoff = RetryBackoff(initial_s=0.5, factor=2.0, max_s=4.0)
    result = await retry_with_backoff(register, backoff, describe="register", sleep=fake_sleep)
    assert result == "registered"
    assert slept == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]


async def test_retry_does_not_swallow_errors_it_was_not_told_to_retry() -> None:
    async def broken() -> None:
        raise KeyError("bug")

    async def no_sleep(seconds: float) -> None:
        raise AssertionError("must not sleep")

    with pytest.raises(KeyError):
        await retry_with_backoff(
            broken, RetryBackoff(), describe="x", sleep=no_sleep, retry_on=(OSError,)
        )


@pytest.mark.parametrize(
    ("attempt", "delay"), [(0, 0.1), (1, 0.2), (3, 0.8), (10, 5.0), (10_000, 5.0)]
)
def test_default_backoff_is_bounded(attempt: int, delay: float) -> None:
    assert RetryBackoff().delay(attempt) == pytest.approx(delay)


# --- health board and policy ------------------------------------------------------------------


async def test_health_board_wakes_waiters_only_on_a_real_change() -> None:
    uuid = T4.gpus[0].uuid
    health = HealthFeed([uuid])
    board = DeviceBoard(health)
    waiter = asyncio.create_task(board.wait_for_change(board.version))
    await asyncio.sleep(0)
    assert not health.set_healthy(uuid, True, "already healthy")
    await asyncio.sleep(0)
    assert not waiter.done()
    assert health.set_healthy(uuid, False, "Xid 79")
    assert await asyncio.wait_for(waiter, 5) == 1
    assert board.unhealthy == {uuid: "Xid 79"}


def test_config_health_knobs_combine_with_nvidia_env() -> None:
    cfg = config(**{"health.ignoredXids": [48], "health.criticalXids": [13]})
    policy = health_policy(cfg.health, {"DP_DISABLE_HEALTHCHECKS": "109"})
    assert not policy.is_xid_critical(48)
    assert not policy.is_xid_critical(109)
    assert policy.is_xid_critical(13)
    assert policy.is_xid_critical(79)


@pytest.mark.parametrize(
    ("xid_policy", "passes", "critical", "waits_for_reboot"),
    [
        pytest.param("catalog", {94, 13}, {109, 79}, True, id="catalog"),
        pytest.param("nvidia-device-plugin", {109, 13}, {94, 79}, False, id="device plugin"),
    ],
)
def test_config_xid_policy_picks_the_rule_the_lists_apply_on(
    xid_policy: str, passes: set[int], critical: set[int], waits_for_reboot: bool
) -> None:
    cfg = config(**{"health.xidPolicy": xid_policy, "health.criticalXids": [43]})
    policy = health_policy(cfg.health, {"DP_DISABLE_HEALTHCHECKS": "48"})
    assert all(not policy.is_xid_critical(code) for code in passes)
    assert all(policy.is_xid_critical(code) for code in critical | {43})
    assert not policy.is_xid_critical(48)
    assert policy.needs_node_reboot(HealthEvent(HealthEventKind.XID, None, xid=79)) is (
        waits_for_reboot
    )
