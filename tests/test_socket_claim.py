"""The socket claim (kubegpu.socket_claim) shared by the node agent and the DRA driver: exclusive
across open files and processes, naming its owner, given back on release and by a dying owner.
The two-process behaviour of each user is in tests/kubelet/test_two_agents.py and
tests/dra/test_dra_driver_process.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kubegpu.socket_claim import SocketClaim, SocketInUse, lock_path_of


def test_a_socket_claim_is_exclusive_names_its_owner_and_is_given_back(tmp_path: Path) -> None:
    path = tmp_path / "dp" / "kubegpu-x.sock"
    first = SocketClaim.acquire(path, role="node agent")
    with pytest.raises(SocketInUse) as err:
        # Another open file: flock refuses it even in one process.
        SocketClaim.acquire(path, role="DRA driver")
    assert str(path) in str(err.value) and f"pid {os.getpid()}" in str(err.value)
    assert "served by another DRA driver" in str(err.value)
    first.release()
    assert not first.held and not first.lock_path.exists()
    second = SocketClaim.acquire(path, role="node agent")
    assert second.held
    second.release()


def test_a_killed_owner_leaves_the_socket_free_to_claim(tmp_path: Path) -> None:
    # An flock dies with its process, SIGKILL included: no stale lock blocks the successor.
    path = tmp_path / "dra.sock"
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pathlib\n"
            "from kubegpu.socket_claim import SocketClaim\n"
            "SocketClaim.acquire(pathlib.Path(sys.argv[1]), role='DRA driver')\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:  # leaving closes its stdin: it exits however the test ends
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(SocketInUse, match=f"pid {holder.pid} on "):
            SocketClaim.acquire(path, role="DRA driver")
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        claim = SocketClaim.acquire(path, role="DRA driver")
        assert claim.held and lock_path_of(path).read_text().startswith(f"pid {os.getpid()} on ")
        claim.release()
