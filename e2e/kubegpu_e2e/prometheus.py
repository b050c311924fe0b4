"""A real Prometheus (Debian's binary, from e2e/install-deps) scraping kubegpu beside the real
cluster: test_08_monitoring.py points it at the host processes' ports, test_10_install.py at
the installed release's pod port and Service endpoint."""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from kubegpu_e2e.cluster import Cluster, free_port, http_ok
from kubegpu_e2e.processes import HostProcess


class Prometheus:
    """Debian's prometheus binary on a free loopback port, with its storage in a temporary
    folder under the run's folder (so the run's cleanup finds it too), removed on stop."""

    def __init__(self, cluster: Cluster, rules: Path, targets: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.home = Path(tempfile.mkdtemp(prefix="prometheus-", dir=cluster.run_dir))
        config = {
            # A scrape's timeout is capped at its interval: 2 s leaves a loaded 2-core CI
            # machine room to answer, where 1 s timed scrapes out and made series stale.
            "global": {"scrape_interval": "2s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in targets.items()
            ],
        }
        (self.home / "prometheus.yml").write_text(yaml.safe_dump(config))
        binary = shutil.which("prometheus")
        assert binary, "prometheus not found: run e2e/install-deps (Debian's prometheus package)"
        self.process = HostProcess(
            "prometheus",
            [
                binary,
                f"--config.file={self.home / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.home / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            cluster.logs / "prometheus.log",
        )

    def start(self) -> Prometheus:
        self.process.start().wait_until(
            lambda: http_ok(f"{self.url}/-/ready"), 60, "Prometheus /-/ready"
        )
        return self

    def stop(self) -> None:
        self.process.stop(grace=10)
        shutil.rmtree(self.home, ignore_errors=True)

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def series(self, name: str) -> list[dict[str, str]]:
        found: list[dict[str, str]] = self.api("series", **{"match[]": name})
        return found

    def value(self, query: str) -> list[tuple[dict[str, str], float]]:
        data = self.api("query", query=query)
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]
