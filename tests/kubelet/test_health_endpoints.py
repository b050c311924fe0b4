"""The node agent's /healthz and /readyz in-process, over real HTTP on 127.0.0.1 and real gRPC
over unix sockets: what each endpoint checks, and the failures only an in-process test can
cause (a stuck event loop, a gRPC server that stops answering on a socket still in place)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu.config import load_config
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.kubelet.agent import Agent, AgentSettings, Event
from kubegpu.kubelet.probes import IdleTarget, ping_all
from kubegpu.kubelet.retry import RetryBackoff
from kubegpu.probes import ProbeServerError, start_probe_server
from kubegpu.roles.node_agent import build_agent
from kubegpu.testing.kubelet import KubeletEmulator
from kubegpu.testing.waiting import wait_until as poll_until
from tests.kubelet.conftest import RESOURCE, short_tempdir, wait_until

# Async tests must not leave tasks behind (an orphaned probe check or retry loop).
in_process = pytest.mark.usefixtures("no_leftover_tasks")


def get(url: str) -> tuple[int, str]:
    """(status, body) of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read().decode()
    except OSError as err:
        return 0, str(err)


def wait_for(url: str, status: int, timeout_s: float = 20.0) -> tuple[int, str]:
    """Poll ``url`` until it answers ``status``; the last answer either way (for the
    assertion that follows to show)."""
    last = [get(url)]

    def answered() -> bool:
        if last[0][0] != status:
            last[0] = get(url)
        return last[0][0] == status

    with contextlib.suppress(TimeoutError):
        poll_until(answered, timeout_s=timeout_s, what=f"{url} answering {status}")
    return last[0]


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_agent(kubelet_dir: Path, config_path: Path | None = None, **settings: object) -> Agent:
    # Without a file, the address comes as a flag would (an override kept across reloads).
    overrides = {"flags.healthListen": "127.0.0.1:0"} if config_path is None else {}
    config = load_config(config_path, overrides)
    agent_settings = AgentSettings(
        kubelet_dir,
        "unit",
        config_path=config_path,
        overrides=overrides,
        **settings,  # type: ignore[arg-type]
    )
    return build_agent(agent_settings, config, FakeGpuBackend.from_spec("4xT4"))


async def stop(agent: Agent, run: asyncio.Task[int]) -> None:
    agent.events.put_nowait(Event.STOP)
    assert await asyncio.wait_for(run, 30) == 0
    agent.backend.close()


async def probe_url(agent: Agent) -> str:
    await wait_until(lambda: agent.probes is not None)
    assert agent.probes is not None
    return agent.probes.url


@in_process
async def test_readyz_is_503_while_registering_with_a_dead_kubelet_socket_fails(root: Path) -> None:
    kubelet_dir = root / "dp"
    kubelet_dir.mkdir()
    # A socket file nobody accepts on: Register fails and is retried.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(kubelet_dir / "kubelet.sock"))
    dead.close()
    agent = make_agent(kubelet_dir, poll_interval_s=0.05, backoff=RetryBackoff(0.05, 2.0, 0.2))
    run = asyncio.create_task(agent.run())
    kubelet = KubeletEmulator(kubelet_dir)
    try:
        url = await probe_url(agent)
        status, body = await asyncio.to_thread(wait_for, url + "/healthz", 200)
        assert (status, body) == (200, f"ok: serving {RESOURCE}\n")
        status, body = await asyncio.to_thread(get, url + "/readyz")
        assert (status, body) == (503, f"not registered with the kubelet: {RESOURCE}\n")
        assert agent.registered_count == 0
        await asyncio.to_thread(kubelet.start)
        await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20)
        status, body = await asyncio.to_thread(wait_for, url + "/readyz", 200)
        assert (status, body) == (200, f"ok: registered {RESOURCE}\n")
    finally:
        await stop(agent, run)
        await asyncio.to_thread(kubelet.stop)


@in_process
async def test_healthz_is_503_naming_the_resource_whose_grpc_server_stops_answering(
    root: Path,
) -> None:
    kubelet_dir = root / "dp"
    # No directory watch: nothing may repair the server behind the probe's back.
    agent = make_agent(kubelet_dir, poll_interval_s=3600)
    with KubeletEmulator(kubelet_dir) as kubelet:
        run = asyncio.create_task(agent.run())
        try:
            url = await probe_url(agent)
            await asyncio.to_thread(kubelet.wait_for_registration, RESOURCE, 20)
            assert (await asyncio.to_thread(wait_for, url + "/healthz", 200))[0] == 200
            (server,) = agent.servers
            await server.stop(remove_socket=False)
            status, body = await asyncio.to_thread(get, url + "/healthz")
            assert status == 503
            assert body.startswith(f"gRPC server not answering: {RESOURCE} on {server.socket_path}")
            assert body.count("\n") == 1
        finally:
            await stop(agent, run)


@in_process
async def test_ping_reports_a_socket_nobody_serves_and_is_quiet_for_one_that_answers(
    root: Path,
) -> None:
    kubelet_dir = root / "dp"
    agent = make_agent(kubelet_dir, poll_interval_s=3600)
    run = asyncio.create_task(agent.run())
    try:
        await wait_until(lambda: len(agent.servers) == 1)
        (server,) = agent.servers
        assert await ping_all([(RESOURCE, server.socket_path)]) == ""
        missing = root / "missing.sock"
        failures = await ping_all([(RESOURCE, server.socket_path), ("x.io/y", missing)])
        assert failures.startswith(f"x.io/y on {missing}: UNAVAILABLE")
        assert RESOURCE not in failures
    finally:
        await stop(agent, run)


@in_process
async def test_a_reload_that_changes_the_address_moves_the_endpoints(root: Path) -> None:
    kubelet_dir = root / "dp"
    config = root / "config.yaml"
    config.write_text("version: v1\nflags:\n  healthListen: 127.0.0.1:0\n")
    agent = make_agent(kubelet_dir, config, poll_interval_s=3600)
    run = asyncio.create_task(agent.run())
    try:
        old = await probe_url(agent)
        assert (await asyncio.to_thread(wait_for, old + "/healthz", 200))[0] == 200
        config.write_text("version: v1\nflags:\n  healthListen: localhost:0\n")
        agent.events.put_nowait(Event.RELOAD)
        await wait_until(lambda: agent.probes is not None and agent.probes.url != old)
        new = await probe_url(agent)
        assert (await asyncio.to_thread(wait_for, new + "/healthz", 200))[0] == 200
        assert (await asyncio.to_thread(get, old + "/healthz"))[0] == 0  # nothing there now
        config.write_text("version: v1\n")  # off
        agent.events.put_nowait(Event.RELOAD)
        await wait_until(lambda: agent.probes is None)
        assert (await asyncio.to_thread(get, new + "/healthz"))[0] == 0
    finally:
        await stop(agent, run)


@pytest.fixture
def loop_in_thread() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_healthz_is_503_while_the_event_loop_is_stuck_and_200_once_it_turns_again(
    loop_in_thread: asyncio.AbstractEventLoop,
) -> None:
    server = start_probe_server(
        ("127.0.0.1", 0), IdleTarget("test"), loop_in_thread, loop_timeout_s=0.2
    )
    release = threading.Event()
    try:
        assert get(server.url + "/healthz") == (200, "ok: idle (test)\n")
        # A callback that blocks the loop, as a synchronous call in a handler would.
        loop_in_thread.call_soon_threadsafe(release.wait, 30)
        status, body = get(server.url + "/healthz")
        assert (status, body) == (503, "event loop unresponsive: no answer within 0.2s\n")
        assert get(server.url + "/readyz")[0] == 503
        release.set()
        # The loop turns again once the blocking callback returns: wait for that turn itself.
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop_in_thread).result(10)
        assert get(server.url + "/healthz")[0] == 200
        assert get(server.url + "/nothing-here")[0] == 404
    finally:
        release.set()
        server.stop()


def test_probes_answer_503_once_the_loop_has_closed() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    server = start_probe_server(("127.0.0.1", 0), IdleTarget("test"), loop)
    try:
        assert get(server.url + "/healthz") == (503, "stopping: the event loop has closed\n")
    finally:
        server.stop()


def test_a_taken_address_is_a_probe_server_error_naming_it(
    loop_in_thread: asyncio.AbstractEventLoop,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ProbeServerError, match=f"on 127.0.0.1:{port}: Address already in use"):
            start_probe_server(("127.0.0.1", port), IdleTarget("test"), loop_in_thread)


def test_nothing_answers_once_the_probe_server_has_stopped() -> None:
    loop = asyncio.new_event_loop()
    server = start_probe_server(("127.0.0.1", 0), IdleTarget("test"), loop)
    server.stop()
    loop.close()
    assert get(server.url + "/healthz")[0] == 0
