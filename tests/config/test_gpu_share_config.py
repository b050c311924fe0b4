"""The sharing.gpuShare block: defaults, validation, and the CLI refusing it without API."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kubegpu.cli.main import cli
from kubegpu.config import ConfigError, load_config
from kubegpu.sharing.resources import DEFAULT_GPU_COMPUTE, DEFAULT_GPU_MEMORY, DEFAULT_SHARE_SLOT


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_defaults_match_the_cluster_side_resource_names() -> None:
    share = load_config().sharing.gpu_share
    assert not share.enabled
    assert share.resource_name == DEFAULT_SHARE_SLOT
    assert share.memory_resource_name == DEFAULT_GPU_MEMORY
    assert share.compute_resource_name == DEFAULT_GPU_COMPUTE
    assert share.enforcement == "none"
    assert share.mps.control_args == ["-f"]


def test_a_full_block_loads(tmp_path: Path) -> None:
    text = """
sharing:
  gpuShare:
    enabled: true
    slotsPerCard: 8
    devices: [0, 2]
    enforcement: mps
    mps: {controlCommand: /opt/mps-control, hostDir: /run/x}
"""
    share = load_config(write(tmp_path, text)).sharing.gpu_share
    assert (share.slots_per_card, share.devices, share.enforcement) == (8, [0, 2], "mps")
    assert share.mps.control_command == "/opt/mps-control"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "sharing: {gpuShare: {slotsPerCard: 0}}",
            "sharing.gpuShare.slotsPerCard",
            id="no-slots",
        ),
        pytest.param(
            "sharing: {gpuShare: {enforcement: hami}}",
            "sharing.gpuShare.enforcement",
            id="unknown-enforcement",
        ),
        pytest.param(
            "sharing: {gpuShare: {resourceName: shared}}",
            "needs a domain",
            id="share-name-without-domain",
        ),
        pytest.param(
            "sharing: {gpuShare: {enabled: true, wholeResourceName: example.com/tpu}}",
            "sharing.gpuShare.wholeResourceName: 'example.com/tpu' is not one of",
            id="unknown-whole-resource",
        ),
        pytest.param(
            "sharing: {gpuShare: {enabled: true},"
            " timeSlicing: {resources: [{name: gpu, replicas: 2}]}}",
            "card-level sharing needs whole cards",
            id="time-sliced-whole-resource",
        ),
    ],
)
def test_bad_gpu_share_settings_name_the_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(write(tmp_path, text))


def test_gpu_share_without_api_access_exits_2_and_says_why(tmp_path: Path) -> None:
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
            "--gpu-share",
        ],
        env={"KUBERNETES_SERVICE_HOST": ""},
    )
    assert result.exit_code == 2, result.output
    assert "needs API access (--kubeconfig or in-cluster)" in result.output
