"""Replicated schedulers: with ``leader-lease`` set, only the extender next to the kube-scheduler
holding the Lease binds. Two extenders over real HTTP against one fake API server: the other one
refuses naming the holder, and on a handover the new leader's extender lists the pods before
deciding, so a decision the old one recorded just before cannot be handed out again even
while its own watch lags."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from kubegpu.config.extender import ExtenderConfig, ExtenderConfigError
from kubegpu.extender.leader import LeaderGate, holds
from kubegpu.kube.leases import LightkubeLeases
from kubegpu.kube.list_watch import Backoff
from kubegpu.roles.extender import ExtenderService
from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION
from kubegpu.testing.apiserver import FakeApiServer
from tests.extender.cluster import gpu_node, http_session, post, whole_pod

LEASE = "kube-system/kube-scheduler"


def lease(holder: str, renewed: datetime | None = None) -> dict[str, Any]:
    """kube-scheduler's Lease as it writes it, renewed at ``renewed`` (default: now)."""
    renew_time = (renewed or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "kube-scheduler", "namespace": "kube-system"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renew_time},
    }


@contextlib.asynccontextmanager
async def extender(
    server: FakeApiServer, identity: str, backoff: Backoff | None = None
) -> AsyncIterator[ExtenderService]:
    config = ExtenderConfig(port=0, leader_lease=LEASE, leader_identity=identity)
    client = server.async_client()
    service = ExtenderService(config, client=client, backoff=backoff or Backoff(0.01, 0.05))
    assert service.app.leader is not None
    service.app.leader.max_age_s = 0.0  # read the Lease on every bind: handovers take effect now
    try:
        async with service:
            await service.wait_synced()
            yield service
    finally:
        await client.close()


async def bind(
    http: aiohttp.ClientSession, ext: ExtenderService, server: FakeApiServer, name: str
) -> str:
    pod = server.store.get("pods", "default", name)
    assert pod is not None
    body = {
        "PodName": name,
        "PodNamespace": "default",
        "PodUID": pod["metadata"]["uid"],
        "Node": "node-a",
    }
    status, answer = await post(http, f"{ext.url}/bind", body)
    assert status == 200
    error: str = answer["Error"]
    return error


def decided(server: FakeApiServer, name: str) -> bool:
    pod = server.store.get("pods", "default", name)
    assert pod is not None
    return ALLOCATION_ANNOTATION in (pod["metadata"].get("annotations") or {})


async def test_only_the_leaders_extender_binds_and_a_new_leader_catches_up_first() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=1))
        for name in ("a", "b", "c"):
            server.store.put("pods", whole_pod(name, 1))
        server.store.put("leases", lease("cp-1_0b7e4c1a"))
        # cp-2's watches, once dropped, stay down for a minute: its view lags.
        async with (
            extender(server, "cp-1") as cp1,
            extender(server, "cp-2", backoff=Backoff(60.0, 60.0)) as cp2,
            http_session() as http,
        ):
            assert await bind(http, cp2, server, "a") == (
                "kubegpu extender 'cp-2' is not next to the leading kube-scheduler "
                "(lease kube-system/kube-scheduler is held by 'cp-1_0b7e4c1a'); refusing to bind"
            )
            assert not decided(server, "a")

            await server.wait_for_watches(4)
            server.drop_watches(abrupt=True)  # cp-1 is back at once, cp-2 in a minute
            assert await bind(http, cp1, server, "a") == ""
            assert decided(server, "a")
            assert (
                cp2.view.usage(server.store.get("pods", "default", "a")["metadata"]["uid"]) is None
            )  # type: ignore[index]

            # Handover: cp-1's kube-scheduler is gone, cp-2's takes the Lease.
            server.store.put("leases", lease("cp-2_5d1f9a02"))
            assert await bind(http, cp2, server, "b") == "node-a: needs 1 whole GPUs, 0 free"
            assert not decided(server, "b")  # a's card is not handed out again
            assert await bind(http, cp1, server, "c") == (
                "kubegpu extender 'cp-1' is not next to the leading kube-scheduler "
                "(lease kube-system/kube-scheduler is held by 'cp-2_5d1f9a02'); refusing to bind"
            )
            async with http.get(f"{cp1.url}/metrics") as response:
                metrics = await response.text()
    assert 'kubegpu_extender_binds_total{result="not-leader"} 1.0' in metrics
    assert not decided(server, "c")


async def test_without_the_lease_nothing_is_bound() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=1))
        server.store.put("pods", whole_pod("a", 1))
        async with extender(server, "cp-1") as cp1, http_session() as http:
            error = await bind(http, cp1, server, "a")
    assert error == (
        "cannot read lease kube-system/kube-scheduler: "
        'leases.coordination.k8s.io "kube-scheduler" not found'
    )
    assert not decided(server, "a")


@pytest.mark.parametrize(
    ("holder", "identity", "held"),
    [
        ("cp-1_0b7e4c1a", "cp-1", True),
        ("cp-1", "cp-1", True),
        ("cp-10_0b7e4c1a", "cp-1", False),  # another host whose name starts the same
        ("", "cp-1", False),
        ("cp-2_cp-1", "cp-1", False),
    ],
)
def test_the_holder_names_this_host_only_as_itself_or_itself_and_an_underscore(
    holder: str, identity: str, held: bool
) -> None:
    assert holds(holder, identity) is held


@pytest.mark.parametrize("value", ["kube-scheduler", "/kube-scheduler", "kube-system/", "a/b/c"])
def test_a_lease_that_is_not_namespace_slash_name_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ExtenderConfigError, match=f"leader-lease '{value}' must be namespace/name"):
        ExtenderConfig(leader_lease=value).validate()


async def test_a_lease_its_holder_stopped_renewing_is_not_leadership() -> None:
    renewed = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)
    now = [renewed + timedelta(seconds=5)]
    caught_up = []

    async def catch_up() -> None:
        caught_up.append(now[0])

    async with FakeApiServer() as server:
        server.store.put("leases", lease("cp-1_0b7e4c1a", renewed))
        client = server.async_client()
        gate = LeaderGate(
            LightkubeLeases(client),
            LEASE,
            "cp-1",
            catch_up=catch_up,
            max_age_s=0.0,
            wall_clock=lambda: now[0],
        )
        try:
            assert await gate.refusal() == ""  # renewed 5 s ago, for 15 s
            now[0] = renewed + timedelta(seconds=16)  # its kube-scheduler stopped renewing
            refusal = await gate.refusal()
            assert "expired" in refusal and "cp-1_0b7e4c1a" in refusal
            assert "2026-11-25T12:00:15" in refusal  # when it ran out
            # Renewed again (the same scheduler back, or a restart): leading, caught up afresh.
            server.store.put("leases", lease("cp-1_0b7e4c1a", renewed + timedelta(seconds=14)))
            assert await gate.refusal() == ""
            assert len(caught_up) == 2
            # A Lease without renewTime was never renewed: nobody leads by it.
            no_renew = lease("cp-1_0b7e4c1a")
            del no_renew["spec"]["renewTime"]
            server.store.put("leases", no_renew)
            assert "renewTime" in await gate.refusal()
        finally:
            await client.close()
