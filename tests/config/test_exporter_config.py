"""``exporter``: the Prometheus exporter inside the node agent, checked when the config loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kubegpu.cli.main import cli
from kubegpu.config.load import ConfigError, load_config


def test_the_exporter_is_off_by_default_and_asks_the_kubelet_when_on() -> None:
    exporter = load_config(None).exporter
    assert not exporter.enabled
    assert exporter.listen == "127.0.0.1:9400"
    assert exporter.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert exporter.pod_directory == "logs"


def test_a_bad_listen_address_names_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, {"exporter.listen": "9400"})
    assert err.value.field == "exporter.listen"
    assert "expected HOST:PORT" in str(err.value)


@pytest.mark.parametrize(
    ("metrics", "probes"),
    [("0.0.0.0:9401", "0.0.0.0:9401"), ("0.0.0.0:9401", "127.0.0.1:9401"), (":9401", "[::]:9401")],
    ids=["same", "wildcard-and-loopback", "both-wildcards"],
)
def test_the_exporter_may_not_share_the_health_endpoints_port(metrics: str, probes: str) -> None:
    overrides = {
        "exporter.enabled": True,
        "exporter.listen": metrics,
        "flags.healthListen": probes,
    }
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert "exporter.listen" in str(err.value)
    assert "is also flags.healthListen" in str(err.value)


@pytest.mark.parametrize(
    ("enabled", "metrics", "probes"),
    [
        (True, "0.0.0.0:9400", "0.0.0.0:9401"),
        (True, "127.0.0.1:0", "127.0.0.1:0"),
        (True, "127.0.0.1:9401", "127.0.0.2:9401"),
        (False, "0.0.0.0:9401", "0.0.0.0:9401"),
    ],
    ids=["other-port", "both-free-ports", "other-addresses", "exporter-off"],
)
def test_ports_that_cannot_collide_are_accepted(enabled: bool, metrics: str, probes: str) -> None:
    overrides = {
        "exporter.enabled": enabled,
        "exporter.listen": metrics,
        "flags.healthListen": probes,
    }
    assert load_config(None, overrides).exporter.listen == metrics


def test_pods_from_the_api_without_api_access_exits_2_and_says_why(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "device-plugin",
            "--backend",
            "fake",
            "--fake-gpus",
            "4xT4",
            "--kubelet-dir",
            str(tmp_path / "dp"),
            "--node-name",
            "n1",
            "--exporter",
            "--exporter-pod-directory",
            "api",
        ],
        env={"KUBERNETES_SERVICE_HOST": ""},
    )
    assert result.exit_code == 2, result.output
    assert "exporter.podDirectory: api needs API access" in result.output
