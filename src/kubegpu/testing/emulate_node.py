"""``kubegpu emulate-node``: a whole GPU node on a laptop, no Kubernetes needed.

What it owns: wiring the kubelet emulator to a real ``kubegpu device-plugin`` *process* on the
fake GPU backend, and narrating what the kubelet sees (registration, advertised devices, one
example allocation through GetPreferredAllocation + Allocate, later health changes). The plugin
runs as a separate process on purpose: that is how the kubelet meets it, over unix sockets only.
On exit or Ctrl-C the plugin gets SIGTERM (then SIGKILL after a bounded wait) and a temporary
kubelet directory is removed.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import click

from kubegpu.cli.types import POSITIVE_SECONDS, Folder, SocketPath
from kubegpu.config.model import MAX_GPUS_PER_NODE
from kubegpu.inventory.spec import FakeSpecError, resolve_fake_spec
from kubegpu.kubelet.socketdir import SocketDirError, check_socket_dir
from kubegpu.testing.kubelet import (
    KUBELET_SOCKET_NAME,
    Allocation,
    AllocationError,
    KubeletEmulator,
    Registration,
    SeenDevice,
)

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
# After the first registration, wait this long for further resources before printing.
SETTLE_S = 0.5
POLL_S = 0.2


class EmulateNodeError(Exception):
    """The node could not be brought up; the message says why, with the plugin's stderr."""


def _plugin_command(
    fake_gpus: str,
    kubelet_dir: Path,
    fake_control: Path,
    log_level: str,
    extra: tuple[str, ...],
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kubegpu",
        "--log-level",
        log_level,
        "device-plugin",
        "--backend",
        "fake",
        "--fake-gpus",
        fake_gpus,
        "--kubelet-dir",
        str(kubelet_dir),
        "--fake-control",
        str(fake_control),
        *extra,
    ]


def _tail(log_file: IO[bytes] | None, limit: int = 4000) -> str:
    if log_file is None:
        return "(plugin output went to this terminal)"
    log_file.flush()
    log_file.seek(0)
    text = log_file.read().decode(errors="replace")
    return text[-limit:] if text else "(no output)"


def stop_process(process: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> int:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL; returns the exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning(
                "device plugin pid %d ignored SIGTERM for %gs; killing", process.pid, grace_s
            )
            process.kill()
            process.wait()
    return process.returncode


def wait_for_node(
    emulator: KubeletEmulator, process: subprocess.Popen[bytes], timeout_s: float
) -> list[Registration]:
    """Wait for the plugin to register and advertise devices; fail fast if it exits."""
    deadline = time.monotonic() + timeout_s
    settled_at: float | None = None
    seen = 0
    while True:
        code = process.poll()
        if code is not None:
            raise EmulateNodeError(f"device plugin exited with code {code} before registering")
        registrations = emulator.registrations
        resources = {r.resource_name for r in registrations}
        ready = bool(resources) and all(emulator.devices(r) for r in resources)
        if ready and len(registrations) != seen:
            seen, settled_at = len(registrations), time.monotonic()
        if ready and settled_at is not None and time.monotonic() - settled_at >= SETTLE_S:
            return registrations
        if time.monotonic() >= deadline:
            rejected = emulator.rejected_registrations
            why = f"; rejected: {[r.error for r in rejected]}" if rejected else ""
            raise EmulateNodeError(
                f"device plugin did not register and advertise devices within {timeout_s:g}s{why}"
            )
        time.sleep(0.05)


def device_table(emulator: KubeletEmulator) -> list[str]:
    rows = [("RESOURCE", "DEVICE", "HEALTH", "NUMA")]
    for resource in emulator.resources():
        # The plugin's own order (ListAndWatch message order), usually GPU index order.
        for device_id, state in emulator.devices(resource).items():
            numa = ",".join(str(n) for n in state.numa_nodes) or "-"
            rows.append((resource, device_id, state.health, numa))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return [
        f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip()
        for r in rows
    ]


def describe_allocation(allocation: Allocation) -> list[str]:
    lines = [
        f"allocated {len(allocation.device_ids)} x {allocation.resource_name} to pod "
        f"{allocation.namespace}/{allocation.pod_name} container {allocation.container}: "
        + " ".join(allocation.device_ids)
    ]
    if allocation.preferred_device_ids is not None:
        lines.append("  GetPreferredAllocation chose: " + " ".join(allocation.preferred_device_ids))
    else:
        lines.append("  (plugin does not offer GetPreferredAllocation; kubelet picked)")
    lines.append("  container response:")
    lines.extend(f"    env {k}={v}" for k, v in sorted(allocation.envs.items()))
    lines.extend(
        f"    device {d.host_path} -> {d.container_path} ({d.permissions})"
        for d in allocation.devices
    )
    lines.extend(
        f"    mount {m.host_path} -> {m.container_path}{' (ro)' if m.read_only else ''}"
        for m in allocation.mounts
    )
    lines.extend(f"    annotation {k}={v}" for k, v in sorted(allocation.annotations.items()))
    lines.extend(f"    cdi {name}" for name in allocation.cdi_devices)
    return lines


def health_changes(
    resource: str, before: Mapping[str, SeenDevice], after: Mapping[str, SeenDevice]
) -> list[str]:
    lines = []
    for device_id in sorted(set(before) | set(after)):
        old, new = before.get(device_id), after.get(device_id)
        if old is None and new is not None:
            lines.append(f"{resource} {device_id} added ({new.health})")
        elif new is None and old is not None:
            lines.append(f"{resource} {device_id} removed")
        elif old is not None and new is not None and old.health != new.health:
            lines.append(f"{resource} {device_id} {old.health} -> {new.health}")
    return lines


def watch(emulator: KubeletEmulator, process: subprocess.Popen[bytes]) -> int:
    """Print device health changes and re-registrations until the plugin exits or we stop."""
    known = {r: emulator.devices(r) for r in emulator.resources()}
    registrations = len(emulator.registrations)
    while True:
        code = process.poll()
        if code is not None:
            click.echo(f"device plugin exited with code {code}")
            return 1
        current = emulator.registrations
        for registration in current[registrations:]:
            click.echo(
                f"{_now()} {registration.resource_name} registered again ({registration.endpoint})"
            )
        registrations = len(current)
        for resource in emulator.resources():
            devices = emulator.devices(resource)
            for line in health_changes(resource, known.get(resource, {}), devices):
                click.echo(f"{_now()} {line}")
            known[resource] = devices
        time.sleep(POLL_S)


def _now() -> str:
    return time.strftime("%H:%M:%S")


@contextlib.contextmanager
def _sigterm_as_keyboard_interrupt() -> Iterator[None]:
    # SIGTERM (e.g. from a test or systemd) takes the same clean-up path as Ctrl-C.
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@click.command("emulate-node")
@click.option(
    "--fake-gpus",
    required=True,
    help="Fake GPU preset or YAML spec for the plugin, e.g. 8xA100-80GB-NVLink, 4xT4.",
)
@click.option(
    "--kubelet-dir",
    type=Folder(purpose="create sockets"),
    default=None,
    help="Device-plugins directory to use (default: a temporary one, removed on exit).",
)
@click.option(
    "--allocate",
    "allocate_count",
    type=click.IntRange(0, MAX_GPUS_PER_NODE),
    default=2,
    show_default=True,
    help="Devices for the example allocation (0 skips it).",
)
@click.option("--resource", default=None, help="Resource for the example allocation.")
@click.option("--once", is_flag=True, help="Exit after the example allocation.")
@click.option(
    "--timeout",
    "timeout_s",
    type=POSITIVE_SECONDS,
    default=30.0,
    show_default=True,
    help="Seconds to wait for the plugin to register.",
)
@click.option(
    "--pod-resources-socket",
    type=SocketPath(),
    default=None,
    help="Also serve the kubelet's PodResources v1 API on this unix socket.",
)
@click.option(
    "--plugin-logs/--no-plugin-logs",
    default=False,
    show_default=True,
    help="Show the plugin's log lines here instead of only on failure.",
)
@click.option(
    "--plugin-arg",
    "plugin_args",
    multiple=True,
    help="Extra argument for `kubegpu device-plugin` (repeatable).",
)
@click.pass_context
def emulate_node(
    ctx: click.Context,
    fake_gpus: str,
    kubelet_dir: Path | None,
    allocate_count: int,
    resource: str | None,
    once: bool,
    timeout_s: float,
    pod_resources_socket: Path | None,
    plugin_logs: bool,
    plugin_args: tuple[str, ...],
) -> None:
    """Run a kubelet emulator and a real fake-GPU device plugin process, and show what happens."""
    log_level = str(ctx.find_root().params.get("log_level") or "info")
    try:  # here, not as the plugin's exit status after it started
        resolve_fake_spec(fake_gpus)
    except FakeSpecError as error:
        raise click.BadParameter(str(error), param_hint="'--fake-gpus'") from None
    if kubelet_dir is not None:
        try:
            check_socket_dir(kubelet_dir, [KUBELET_SOCKET_NAME, "kubegpu-nvidia.com_gpu.sock"])
        except SocketDirError as error:
            raise click.BadParameter(str(error), param_hint="'--kubelet-dir'") from None
    if pod_resources_socket is not None:
        try:
            check_socket_dir(pod_resources_socket.parent, [pod_resources_socket.name])
        except SocketDirError as error:
            raise click.BadParameter(str(error), param_hint="'--pod-resources-socket'") from None
    # One temporary root for everything we create: the kubelet dir (unless given) and the fake
    # backend's control socket, kept out of the kubelet dir because kubelets own the sockets there.
    session = Path(tempfile.mkdtemp(prefix="kubegpu-node-"))
    directory = kubelet_dir if kubelet_dir is not None else session / "device-plugins"
    fake_control = session / "fake-gpu.sock"
    exit_code = 0
    process: subprocess.Popen[bytes] | None = None
    emulator = KubeletEmulator(directory, pod_resources_socket=pod_resources_socket)
    resources = contextlib.ExitStack()
    log_file: IO[bytes] | None = (
        None if plugin_logs else resources.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
    )
    try:
        with _sigterm_as_keyboard_interrupt():
            emulator.start()
            click.echo(f"kubelet emulator: {emulator.kubelet_socket}")
            if pod_resources_socket is not None:
                click.echo(f"pod resources API: {pod_resources_socket}")
            command = _plugin_command(fake_gpus, directory, fake_control, log_level, plugin_args)
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT if log_file is not None else None,
                # Own session: Ctrl-C reaches only us, and we stop the plugin in order.
                start_new_session=True,
            )
            click.echo(f"device plugin: pid {process.pid}: {' '.join(command[1:])}")
            try:
                registrations = wait_for_node(emulator, process, timeout_s)
            except EmulateNodeError as error:
                raise click.ClickException(
                    f"{error}\n--- device plugin output ---\n{_tail(log_file)}"
                ) from None
            for registration in registrations:
                click.echo(
                    f"registered {registration.resource_name} on {registration.endpoint} "
                    f"(GetPreferredAllocation: {registration.get_preferred_allocation_available}, "
                    f"PreStartContainer: {registration.pre_start_required})"
                )
            for line in device_table(emulator):
                click.echo(line)
            if allocate_count:
                target = resource or registrations[0].resource_name
                try:
                    allocation = emulator.allocate(
                        target, allocate_count, pod_name="example", container="main"
                    )
                except AllocationError as error:
                    raise click.ClickException(f"example allocation failed: {error}") from None
                for line in describe_allocation(allocation):
                    click.echo(line)
            if not once:
                click.echo(f"fake GPU control socket: {fake_control}")
                click.echo(
                    f"break a GPU from another terminal: kubegpu fake-gpu xid --control "
                    f"{fake_control} --gpu 0 --xid 79"
                )
                click.echo("watching device health; Ctrl-C to stop")
                exit_code = watch(emulator, process)
    except KeyboardInterrupt:
        click.echo("stopping")
    finally:
        # The kubelet side goes first so the plugin's exit is not reported as a lost stream.
        emulator.stop()
        if process is not None:
            code = stop_process(process)
            click.echo(f"device plugin pid {process.pid} exited with code {code}")
        resources.close()
        shutil.rmtree(session, ignore_errors=True)
        if kubelet_dir is not None and kubelet_dir.is_dir():
            leftovers = sorted(p.name for p in kubelet_dir.iterdir() if p.is_socket())
            if leftovers:
                click.echo(f"warning: sockets left in {kubelet_dir}: {leftovers}", err=True)
    if exit_code:
        ctx.exit(exit_code)
