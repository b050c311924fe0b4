"""The fake GPU backend: a node described by a spec, whose GPUs can fail on command.

It implements the same :class:`~kubegpu.core.backend.GpuBackend` protocol as NVML and keeps
NVML's semantics where consumers depend on them: the snapshot is frozen and stable, a lost GPU
stays in it with the same ids (NVML keeps enumerating a GPU that fell off the bus), and health
events reach only watchers that are open when the event happens, as with an NVML event set.

Failures can be scripted in-process (:meth:`FakeGpuBackend.inject_xid`, ``lose``, ``restore``)
or from another process through an optional control unix socket speaking one JSON object per
line, so an end-to-end test or a demo can break a GPU under a running node agent::

    {"op": "xid", "gpu": "0", "xid": 79}   ->  {"ok": true}
    {"op": "lose", "gpu": "GPU-…"}         ->  {"ok": true}
    {"op": "restore", "gpu": 0}            ->  {"ok": true}
    {"op": "status"}                       ->  {"ok": true, "gpus": [...]}

and change MIG like an admin with ``nvidia-smi mig`` (kept in ``mig_state`` across restarts)::

    {"op": "mig-mode", "gpu": 0, "enabled": true}
    {"op": "mig-create", "gpu": 0, "profile": "3g.40gb", "start": 4}   (start optional)
    {"op": "mig-destroy", "gpu": 0, "gpu_instance_id": 1}

An Xid may name a MIG GPU instance (``"gpu_instance_id": 1``, optionally
``"compute_instance_id": 0``); without one it concerns the whole card.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubegpu.core.backend import InventoryError
from kubegpu.core.gpu import GpuDevice, GpuUuid, MigDevice, NodeInventory
from kubegpu.core.health import HealthEvent, HealthEventKind
from kubegpu.inventory.fake_mig import FakeMig
from kubegpu.inventory.spec import FakeGpuSpec, resolve_fake_spec

log = logging.getLogger(__name__)

# A control request or reply larger than this is not a command; refuse it rather than buffer.
_MAX_LINE_BYTES = 64 * 1024


class FakeControlError(Exception):
    """The control socket could not be reached or answered something that is not a reply."""


class FakeHealthWatcher:
    """Events for one fake GPU, delivered to whoever waits (normally one monitor thread)."""

    def __init__(self, uuid: GpuUuid, on_close: Callable[[FakeHealthWatcher], None]) -> None:
        self.uuid = uuid
        self._on_close = on_close
        self._events: list[HealthEvent] = []
        self._cond = threading.Condition()
        self._closed = False

    def push(self, event: HealthEvent) -> None:
        with self._cond:
            if not self._closed:
                self._events.append(event)
                self._cond.notify_all()

    def wait(self, timeout_s: float) -> list[HealthEvent]:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._events) or self._closed, timeout=timeout_s)
            events, self._events = self._events, []
            return events

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._on_close(self)


class FakeGpuBackend:
    """GPUs from a :class:`FakeGpuSpec`, with scriptable Xids, loss and recovery."""

    name = "fake"

    def __init__(
        self,
        spec: FakeGpuSpec | NodeInventory,
        *,
        control_socket: Path | None = None,
        mig_state: Path | None = None,
    ) -> None:
        self.spec = (
            spec
            if isinstance(spec, FakeGpuSpec)
            else FakeGpuSpec(name="inline", source="inline", inventory=spec)
        )
        self._mig = FakeMig(self.spec.inventory, mig_state)
        self._inventory = self.spec.inventory
        self._lock = threading.Lock()
        self._watchers: dict[GpuUuid, list[FakeHealthWatcher]] = {
            gpu.uuid: [] for gpu in self._inventory
        }
        self._lost: set[GpuUuid] = set()
        self._xids: dict[GpuUuid, list[int]] = {gpu.uuid: [] for gpu in self._inventory}
        self._closed = False
        self._server: _ControlServer | None = None
        self._server_thread: threading.Thread | None = None
        self.control_socket = control_socket
        if control_socket is not None:
            self._start_control_server(control_socket)

    @classmethod
    def from_spec(
        cls,
        name_or_path: str | Path,
        *,
        control_socket: Path | None = None,
        mig_state: Path | None = None,
    ) -> FakeGpuBackend:
        """A backend for a preset name or spec file (raises ``FakeSpecError``)."""
        return cls(
            resolve_fake_spec(name_or_path), control_socket=control_socket, mig_state=mig_state
        )

    # -- GpuBackend ---------------------------------------------------------------------------

    def snapshot(self) -> NodeInventory:
        if self._closed:
            raise InventoryError("fake GPU backend is closed")
        return self._mig.inventory()

    def watch_health(self, uuid: GpuUuid) -> FakeHealthWatcher:
        gpu = self._resolve(uuid)
        watcher = FakeHealthWatcher(gpu.uuid, self._forget_watcher)
        with self._lock:
            if self._closed:
                raise InventoryError("fake GPU backend is closed")
            self._watchers[gpu.uuid].append(watcher)
            lost = gpu.uuid in self._lost
        if lost:
            # NVML's watcher would find a lost GPU on its first check; so does ours.
            watcher.push(HealthEvent(HealthEventKind.LOST, gpu.uuid, detail="GPU is lost"))
        return watcher

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            watchers = [w for ws in self._watchers.values() for w in ws]
        for watcher in watchers:
            watcher.close()
        self._stop_control_server()

    # -- scripting ----------------------------------------------------------------------------

    def inject_xid(
        self,
        gpu: str | int | GpuUuid,
        xid: int,
        *,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> GpuDevice:
        """Report Xid ``xid`` on ``gpu`` (index, index as text, or UUID) to its open watchers;
        with ``gpu_instance_id`` it concerns that MIG GPU instance only, as NVML reports it."""
        if not isinstance(xid, int) or isinstance(xid, bool) or xid <= 0:
            raise ValueError(f"Xid must be a positive integer, got {xid!r}")
        device = self._resolve(gpu)
        where = ""
        if gpu_instance_id is not None:
            if not any(m.gpu_instance_id == gpu_instance_id for m in device.mig_devices):
                raise ValueError(f"GPU {device.index} has no MIG GPU instance {gpu_instance_id}")
            where = f" (MIG GPU instance {gpu_instance_id})"
        with self._lock:
            self._xids[device.uuid].append(xid)
        log.info("fake: injecting Xid %d on GPU %d%s (%s)", xid, device.index, where, device.uuid)
        self._publish(
            device,
            HealthEvent(
                HealthEventKind.XID,
                device.uuid,
                xid=xid,
                detail=where.strip(" ()"),
                gpu_instance_id=gpu_instance_id,
                compute_instance_id=compute_instance_id if gpu_instance_id is not None else None,
            ),
        )
        return device

    # -- MIG, as an admin with nvidia-smi would change it (and the MigPartitioner port) ------

    def set_mig_mode(self, gpu: str | int | GpuUuid, enabled: bool) -> GpuDevice:
        return self._mig.set_mode(self._resolve(gpu), enabled)

    def create_mig_device(
        self, parent: str | int | GpuUuid, profile: str, start: int | None = None
    ) -> MigDevice:
        return self._mig.create(self._resolve(parent), profile, start)

    def destroy_mig_device(self, parent: str | int | GpuUuid, gpu_instance_id: int) -> None:
        device = self._resolve(parent)
        if any(m.gpu_instance_id == gpu_instance_id for m in device.mig_devices):
            self._mig.destroy(device, gpu_instance_id)

    def lose(self, gpu: str | int | GpuUuid) -> GpuDevice:
        """Make ``gpu`` stop answering: watchers report ``LOST``; it stays in the snapshot."""
        device = self._resolve(gpu)
        with self._lock:
            already = device.uuid in self._lost
            self._lost.add(device.uuid)
        if not already:
            log.info("fake: GPU %d (%s) is now lost", device.index, device.uuid)
            self._publish(
                device, HealthEvent(HealthEventKind.LOST, device.uuid, detail="GPU is lost")
            )
        return device

    def restore(self, gpu: str | int | GpuUuid) -> GpuDevice:
        """Bring a lost ``gpu`` back: watchers report ``RECOVERED`` (also after Xids alone)."""
        device = self._resolve(gpu)
        with self._lock:
            self._lost.discard(device.uuid)
            self._xids[device.uuid].clear()
        log.info("fake: GPU %d (%s) restored", device.index, device.uuid)
        self._publish(
            device, HealthEvent(HealthEventKind.RECOVERED, device.uuid, detail="restored")
        )
        return device

    def is_lost(self, gpu: str | int | GpuUuid) -> bool:
        device = self._resolve(gpu)
        with self._lock:
            return device.uuid in self._lost

    def status(self) -> list[dict[str, Any]]:
        """Per GPU: index, uuid, whether lost, Xids injected since the last restore."""
        with self._lock:
            return [
                {
                    "index": gpu.index,
                    "uuid": gpu.uuid,
                    "lost": gpu.uuid in self._lost,
                    "xids": list(self._xids[gpu.uuid]),
                    "watchers": len(self._watchers[gpu.uuid]),
                    "mig_enabled": gpu.mig_enabled,
                    "mig": [_mig_json(m) for m in gpu.mig_devices],
                }
                for gpu in self._mig.inventory()
            ]

    # -- internals ----------------------------------------------------------------------------

    def _resolve(self, gpu: str | int | GpuUuid) -> GpuDevice:
        if isinstance(gpu, bool):
            raise InventoryError(f"no GPU {gpu!r} on this fake node")
        try:
            inventory = self._mig.inventory()
            if isinstance(gpu, int):
                return inventory.by_index(gpu)
            text = str(gpu).strip()
            if text.isdigit():
                return inventory.by_index(int(text))
            return inventory.by_uuid(GpuUuid(text))
        except KeyError:
            known = ", ".join(f"{g.index}={g.uuid}" for g in self._inventory)
            raise InventoryError(f"no GPU {gpu!r} on this fake node (GPUs: {known})") from None

    def _publish(self, device: GpuDevice, event: HealthEvent) -> None:
        with self._lock:
            watchers = list(self._watchers[device.uuid])
        for watcher in watchers:
            watcher.push(event)

    def _forget_watcher(self, watcher: FakeHealthWatcher) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._watchers[watcher.uuid].remove(watcher)

    def _start_control_server(self, path: Path) -> None:
        # A stale socket from a crashed run would make bind fail; anything else is not ours.
        if path.is_socket():
            path.unlink()
        try:
            server = _ControlServer(str(path), self)
        except OSError as exc:
            # bind() errors name no path ("[Errno 2] No such file or directory"): say which.
            raise InventoryError(
                f"cannot listen on the fake GPU control socket {path}: {exc.strerror or exc}",
                "its directory must exist and be writable, and the path at most 107 bytes",
            ) from exc
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"fake-gpu-control:{path}",
            daemon=True,
        )
        thread.start()
        self._server, self._server_thread = server, thread
        log.info("fake: control socket listening at %s", path)

    def _stop_control_server(self) -> None:
        server, thread = self._server, self._server_thread
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        if self.control_socket is not None:
            with contextlib.suppress(FileNotFoundError):
                self.control_socket.unlink()
        self._server = self._server_thread = None

    def handle_command(self, request: object) -> dict[str, Any]:
        """Apply one control request (a decoded JSON object) and build its reply."""
        if not isinstance(request, dict):
            return {"ok": False, "error": "expected a JSON object"}
        op = request.get("op")
        try:
            if op == "status":
                return {"ok": True, "backend": self.spec.name, "gpus": self.status()}
            if op not in _OPS:
                return {
                    "ok": False,
                    "error": f"unknown op {op!r} (expected {', '.join(_OPS)} or status)",
                }
            if "gpu" not in request:
                return {"ok": False, "error": f"op {op!r} needs a 'gpu' (index or UUID)"}
            gpu = request["gpu"]
            if op.startswith("mig-"):
                return self._mig_command(op, gpu, request)
            if op == "xid":
                xid = request.get("xid")
                if not isinstance(xid, int) or isinstance(xid, bool):
                    return {"ok": False, "error": f"op 'xid' needs an integer 'xid', got {xid!r}"}
                device = self.inject_xid(
                    gpu,
                    xid,
                    gpu_instance_id=_optional_int(request, "gpu_instance_id"),
                    compute_instance_id=_optional_int(request, "compute_instance_id"),
                )
            elif op == "lose":
                device = self.lose(gpu)
            else:
                device = self.restore(gpu)
        except (InventoryError, ValueError) as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "gpu": {"index": device.index, "uuid": device.uuid}}

    def _mig_command(self, op: str, gpu: object, request: dict[str, Any]) -> dict[str, Any]:
        device = self._resolve(gpu)  # type: ignore[arg-type]
        if op == "mig-mode":
            enabled = request.get("enabled")
            if not isinstance(enabled, bool):
                raise ValueError(f"op 'mig-mode' needs 'enabled': true or false, got {enabled!r}")
            device = self.set_mig_mode(device.uuid, enabled)
            return {"ok": True, "gpu": {"index": device.index, "mig_enabled": enabled}}
        if op == "mig-create":
            profile = request.get("profile")
            if not isinstance(profile, str):
                raise ValueError(
                    f"op 'mig-create' needs a 'profile' such as 3g.40gb, got {profile!r}"
                )
            mig = self.create_mig_device(device.uuid, profile, _optional_int(request, "start"))
            return {"ok": True, "mig": _mig_json(mig)}
        gi = _optional_int(request, "gpu_instance_id")
        if gi is None:
            raise ValueError("op 'mig-destroy' needs an integer 'gpu_instance_id'")
        # FakeMig.destroy refuses an id the card does not hold, naming the ids it does.
        return {"ok": True, "mig": _mig_json(self._mig.destroy(device, gi))}


_OPS = ("xid", "lose", "restore", "mig-mode", "mig-create", "mig-destroy")


def _optional_int(request: dict[str, Any], key: str) -> int | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"'{key}' must be a non-negative integer, got {value!r}")
    return value


def _mig_json(mig: MigDevice) -> dict[str, Any]:
    return {
        "uuid": mig.uuid,
        "profile": mig.profile,
        "start": mig.start,
        "gpu_instance_id": mig.gpu_instance_id,
        "compute_instance_id": mig.compute_instance_id,
        "memory_total_mib": mig.memory_total_mib,
    }


class _ControlHandler(socketserver.StreamRequestHandler):
    server: _ControlServer

    def handle(self) -> None:
        while True:
            line = self.rfile.readline(_MAX_LINE_BYTES + 1)
            if not line:
                return
            if len(line) > _MAX_LINE_BYTES:
                self._reply({"ok": False, "error": "request line too long"})
                return
            if not line.strip():
                continue
            try:
                request = json.loads(line)
            except json.JSONDecodeError as exc:
                reply: dict[str, Any] = {"ok": False, "error": f"not JSON: {exc}"}
            else:
                reply = self.server.backend.handle_command(request)
            self._reply(reply)

    def _reply(self, reply: dict[str, Any]) -> None:
        self.wfile.write(json.dumps(reply).encode() + b"\n")
        self.wfile.flush()


class _ControlServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    # shutdown() must not wait for clients that keep their connection open.
    block_on_close = False

    def __init__(self, path: str, backend: FakeGpuBackend) -> None:
        self.backend = backend
        super().__init__(path, _ControlHandler)


def send_fake_gpu_command(
    socket_path: Path | str, op: str, *, timeout_s: float = 5.0, **fields: Any
) -> dict[str, Any]:
    """Send one control request to a running fake backend and return its decoded reply.

    Raises :class:`FakeControlError` when the socket cannot be reached or the reply is not a
    JSON object; a refused command comes back as ``{"ok": False, "error": ...}``.
    """
    request = {"op": op, **fields}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(socket_path))
            sock.sendall(json.dumps(request).encode() + b"\n")
            with sock.makefile("rb") as reader:
                line = reader.readline(_MAX_LINE_BYTES + 1)
    except OSError as exc:
        raise FakeControlError(
            f"cannot reach the fake GPU control socket {socket_path}: {exc}"
        ) from exc
    try:
        reply = json.loads(line)
    except json.JSONDecodeError as exc:
        raise FakeControlError(f"{socket_path}: reply is not JSON: {line[:200]!r}") from exc
    if not isinstance(reply, dict):
        raise FakeControlError(f"{socket_path}: reply is not a JSON object: {reply!r}")
    return reply
