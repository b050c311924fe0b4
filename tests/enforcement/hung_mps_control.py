"""A ``nvidia-cuda-mps-control`` that has hung: the daemon (``-f``) ignores SIGTERM and never
reads a command, and the client (no arguments) waits for a reply that never comes, ignoring
SIGTERM too, as a client stuck on a dead daemon's socket does. Each writes its pid to
``$CUDA_MPS_LOG_DIRECTORY/<daemon|client>-<pid>.pid`` so a test can check it is gone."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    role = "daemon" if "-f" in sys.argv[1:] else "client"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log_dir = Path(os.environ["CUDA_MPS_LOG_DIRECTORY"])
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / f"{role}-{os.getpid()}.pid").write_text(str(os.getpid()))
    while True:
        time.sleep(3600)
