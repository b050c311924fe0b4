"""Two node agents on one kubelet directory, as a DaemonSet rolling update with a surge runs
them: the second sees the first owns the socket and waits, naming the socket and its owner,
instead of each unlinking and rebinding the other's socket and registering again and again.
Once the first exits, the second takes over; one stopped while it waits exits cleanly. Real
processes against the kubelet emulator."""

from __future__ import annotations

import time
from pathlib import Path

from kubegpu.testing.kubelet import KubeletEmulator
from tests.kubelet.conftest import RESOURCE, PluginProcess

SOCKET = "kubegpu-nvidia.com_gpu.sock"


def registrations(kubelet: KubeletEmulator) -> int:
    return sum(r.resource_name == RESOURCE for r in kubelet.registrations)


def test_a_second_agent_on_the_same_kubelet_dir_waits_for_the_first_then_takes_over(
    tempdir: Path,
) -> None:
    kubelet_dir = tempdir / "dp"
    kubelet = KubeletEmulator(kubelet_dir)
    kubelet.start()
    first = PluginProcess(kubelet_dir, tag="first")
    second: PluginProcess | None = None
    try:
        kubelet.wait_for_registration(RESOURCE, timeout_s=30)
        kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 8, timeout_s=30)
        second = PluginProcess(kubelet_dir, tag="second")
        before = registrations(kubelet)
        # Watch them side by side for a few seconds (the fight was ~190 Registers in 10 s): a
        # real window on two real processes, since what it rules out is a repeated Register.
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline and second.proc.poll() is None:
            time.sleep(0.1)
        registered = registrations(kubelet) - before
        assert registered <= 1, f"{registered} Register calls while two agents ran"
        assert second.proc.poll() is None, second.log()[-3000:]
        second.wait_for_log("waiting for it to exit")
        message = next(line for line in second.log().splitlines() if "waiting for it" in line)
        assert str(kubelet_dir / SOCKET) in message
        assert f"pid {first.proc.pid} on " in message
        assert kubelet.is_connected(RESOURCE)
        assert first.proc.poll() is None

        # The first goes (the old pod of the rolling update): the second serves and registers.
        assert first.stop() == 0
        kubelet.wait_for_registration(RESOURCE, timeout_s=30, count=before + 1)
        kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 8, timeout_s=30)
        assert (kubelet_dir / SOCKET).is_socket()
        assert kubelet.is_connected(RESOURCE)

        # One more, stopped while it waits: it exits cleanly and the owner is untouched.
        serving = registrations(kubelet)
        third = PluginProcess(kubelet_dir, tag="third")
        try:
            third.wait_for_log(f"pid {second.proc.pid} on ")
        finally:
            assert third.stop() == 0, third.log()[-3000:]
        assert registrations(kubelet) == serving
        assert kubelet.is_connected(RESOURCE) and (kubelet_dir / SOCKET).is_socket()
        assert second.stop() == 0
    finally:
        first.stop()
        if second is not None:
            second.stop()
        kubelet.stop()
