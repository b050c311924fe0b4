"""``kubegpu exporter`` as a real subprocess: it serves /metrics and stops cleanly on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from kubegpu.testing.waiting import wait_until


def scraped_gpus(url: str) -> set[str]:
    """UUIDs of the GPUs with a ``kubegpu_gpu_memory_total_bytes`` sample for node-cli."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        s.labels["uuid"]
        for family in text_string_to_metric_families(text)
        if family.name == "kubegpu_gpu_memory_total_bytes"
        for s in family.samples
        if s.labels["node"] == "node-cli"
    }


def test_exporter_command_serves_fake_gpus_and_stops_on_sigterm() -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kubegpu",
            "exporter",
            "--backend",
            "fake",
            "--fake-gpus",
            "4xT4",
            "--listen",
            "127.0.0.1:0",
            "--no-pod-resources",
            "--node-name",
            "node-cli",
            "--interval",
            "0.2",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        url = None
        for line in process.stderr:
            match = re.search(r"serving (http://\S+/metrics)", line)
            if match:
                url = match.group(1)
                break
        assert url, "the exporter never said where it serves"
        # It serves at once and refreshes in the background: until the first refresh has
        # completed a scrape has no GPU series yet, so poll (bounded) for one that has them.
        gpus = wait_until(lambda: scraped_gpus(url), timeout_s=20, what="a scrape with GPUs")
        assert len(gpus) == 4
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
