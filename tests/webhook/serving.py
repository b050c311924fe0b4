"""A webhook command run as a real process for the tests: HTTPS on a free loopback port with
the test PKI, the URL read from its start-up log, stopped by SIGTERM (exit 0, no traceback)."""

from __future__ import annotations

import contextlib
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def serving_webhook(
    command: str, path: str, pki: Path, *args: str
) -> Iterator[tuple[str, ssl.SSLContext]]:
    """``kubegpu <command> <args>`` serving ``path``; yields its base URL and a client context
    trusting the PKI's CA."""
    log = pki / f"{command}.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubegpu",
                command,
                "--host=127.0.0.1",
                "--port=0",
                f"--tls-cert-file={pki / 'server.crt'}",
                f"--tls-key-file={pki / 'server.key'}",
                *args,
            ],
            stderr=sink,
        )
    url = ""
    while not url and process.poll() is None:
        found = re.search(rf"serving (https://\S+){re.escape(path)}", log.read_text())
        url = found.group(1) if found else ""
        time.sleep(0.05)
    assert url, f"the webhook never said where it serves: {log.read_text()}"
    try:
        yield url, ssl.create_default_context(cafile=str(pki / "ca.crt"))
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert "Traceback" not in log.read_text()
