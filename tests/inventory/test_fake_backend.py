"""The fake backend: NVML-like semantics, in-process scripting and the control socket."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.backend import InventoryError
from kubegpu.core.health import HealthEvent, HealthEventKind
from kubegpu.inventory.fake import FakeControlError, FakeGpuBackend, send_fake_gpu_command
from tests.inventory.contract import check_backend

WAIT_S = 5.0  # generous: an event that was published is returned at once, never after this


@pytest.fixture
def backend() -> Iterator[FakeGpuBackend]:
    fake = FakeGpuBackend.from_spec("4xT4")
    yield fake
    fake.close()


@pytest.fixture
def controlled(short_tmp: Path) -> Iterator[FakeGpuBackend]:
    fake = FakeGpuBackend.from_spec("8xA100-80GB-NVLink", control_socket=short_tmp / "ctl.sock")
    yield fake
    fake.close()


@pytest.mark.parametrize(
    "preset", ["4xT4", "2xV100-2xT4", "8xA100-80GB-NVLink", "8xV100-32GB-HybridCubeMesh"]
)
def test_fake_backend_meets_the_backend_contract(preset: str) -> None:
    fake = FakeGpuBackend.from_spec(preset)
    try:
        check_backend(fake)
    finally:
        fake.close()


def test_an_injected_xid_reaches_the_gpus_watcher_only(backend: FakeGpuBackend) -> None:
    gpus = backend.snapshot().gpus
    first, second = backend.watch_health(gpus[0].uuid), backend.watch_health(gpus[1].uuid)
    backend.inject_xid(0, 79)
    assert first.wait(WAIT_S) == [HealthEvent(HealthEventKind.XID, gpus[0].uuid, xid=79)]
    assert second.wait(0.05) == []
    first.close()
    second.close()


def test_gpus_are_addressed_by_index_text_or_uuid(backend: FakeGpuBackend) -> None:
    gpu = backend.snapshot().gpus[2]
    assert backend.inject_xid("2", 31) == gpu
    assert backend.inject_xid(gpu.uuid, 31) == gpu
    with pytest.raises(InventoryError, match="no GPU '9'"):
        backend.lose("9")
    with pytest.raises(InventoryError, match="GPU-nope"):
        backend.watch_health("GPU-nope")  # type: ignore[arg-type]


def test_a_lost_gpu_stays_in_the_snapshot_and_its_watcher_reports_lost(
    backend: FakeGpuBackend,
) -> None:
    before = backend.snapshot()
    uuid = before.gpus[1].uuid
    watcher = backend.watch_health(uuid)
    backend.lose(1)
    assert [event.kind for event in watcher.wait(WAIT_S)] == [HealthEventKind.LOST]
    assert backend.snapshot() == before
    assert backend.is_lost(1)
    backend.restore(1)
    assert [event.kind for event in watcher.wait(WAIT_S)] == [HealthEventKind.RECOVERED]
    assert not backend.is_lost(1)
    watcher.close()


def test_a_watcher_opened_on_a_lost_gpu_reports_lost_first(backend: FakeGpuBackend) -> None:
    backend.lose(3)
    watcher = backend.watch_health(backend.snapshot().gpus[3].uuid)
    assert [event.kind for event in watcher.wait(WAIT_S)] == [HealthEventKind.LOST]
    watcher.close()


def test_losing_a_lost_gpu_again_reports_nothing_new(backend: FakeGpuBackend) -> None:
    watcher = backend.watch_health(backend.snapshot().gpus[0].uuid)
    backend.lose(0)
    backend.lose(0)
    assert len(watcher.wait(WAIT_S)) == 1
    assert watcher.wait(0.05) == []
    watcher.close()


def test_closing_the_backend_wakes_and_closes_its_watchers(backend: FakeGpuBackend) -> None:
    watcher = backend.watch_health(backend.snapshot().gpus[0].uuid)
    backend.close()
    assert watcher.wait(WAIT_S) == []
    with pytest.raises(InventoryError, match="closed"):
        backend.snapshot()


def test_control_socket_injects_an_xid_into_a_watcher(controlled: FakeGpuBackend) -> None:
    assert controlled.control_socket is not None
    gpu = controlled.snapshot().gpus[5]
    watcher = controlled.watch_health(gpu.uuid)
    reply = send_fake_gpu_command(controlled.control_socket, "xid", gpu="5", xid=79)
    assert reply == {"ok": True, "gpu": {"index": 5, "uuid": gpu.uuid}}
    assert watcher.wait(WAIT_S) == [HealthEvent(HealthEventKind.XID, gpu.uuid, xid=79)]
    watcher.close()


def test_control_socket_loses_restores_and_reports_status(controlled: FakeGpuBackend) -> None:
    path = controlled.control_socket
    assert path is not None
    uuid = controlled.snapshot().gpus[2].uuid
    assert send_fake_gpu_command(path, "lose", gpu=uuid)["ok"] is True
    status = send_fake_gpu_command(path, "status")
    assert status["ok"] is True
    assert [gpu["lost"] for gpu in status["gpus"]] == [
        False,
        False,
        True,
        False,
        False,
        False,
        False,
        False,
    ]
    assert send_fake_gpu_command(path, "restore", gpu=2)["ok"] is True
    assert not any(gpu["lost"] for gpu in send_fake_gpu_command(path, "status")["gpus"])


@pytest.mark.parametrize(
    ("request_fields", "error"),
    [
        pytest.param({"op": "melt", "gpu": 0}, "unknown op 'melt'", id="unknown op"),
        pytest.param({"op": "xid", "gpu": 0}, "integer 'xid'", id="xid missing"),
        pytest.param({"op": "xid", "gpu": 0, "xid": "79"}, "integer 'xid'", id="xid as text"),
        pytest.param({"op": "xid", "gpu": 0, "xid": 0}, "positive", id="xid zero"),
        pytest.param({"op": "lose"}, "needs a 'gpu'", id="gpu missing"),
        pytest.param({"op": "lose", "gpu": 8}, "no GPU 8", id="gpu out of range"),
    ],
)
def test_control_socket_refuses_bad_commands_with_a_reason(
    controlled: FakeGpuBackend, request_fields: dict[str, Any], error: str
) -> None:
    assert controlled.control_socket is not None
    fields = dict(request_fields)
    op = str(fields.pop("op"))
    reply = send_fake_gpu_command(controlled.control_socket, op, **fields)
    assert reply["ok"] is False
    assert error in reply["error"]


def test_control_socket_answers_every_line_of_one_connection(controlled: FakeGpuBackend) -> None:
    assert controlled.control_socket is not None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(WAIT_S)
        sock.connect(str(controlled.control_socket))
        sock.sendall(b'{"op": "status"}\nnot json\n{"op": "lose", "gpu": 0}\n')
        with sock.makefile("rb") as reader:
            replies = [json.loads(reader.readline()) for _ in range(3)]
    assert [reply["ok"] for reply in replies] == [True, False, True]
    assert "not JSON" in replies[1]["error"]
    assert controlled.is_lost(0)


def test_closing_the_backend_removes_its_control_socket(short_tmp: Path) -> None:
    path = short_tmp / "ctl.sock"
    fake = FakeGpuBackend.from_spec("4xT4", control_socket=path)
    assert path.is_socket()
    fake.close()
    assert not path.exists()
    with pytest.raises(FakeControlError, match="cannot reach"):
        send_fake_gpu_command(path, "status")


def test_a_stale_control_socket_is_replaced(short_tmp: Path) -> None:
    path = short_tmp / "ctl.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    fake = FakeGpuBackend.from_spec("4xT4", control_socket=path)
    try:
        assert send_fake_gpu_command(path, "status")["ok"] is True
    finally:
        fake.close()


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("missing-dir/ctl.sock", id="no such directory"),
        pytest.param("x" * 120, id="too long"),
    ],
)
def test_a_control_socket_that_cannot_listen_is_an_inventory_error_naming_it(
    short_tmp: Path, name: str
) -> None:
    path = short_tmp / name
    with pytest.raises(InventoryError) as err:
        FakeGpuBackend.from_spec("4xT4", control_socket=path)
    assert f"cannot listen on the fake GPU control socket {path}" in str(err.value)
