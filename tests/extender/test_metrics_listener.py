"""The optional metrics listener (``metrics-port``), over real HTTP: it answers ``/metrics``,
``/healthz`` and ``/readyz`` of the same process and nothing else (the verbs are 404 there),
the verbs' listener is unchanged beside it, it is off unless asked for, and a bad address or
port stops the command with exit 2 naming the setting."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from kubegpu.cli import extender as extender_cli
from kubegpu.config.extender import ExtenderConfig
from kubegpu.testing.apiserver import FakeApiServer
from tests.extender.cluster import (
    filter_args,
    gpu_node,
    http_session,
    post,
    running_extender,
    shared_pod,
)


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


async def test_serves_metrics_and_probes_and_refuses_the_verbs() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a"))
        pod = server.store.put("pods", shared_pod("p", 1024, 100))
        async with (
            running_extender(server, metrics_host="127.0.0.1", metrics_port=0) as ext,
            http_session() as http,
        ):
            metrics = ext.metrics_url
            assert metrics is not None and metrics.startswith("http://127.0.0.1:")
            assert ext.metrics_port not in (None, 0, ext.port)
            # The verbs' listener is the one it always was: filter answers there.
            status, body = await post(http, f"{ext.url}/filter", filter_args(pod, ["node-a"]))
            assert (status, body["NodeNames"]) == (200, ["node-a"])

            async with http.get(f"{metrics}/healthz") as r:
                assert (r.status, await r.text()) == (200, "ok")
            async with http.get(f"{metrics}/readyz") as r:
                assert (r.status, await r.text()) == (200, "ok")
            async with http.get(f"{metrics}/metrics") as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/plain")
                text = await r.text()
            # The same process's counters: the filter made on the other listener is counted.
            decisions = _samples(text, "kubegpu_extender_decisions_total")
            assert decisions[(("outcome", "schedulable"), ("verb", "filter"))] == 1.0

            binding = {
                "PodName": "p",
                "PodNamespace": "default",
                "PodUID": pod["metadata"]["uid"],
                "Node": "node-a",
            }
            for path, payload in (
                ("/filter", filter_args(pod, ["node-a"])),
                ("/prioritize", filter_args(pod, ["node-a"])),
                ("/bind", binding),
            ):
                async with http.post(f"{metrics}{path}", json=payload) as r:
                    assert r.status == 404, path
                async with http.get(f"{metrics}{path}") as r:
                    assert r.status == 404, path
            async with http.get(f"{metrics}/") as r:
                assert r.status == 404
        stored = server.store.get("pods", "default", "p")
        assert stored is not None and stored["spec"].get("nodeName") is None  # nothing bound


async def test_off_unless_a_metrics_port_is_set() -> None:
    assert ExtenderConfig().metrics_port is None
    async with FakeApiServer() as server, running_extender(server) as ext:
        assert ext.metrics_url is None and ext.metrics_port is None


@pytest.fixture
def resolved(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run the real command up to the point where it would serve: (exit code, output, the
    resolved config or None)."""

    def run(
        args: list[str], env: dict[str, str] | None = None
    ) -> tuple[int, str, ExtenderConfig | None]:
        seen: list[ExtenderConfig] = []

        async def capture(config: ExtenderConfig) -> None:
            seen.append(config)

        monkeypatch.setattr(extender_cli, "_serve", capture)
        # The prefix `kubegpu extender` gets from the root command.
        result = CliRunner().invoke(
            extender_cli.extender_command, args, env=env, auto_envvar_prefix="KUBEGPU_EXTENDER"
        )
        return result.exit_code, result.output, seen[0] if seen else None

    return run


def test_the_metrics_settings_take_flag_over_environment_over_file(
    tmp_path: Path, resolved: Any
) -> None:
    settings = tmp_path / "extender.yaml"
    settings.write_text(
        "apiVersion: kubegpu.io/v1alpha1\nkind: ExtenderConfig\n"
        "settings:\n  metrics-host: 0.0.0.0\n  metrics-port: 9402\n  leader-lease: none\n"
    )
    code, output, config = resolved(["--config", str(settings)])
    assert code == 0, output
    assert (config.metrics_host, config.metrics_port) == ("0.0.0.0", 9402)
    env = {"KUBEGPU_EXTENDER_METRICS_PORT": "9500", "KUBEGPU_EXTENDER_METRICS_HOST": "::"}
    _, _, config = resolved(["--config", str(settings)], env)
    assert (config.metrics_host, config.metrics_port) == ("::", 9500)
    _, _, config = resolved(["--config", str(settings), "--metrics-port", "9600"], env)
    assert (config.metrics_host, config.metrics_port) == ("::", 9600)


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--metrics-port", "70000"], {}, "--metrics-port"),
        (["--metrics-port", "-1"], {}, "--metrics-port"),
        ([], {"KUBEGPU_EXTENDER_METRICS_PORT": "metrics"}, "--metrics-port"),
        (["--metrics-port", "9402", "--metrics-host", "metrics.example"], {}, "metrics-host"),
        (["--metrics-port", "9402", "--metrics-host", "10.0.0.300"], {}, "metrics-host"),
        (["--port", "9402", "--metrics-port", "9402"], {}, "metrics-port 9402 is also port"),
        (
            ["--host", "0.0.0.0", "--allow-insecure-http", "--port", "9402"],
            {"KUBEGPU_EXTENDER_METRICS_PORT": "9402"},
            "metrics-port 9402 is also port",
        ),
    ],
)
def test_a_bad_metrics_setting_exits_2_naming_it(
    args: list[str], env: dict[str, str], named: str, resolved: Any
) -> None:
    code, output, config = resolved(args, env)
    assert code == 2, output
    assert named in output
    assert config is None


def test_a_bad_metrics_port_in_the_settings_file_exits_2(tmp_path: Path, resolved: Any) -> None:
    settings = tmp_path / "extender.yaml"
    settings.write_text(
        "apiVersion: kubegpu.io/v1alpha1\nkind: ExtenderConfig\nsettings:\n  metrics-port: 99999\n"
    )
    code, output, _ = resolved(["--config", str(settings)])
    assert code == 2 and "metrics-port" in output


def test_a_metrics_port_already_taken_stops_the_process_with_exit_2(tmp_path: Path) -> None:
    # A real process and a real occupied port: the verbs' listener opened first is closed
    # again and the process exits 2 naming the setting, instead of serving without metrics.
    with FakeApiServer().run_in_thread() as api, socket.socket() as taken:
        api.store.put("nodes", gpu_node("node-a"))
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("KUBEGPU_") and k.lower() not in ("http_proxy", "https_proxy")
        }
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "kubegpu",
                "extender",
                f"--kubeconfig={kubeconfig}",
                "--port=0",
                f"--metrics-port={busy}",
                "--leader-lease=none",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "NO_PROXY": "*"},
        )
    assert result.returncode == 2, result.stderr
    assert f"metrics-host/metrics-port 127.0.0.1:{busy}: cannot listen there" in result.stderr
    assert "Traceback" not in result.stderr
