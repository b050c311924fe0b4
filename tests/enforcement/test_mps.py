"""Supervision of the MPS control daemon, with the fake daemon script as a real process."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kubegpu.config.model import Dra, GpuShare
from kubegpu.enforcement.mps import MpsDaemon, MpsSpec, mps_spec_for
from kubegpu.sharing.contract import Grant, share_contract
from kubegpu.testing.waiting import wait_until_async
from tests.enforcement.fakes import HUNG, install_fake_mps_control


def spec_for(command: Path | str, root: Path, **kwargs: float) -> MpsSpec:
    return MpsSpec(
        str(command),
        ("-f",),
        root / "mps",
        ("GPU-aaaa", "GPU-bbbb"),
        restart_initial_s=kwargs.get("initial", 0.05),
        restart_max_s=kwargs.get("maximum", 0.4),
    )


async def wait_for(check: Callable[[], object], what: str, timeout_s: float = 10.0) -> None:
    """The daemon is a real process: its pipe, pid and log are looked at, not announced."""
    await wait_until_async(check, timeout_s=timeout_s, what=what, poll_s=0.02)


def log_lines(spec: MpsSpec) -> list[str]:
    path = spec.log_dir / "control.log"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize(
    "settings",
    [
        GpuShare.model_validate({"enforcement": "mps", "mps": {"hostDir": "/var/run/mps/"}}),
        Dra.model_validate(
            {"enforcement": "mps", "mps": {"controlArgs": ["-f", "-v"], "restartMaxS": 9}}
        ),
    ],
    ids=["device-plugin", "dra-driver"],
)
def test_the_daemon_listens_where_the_share_contract_sends_its_clients(
    settings: GpuShare | Dra,
) -> None:
    spec = mps_spec_for(settings.mps, ["GPU-aaaa"])
    m = settings.mps
    assert spec == MpsSpec(
        m.control_command,
        tuple(m.control_args),
        Path(m.host_dir),
        ("GPU-aaaa",),
        m.restart_initial_s,
        m.restart_max_s,
    )
    told = share_contract(Grant("GPU-aaaa", 0, 1024, 100), settings)
    assert told.mounts == (str(spec.pipe_dir), str(spec.log_dir))
    assert (told.env["CUDA_MPS_PIPE_DIRECTORY"], told.env["CUDA_MPS_LOG_DIRECTORY"]) == told.mounts


async def test_the_daemon_is_started_restarted_after_a_kill_and_told_to_quit_on_stop(
    fake_mps_control: Path, tmp_path: Path
) -> None:
    spec = spec_for(fake_mps_control, tmp_path)
    daemon = MpsDaemon(spec, node="node-a")
    await daemon.start()
    try:
        await wait_for(lambda: (spec.pipe_dir / "control").exists(), "control pipe created")
        first = daemon.pid
        assert first is not None
        # The fake daemon makes its pipe, then writes its line: wait for the line too.
        await wait_for(lambda: log_lines(spec) != [], "first log line")
        assert log_lines(spec) == [f"started {first} gpus=GPU-aaaa,GPU-bbbb"]

        os.kill(first, signal.SIGKILL)
        await wait_for(lambda: daemon.starts == 2 and daemon.pid not in (None, first), "restart")
        second = daemon.pid
        await wait_for(lambda: f"started {second} gpus=GPU-aaaa,GPU-bbbb" in log_lines(spec), "log")
        assert daemon.restart_delays == [0.05]
    finally:
        await daemon.stop()
    assert daemon.pid is None
    assert log_lines(spec)[-1] == f"quit {second}"
    assert not (spec.pipe_dir / "control").exists()
    # stop() has awaited the supervising task to its end, so nothing can start the daemon
    # again after this; a quit mistaken for a death would have counted a restart delay and
    # started it once more before stop() returned.
    assert daemon.starts == 2  # stopping is not mistaken for a death
    assert daemon.restart_delays == [0.05]


async def test_a_daemon_that_keeps_dying_is_restarted_with_a_bounded_doubling_delay(
    tmp_path: Path,
) -> None:
    delays: list[float] = []
    enough = asyncio.Event()
    blocked = asyncio.Event()

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) >= 6:
            enough.set()
            await blocked.wait()  # park here until stop() cancels us

    daemon = MpsDaemon(spec_for(shutil.which("false") or "/bin/false", tmp_path), sleep=sleep)
    await daemon.start()
    await asyncio.wait_for(enough.wait(), 10)
    await daemon.stop()
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.4, 0.4]
    assert daemon.starts == 6


async def test_a_missing_command_is_retried_not_fatal(tmp_path: Path) -> None:
    delays: list[float] = []
    enough = asyncio.Event()

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) >= 2:
            enough.set()
        await asyncio.sleep(0)

    daemon = MpsDaemon(spec_for(tmp_path / "no-such-mps-control", tmp_path), sleep=sleep)
    await daemon.start()
    await asyncio.wait_for(enough.wait(), 10)
    await daemon.stop()
    assert daemon.starts == 0
    assert delays[:2] == [0.05, 0.1]


@pytest.mark.gpu
async def test_the_real_mps_daemon_serves_a_cuda_client_within_its_limits(tmp_path: Path) -> None:
    """Needs a GPU, the driver's nvidia-cuda-mps-control and a CUDA client (python with
    cupy or torch); skipped otherwise."""
    command = shutil.which("nvidia-cuda-mps-control")
    if command is None:
        pytest.skip("nvidia-cuda-mps-control is not installed (no NVIDIA driver here)")
    # Prints the SMs the client may use, then tries to take 1 GiB: MPS must refuse it under a
    # 512 MiB limit, and report about a quarter of the SMs under a 25 % thread limit.
    probe = (
        "import torch\n"
        "print(torch.cuda.get_device_properties(0).multi_processor_count)\n"
        "try:\n"
        "    x = torch.empty(1024**3, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()\n"
        "    print('allocated')\n"
        "except torch.OutOfMemoryError:\n"
        "    print('refused')\n"
    )
    if importlib.util.find_spec("torch") is None:
        pytest.skip("no CUDA client available (torch is not installed)")
    spec = MpsSpec(command, ("-f",), tmp_path / "mps", ())
    daemon = MpsDaemon(spec)
    await daemon.start()
    try:
        await wait_for(lambda: (spec.pipe_dir / "control").exists(), "MPS control pipe", 30)

        def run_probe(extra: dict[str, str]) -> list[str]:
            result = subprocess.run(
                [sys.executable, "-c", probe],
                env={**spec.env(), **extra},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert result.returncode == 0, result.stderr
            return result.stdout.split()

        full_sms, unlimited = run_probe({})
        assert unlimited == "allocated"
        limits = {
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=512M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        }
        limited_sms, limited = run_probe(limits)
        assert limited == "refused", "MPS let a client past its 512 MiB memory limit"
        # MPS provisions whole SM groups: about a quarter (32 of 132 on an H100), never a third.
        assert 0 < int(limited_sms) <= int(full_sms) // 3, (limited_sms, full_sms)
    finally:
        await daemon.stop()
    assert daemon.pid is None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_stopping_a_hung_daemon_kills_the_quit_client_then_the_daemon(tmp_path: Path) -> None:
    spec = spec_for(install_fake_mps_control(tmp_path, HUNG), tmp_path)
    daemon = MpsDaemon(spec, node="node-a")
    await daemon.start()
    await wait_for(lambda: list(spec.log_dir.glob("daemon-*.pid")), "the daemon running")
    pid = daemon.pid
    assert pid is not None
    # A bound, not a measurement: the DaemonSet's terminationGracePeriodSeconds is 30, and the
    # agent has more to stop than MPS (before, this took 30 s: quit, SIGTERM and a wait each).
    await asyncio.wait_for(daemon.stop(), 15)
    clients = [int(p.read_text()) for p in spec.log_dir.glob("client-*.pid")]
    assert len(clients) == 1  # quit was asked for
    assert not alive(clients[0]), "the hung quit client was left running"
    assert daemon.pid is None and not alive(pid)
