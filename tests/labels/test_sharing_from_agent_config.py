"""``kubegpu labels --config``: GFD's sharing labels come from the node agent's own config file,
so they say what the device plugin advertises; flags still override the file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu.config.load import load_config
from kubegpu.config.model import DEFAULT_RESOURCE
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.labels.catalogue import compute_labels, sharing_from_config
from kubegpu.testing.kubelet import KubeletEmulator
from tests.kubelet.conftest import PluginProcess, short_tempdir

TIME_SLICED = (
    "version: v1\n"
    "sharing:\n"
    "  timeSlicing:\n"
    "    resources:\n"
    "      - name: nvidia.com/gpu\n"
    "        replicas: 3\n"
)

LABELS = (sys.executable, "-m", "kubegpu", "labels", "--backend=fake", "--fake-gpus=4xT4")


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def labels(*args: str, env: dict[str, str] | None = None) -> dict[str, str]:
    done = subprocess.run(
        [*LABELS, "--once", "--no-timestamp", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("KUBEGPU_")},
            **(env or {}),
        },
    )
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


def test_sharing_labels_say_what_the_device_plugin_advertises_from_the_same_file(
    root: Path,
) -> None:
    config = root / "config.yaml"
    config.write_text(TIME_SLICED)
    kubelet_dir = root / "dp"
    with KubeletEmulator(kubelet_dir) as kubelet:
        plugin = PluginProcess(kubelet_dir, preset="4xT4", config=config)
        try:
            kubelet.wait_for_devices(DEFAULT_RESOURCE, lambda d: len(d) > 0, timeout_s=30)
            advertised = len(kubelet.devices(DEFAULT_RESOURCE))
        finally:
            assert plugin.stop() == 0
    found = labels(f"--config={config}")
    assert found["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert int(found["nvidia.com/gpu.replicas"]) * int(found["nvidia.com/gpu.count"]) == advertised
    assert advertised == 12


def test_the_config_file_comes_from_the_device_plugins_environment_variables_too(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(TIME_SLICED)
    for name in ("KUBEGPU_CONFIG", "CONFIG_FILE"):  # ours, then NVIDIA's
        found = labels(env={name: str(config)})
        assert found["nvidia.com/gpu.replicas"] == "3", name


def test_flags_override_each_sharing_label_from_the_file(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(TIME_SLICED)
    found = labels(f"--config={config}", "--sharing-strategy=mps")
    assert (found["nvidia.com/gpu.sharing-strategy"], found["nvidia.com/gpu.replicas"]) == (
        "mps",
        "3",
    )
    found = labels(f"--config={config}", "--replicas=1")
    assert (found["nvidia.com/gpu.sharing-strategy"], found["nvidia.com/gpu.replicas"]) == (
        "time-slicing",
        "1",
    )


def test_without_a_file_or_flags_nothing_is_shared() -> None:
    found = labels()
    assert (found["nvidia.com/gpu.sharing-strategy"], found["nvidia.com/gpu.replicas"]) == (
        "none",
        "1",
    )


SHIPPED_CONFIG = Path(__file__).parents[2] / "deploy" / "base" / "node-agent-config.yaml"


def gpu_share_config(enforcement: str, *, time_sliced: str | None = None) -> str:
    text = (
        "version: v1\n"
        "sharing:\n"
        "  gpuShare:\n"
        "    enabled: true\n"
        f"    enforcement: {enforcement}\n"
        "    slotsPerCard: 8\n"
    )
    if time_sliced is not None:
        # A second GPU resource, time-sliced, beside the whole cards gpuShare accounts on.
        text = text.replace(
            "sharing:\n",
            "resources:\n"
            "  gpus:\n"
            "    - pattern: '*T4*'\n"
            "      name: nvidia.com/gpu\n"
            "    - pattern: '*'\n"
            f"      name: {time_sliced}\n"
            "sharing:\n"
            "  timeSlicing:\n"
            "    resources:\n"
            f"      - name: {time_sliced}\n"
            "        replicas: 3\n",
        )
    return text


@pytest.mark.parametrize(
    ("enforcement", "strategy"),
    [("none", "time-slicing"), ("mps", "mps")],
    ids=["unenforced-pods-time-slice", "mps"],
)
def test_gpu_share_is_reported_as_the_gfd_strategy_it_behaves_like(
    tmp_path: Path, enforcement: str, strategy: str
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(gpu_share_config(enforcement))
    found = labels(f"--config={config}")
    assert found["nvidia.com/gpu.sharing-strategy"] == strategy
    # gpuShare adds slots beside nvidia.com/gpu; it does not replicate nvidia.com/gpu itself.
    assert found["nvidia.com/gpu.replicas"] == "1"
    assert found["kubegpu.io/gpu-share"] == "true"
    assert found["kubegpu.io/gpu-share.enforcement"] == enforcement
    assert found["kubegpu.io/gpu-share.slots"] == "8"


def test_the_shipped_config_labels_its_cards_as_shared() -> None:
    # deploy/ turns gpuShare on: a node labelled sharing-strategy=none would lie to a selector
    # looking for unshared cards.
    found = labels(f"--config={SHIPPED_CONFIG}")
    assert found["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert (found["kubegpu.io/gpu-share"], found["kubegpu.io/gpu-share.enforcement"]) == (
        "true",
        "none",
    )
    assert found["kubegpu.io/gpu-share.slots"] == "32"  # the default slotsPerCard


def test_gpu_share_with_time_slicing_keeps_the_replicas_and_mps_wins_the_strategy(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(gpu_share_config("mps", time_sliced="nvidia.com/gpu-sliced"))
    found = labels(f"--config={config}")
    assert found["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert found["nvidia.com/gpu.replicas"] == "3"


def test_without_gpu_share_the_node_says_so(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(TIME_SLICED)
    found = labels(f"--config={config}")
    assert found["kubegpu.io/gpu-share"] == "false"
    assert "kubegpu.io/gpu-share.enforcement" not in found
    assert "kubegpu.io/gpu-share.slots" not in found


def time_sliced(resource: str, replicas: int, *, rename: str = "", by_default: bool = False) -> str:
    return (
        "version: v1\n"
        "sharing:\n"
        "  timeSlicing:\n"
        f"    renameByDefault: {str(by_default).lower()}\n"
        "    resources:\n"
        f"      - name: {resource}\n"
        f"        replicas: {replicas}\n" + (f"        rename: {rename}\n" if rename else "")
    )


@pytest.mark.parametrize(
    ("text", "strategy", "product"),
    [
        (TIME_SLICED, "time-slicing", "Tesla-T4-SHARED"),
        (time_sliced("nvidia.com/gpu", 1), "none", "Tesla-T4"),
        (
            time_sliced("nvidia.com/gpu", 3, rename="nvidia.com/gpu.shared"),
            "time-slicing",
            "Tesla-T4",
        ),
        (time_sliced("nvidia.com/gpu", 3, by_default=True), "time-slicing", "Tesla-T4"),
    ],
    ids=["as-nvidia-gpu", "one-replica", "renamed", "rename-by-default"],
)
def test_the_product_says_shared_as_gfds_does_when_nvidia_gpu_itself_is_replicated(
    tmp_path: Path, text: str, strategy: str, product: str
) -> None:
    # GFD's rule: more than one replica of nvidia.com/gpu under its own name makes the product
    # <product>-SHARED and the strategy the configured one; one replica shares nothing.
    config = tmp_path / "config.yaml"
    config.write_text(text)
    sharing = sharing_from_config(load_config(config))
    labels = compute_labels(resolve_fake_spec("4xT4").inventory, sharing=sharing)
    assert (labels["nvidia.com/gpu.sharing-strategy"], labels["nvidia.com/gpu.product"]) == (
        strategy,
        product,
    )
