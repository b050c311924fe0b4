"""Installing the fake MPS control daemon as an executable (shared with tests/kubelet)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

FAKE = Path(__file__).with_name("fake_mps_control.py")
HUNG = Path(__file__).with_name("hung_mps_control.py")


def install_fake_mps_control(directory: Path, script: Path = FAKE) -> Path:
    """Copy the fake daemon (or another ``script``) to ``directory/nvidia-cuda-mps-control``
    with a ``#!`` line for this interpreter, so it runs like the real command (one path, no
    interpreter argument)."""
    target = directory / "nvidia-cuda-mps-control"
    target.write_text(f"#!{sys.executable}\n{script.read_text()}")
    target.chmod(target.stat().st_mode | stat.S_IXUSR)
    return target
