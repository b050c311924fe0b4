"""The extender process killed (SIGKILL) with binds in flight, some with their Binding (which
carries the decision: one write) held on the wire: a new extender rebuilds from the API server
exactly the card accounting the pods' annotations say (a pod whose Binding never completed holds
nothing, since the decision and the node land together or not at all), and scheduling
everything left afterwards over-commits no card."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import sys
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kubegpu.kube.view import node_info
from kubegpu.placement.model import NodeState
from kubegpu.sharing.accounting import snapshot_from
from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION, decode_allocation
from kubegpu.sharing.podstate import read_pod
from kubegpu.sharing.resources import ResourceNames
from kubegpu.testing.apiserver import FakeApiServer, Store
from kubegpu.testing.waiting import wait_until_async
from tests.extender.cluster import gpu_node, running_extender, shared_pod
from tests.extender.test_concurrency import NODES, audit, bind_all, caught_up, make_pods

pytestmark = pytest.mark.slow

# Binding (with the decision) held at the server: reserved in the dead process's memory only.
HELD_BINDINGS = [f"hb-{i}" for i in range(12)]
WAVE = 300  # binds racing the kill


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def until(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    # Requests held at the fake API server and its counters: looked at, not announced.
    await wait_until_async(check, timeout_s=timeout_s, what=what, poll_s=0.005)


def holder(arrived: set[str], ended: set[str], name: str) -> Callable[[Store], Awaitable[None]]:
    """A hook that keeps the request open until its client goes (the fake API server cancels
    a handler whose connection closed): the API server never completes it."""

    async def hold(store: Store) -> None:
        arrived.add(name)
        try:
            await asyncio.Event().wait()
        finally:
            ended.add(name)

    return hold


async def bind(http: aiohttp.ClientSession, url: str, pod: dict[str, Any], node: str) -> str:
    body = {
        "PodName": pod["metadata"]["name"],
        "PodNamespace": "default",
        "PodUID": pod["metadata"]["uid"],
        "Node": node,
    }
    async with http.post(f"{url}/bind", json=body) as response:
        error: str = (await response.json())["Error"]
        return error


def free(state: NodeState) -> tuple[int, int, tuple[tuple[int, int, int | None], ...]]:
    return (
        state.cpu_free_milli,
        state.memory_free_mib,
        tuple((g.index, g.free_milli, g.free_memory_mib) for g in state.gpus),
    )


def decision(pod: dict[str, Any]) -> Any:
    raw = (pod["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION)
    return None if raw is None else decode_allocation(raw)


async def test_a_killed_extender_with_binds_in_flight_is_rebuilt_exactly_and_never_overcommits(
    tmp_path: Path,
) -> None:
    rng = random.Random(11)
    arrived: set[str] = set()
    ended: set[str] = set()
    async with FakeApiServer() as server:
        for name in NODES:
            server.store.put(
                "nodes", gpu_node(name, cards=8, memory_mib=81920, cpu="256", memory="2Ti")
            )
        held = {
            name: server.store.put("pods", shared_pod(name, 10240, 250, cpu="500m"))
            for name in HELD_BINDINGS
        }
        wave = [server.store.put("pods", p) for p in make_pods(rng)[:WAVE]]
        for name in HELD_BINDINGS:
            server.before("create", "pods/binding", holder(arrived, ended, name), name=name)

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = (tmp_path / "extender.log").open("w")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kubegpu",
            "extender",
            "--kubeconfig",
            str(server.write_kubeconfig(tmp_path / "kubeconfig")),
            "--port",
            str(port),
            "--leader-lease",
            "none",
            env={**os.environ, "NO_PROXY": "*"},
            stdout=log,
            stderr=log,
        )
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

                async def ready() -> bool:
                    with contextlib.suppress(aiohttp.ClientError):
                        async with http.get(f"{url}/readyz") as response:
                            if response.status == 200:
                                return True
                    assert process.returncode is None, (tmp_path / "extender.log").read_text()
                    return False

                await wait_until_async(
                    ready, timeout_s=60, what="the extender process ready", poll_s=0.1
                )
                # The held pods first (each on its own node), until every one is stuck at the
                # server; then a wave of binds, and the kill while it is under way.
                first = [
                    asyncio.create_task(bind(http, url, pod, NODES[i % len(NODES)]))
                    for i, pod in enumerate(held.values())
                ]
                await until(lambda: len(arrived) == len(held), "every held request arrived")
                bindings = server.count("create", "pods/binding")
                rest = [
                    asyncio.create_task(bind(http, url, pod, rng.choice(NODES))) for pod in wave
                ]
                await until(
                    lambda: server.count("create", "pods/binding") >= bindings + 40,
                    "the wave is binding",
                )
                process.send_signal(signal.SIGKILL)
                assert await process.wait() == -signal.SIGKILL
                answers = await asyncio.gather(*first, *rest, return_exceptions=True)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            log.close()
        # The held requests died with their connections: the server completed none of them.
        await until(lambda: ended == arrived, "held requests ended")
        assert all(isinstance(a, BaseException) for a in answers[: len(held)])
        in_flight = sum(isinstance(a, BaseException) for a in answers)
        assert in_flight > len(held)  # wave binds were cut short too

        stored = {p["metadata"]["name"]: p for p in server.store.list("pods")}
        for name in HELD_BINDINGS:  # decided in the dead process's memory only
            assert decision(stored[name]) is None
            assert stored[name]["spec"].get("nodeName") is None
        held_at_kill, problems = audit(server)
        assert problems == []

        names = ResourceNames()
        readings = [read_pod(p, names) for p in stored.values()]
        expected = snapshot_from(
            [node_info(n) for n in server.store.list("nodes")],
            [r.usage for r in readings if r.usage is not None],
        )
        async with running_extender(server) as second:
            await caught_up(second, server)
            # Exactly the accounting the API server's pods give, pending decisions included.
            assert second.view.snapshot() == expected
            for name in HELD_BINDINGS:  # nothing of theirs reached the API server
                assert second.view.usage(stored[name]["metadata"]["uid"]) is None
            # And the placement engine's rows say what that accounting leaves free.
            assert {n: free(second.scheduler.engine().node_state(n)) for n in NODES} == {
                state.name: free(state) for state in expected.node_states()
            }
            view_held: dict[str, int] = defaultdict(int)
            for usage in second.view.pods().values():
                for card in usage.cards:
                    view_held[card.uuid] += card.compute_milli
            assert dict(view_held) == held_at_kill

            # Everything not bound yet goes through the new extender, all at once.
            unbound = [p for p in server.store.list("pods") if not p["spec"].get("nodeName")]
            errors, _ = await bind_all(second, server, unbound, rng)
            await caught_up(second, server)
        _, problems = audit(server)

    assert problems == []
    final = {p["metadata"]["name"]: p for p in server.store.list("pods")}
    for name, error in errors.items():
        if error:
            assert not final[name]["spec"].get("nodeName"), name
            assert error.startswith("node-"), error  # "<node>: <why>"
        else:
            assert final[name]["spec"]["nodeName"], name
