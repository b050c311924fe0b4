"""NVIDIA's own expectations of GPU Feature Discovery's labels, held against what the labeller
writes for fake nodes: every label NVIDIA's tests look for is there and looks as GFD writes it.

The patterns are NVIDIA's (``kubegpu.testing.gfd_labels`` names the files and the commit);
the end-to-end suite holds the real Node to the same check (``e2e/tests/test_06_*``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kubegpu.core.health import HealthCheckPolicy
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.labels.catalogue import (
    COMPUTE_MAJOR,
    COMPUTE_MINOR,
    FAMILY,
    MEMORY,
    PRODUCT,
    SharingSummary,
    compute_labels,
)
from kubegpu.labels.sinks import parse_feature_file
from kubegpu.roles.labeller import run_labeller
from kubegpu.testing.gfd_labels import E2E_LABEL_PATTERNS, EXPECTED_OUTPUT, gfd_label_gaps

from .memory_sink import MemorySink

UNIFORM_PRESETS = ["16xH100-80GB", "8xA100-80GB-NVLink", "8xV100-32GB-HybridCubeMesh", "4xT4"]
SHIPPED_CONFIG = Path(__file__).parents[2] / "deploy" / "base" / "node-agent-config.yaml"

SHARINGS = {
    "unshared": SharingSummary(),
    "time-sliced": SharingSummary("time-slicing", replicas=4),
    "gpu-share-mps": SharingSummary("mps"),
}


def labelled(preset: str, sharing: SharingSummary, machine_type_file: Path) -> dict[str, str]:
    """What the labeller's role writes once for a fake node."""
    sink = MemorySink()
    code = run_labeller(
        FakeGpuBackend.from_spec(preset),
        sink,
        sharing,
        HealthCheckPolicy(),
        node_name="gpu-a",
        sink_name="memory",
        once=True,
        timestamp=True,
        interval_s=60.0,
        poll_s=10.0,
        wait_for_stop=lambda: None,
        machine_type_file=machine_type_file,
    )
    assert code == 0
    return sink.labels


@pytest.fixture
def machine_type_file(tmp_path: Path) -> Path:
    path = tmp_path / "product_name"
    path.write_text("ProLiant XL675d Gen10 Plus\n")
    return path


@pytest.mark.parametrize("sharing", SHARINGS.values(), ids=SHARINGS.keys())
@pytest.mark.parametrize("preset", UNIFORM_PRESETS)
def test_a_one_model_node_has_every_label_nvidia_expects_as_gfd_writes_it(
    preset: str, sharing: SharingSummary, machine_type_file: Path
) -> None:
    labels = labelled(preset, sharing, machine_type_file)
    assert gfd_label_gaps(labels) == {}
    assert labels["nvidia.com/gpu.machine"] == "ProLiant-XL675d-Gen10-Plus"


def test_kubegpu_labels_writes_what_nvidia_expects(machine_type_file: Path) -> None:
    # The command as the end-to-end suite runs it: the shipped agent config (gpuShare on).
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubegpu",
            "labels",
            "--backend=fake",
            "--fake-gpus=8xA100-80GB-NVLink",
            f"--config={SHIPPED_CONFIG}",
            f"--machine-type-file={machine_type_file}",
            "--sink=stdout",
            "--once",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    labels = parse_feature_file(done.stdout)
    assert gfd_label_gaps(labels) == {}
    # Fake GPUs have no PCI class to read: GFD's own value when it cannot read one.
    assert labels["nvidia.com/gpu.mode"] == "unknown"


def test_a_mixed_node_differs_only_where_gfd_would_pick_one_models_facts(
    machine_type_file: Path,
) -> None:
    # Deliberate (catalogue's docstring, gpu-feature-discovery#66): a fact the models disagree
    # on is left out, where GFD writes whichever model its map iteration ends on.
    labels = labelled("2xV100-2xT4", SharingSummary(), machine_type_file)
    assert gfd_label_gaps(labels) == dict.fromkeys(
        (PRODUCT, MEMORY, FAMILY, COMPUTE_MAJOR, COMPUTE_MINOR), "missing"
    )


def test_nvidias_patterns_are_all_checked() -> None:
    # The golden file names every label of the e2e map, with the same pattern.
    golden = {line.partition("=")[0].replace("\\", ""): line for line in EXPECTED_OUTPUT}
    for key, pattern in E2E_LABEL_PATTERNS.items():
        assert golden[key].endswith("=" + pattern)
    assert len(golden) == 25


GOOD = compute_labels(
    FakeGpuBackend.from_spec("8xA100-80GB-NVLink").snapshot(), now=1_767_225_600.0
)


@pytest.mark.parametrize(
    ("key", "value", "gap"),
    [
        ("nvidia.com/gpu.mode", None, "missing"),
        ("nvidia.com/cuda.driver-version.full", None, "missing"),
        ("nvidia.com/gfd.timestamp", "1767225", "'1767225' does not match '[0-9]{10}'"),
        ("nvidia.com/gpu.product", "1234", "'1234' does not match '[A-Za-z_-]+'"),
        # Values NVIDIA's character classes let through, but GFD never writes.
        ("nvidia.com/mig.capable", "enabled", "'enabled' is not GFD's form 'true|false'"),
        (
            "nvidia.com/gpu.sharing-strategy",
            "timeslicing",
            "'timeslicing' is not GFD's form 'none|mps|time-slicing'",
        ),
        ("nvidia.com/gpu.memory", "80 GiB", "'80 GiB' is not GFD's form '[0-9]+'"),
        ("nvidia.com/gpu.bogus", "1", "not a label GFD writes on a GPU without MIG"),
    ],
    ids=lambda v: str(v),
)
def test_the_check_finds_a_missing_or_malformed_label(
    key: str, value: str | None, gap: str
) -> None:
    assert gfd_label_gaps(GOOD) == {}
    broken = {k: v for k, v in GOOD.items() if k != key}
    if value is not None:
        broken[key] = value
    assert gfd_label_gaps(broken) == {key: gap}
