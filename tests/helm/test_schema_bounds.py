"""Every number the chart takes has a minimum and a maximum in values.schema.json, and the
maxima are the ones the code's own limits give (a quota no cluster can reach is a typo).

Checked with a JSON Schema validator of the draft the schema names (helm's own check of
``--set`` and ``-f`` values), and with the real helm when one is found.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from kubegpu.config.model import MAX_SLOTS_PER_CARD, MAX_VOLCANO_MEMORY_FACTOR
from tests.tools import missing

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "kubegpu"
HUGE = 10**30


def _schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text("utf-8"))
    return loaded


def _values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text("utf-8"))
    return loaded


def numbers(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if node.get("type") in ("integer", "number"):
        found.append((path, node))
    for key, child in node.get("properties", {}).items():
        found += numbers(child, f"{path}.{key}" if path else key)
    return found


def _with(values: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    changed = copy.deepcopy(values)
    *parents, leaf = path.split(".")
    node = changed
    for key in parents:
        node = node[key]
    node[leaf] = value
    return changed


def test_every_number_of_the_chart_has_a_minimum_and_a_maximum() -> None:
    found = numbers(_schema())
    assert len(found) >= 5  # peerCompat.replicas and the four quota figures at least
    unbounded = [p for p, node in found if "minimum" not in node or "maximum" not in node]
    assert not unbounded, f"values without both bounds: {unbounded}"


def test_the_schema_refuses_a_number_past_each_maximum_and_takes_the_defaults() -> None:
    schema, values = _schema(), _values()
    validator = jsonschema.Draft7Validator(schema)
    assert list(validator.iter_errors(values)) == []
    for path, node in numbers(schema):
        for bad in (HUGE, node["maximum"] + 1, node["minimum"] - 1):
            errors = list(validator.iter_errors(_with(values, path, bad)))
            assert errors, f"{path}: {bad} is accepted"
        assert list(validator.iter_errors(_with(values, path, node["maximum"]))) == [], path


def test_the_quota_maxima_follow_the_code_s_limits() -> None:
    quota = _schema()["properties"]["quotaExample"]["properties"]
    cards = quota["gpus"]["maximum"]
    # A card holds at most MAX_SLOTS_PER_CARD sharing containers, 1000 milli-GPU, and as much
    # memory as the largest card (MAX_VOLCANO_MEMORY_FACTOR MiB: one unit may not exceed it).
    assert quota["sharedContainers"]["maximum"] == cards * MAX_SLOTS_PER_CARD
    assert quota["gpuComputeMilli"]["maximum"] == cards * 1000
    assert quota["gpuMemoryMiB"]["maximum"] == cards * MAX_VOLCANO_MEMORY_FACTOR


def _helm() -> str | None:
    named = os.environ.get("KUBEGPU_E2E_HELM")
    if named and Path(named).is_file():
        return named
    cached = sorted(glob.glob(str(Path.home() / ".cache/kubegpu-e2e/helm-*/bin/helm")))
    return cached[-1] if cached else shutil.which("helm")


def test_large_quota_figures_from_a_values_file_render_as_plain_digits(tmp_path: Path) -> None:
    """helm reads numbers from a values file as floats and prints 2.62144e+07 unless the
    template converts them: a quantity the admin never wrote."""
    helm = _helm()
    if helm is None:
        missing("no helm binary", "e2e/components/helm/build.sh builds it; .ci/run does first")
    values = tmp_path / "values.yaml"
    values.write_text(
        "quotaExample: {enabled: true, namespace: team-a, gpus: 1000,"
        " gpuMemoryMiB: 26214400, gpuComputeMilli: 1000000, sharedContainers: 16000}\n"
    )
    done = subprocess.run(
        [
            helm,
            "template",
            "t",
            str(CHART),
            "-f",
            str(values),
            "--show-only",
            "templates/quota-example.yaml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    hard = yaml.safe_load(done.stdout)["spec"]["hard"]
    assert hard == {
        "requests.nvidia.com/gpu": "1000",
        "requests.kubegpu.io/gpu-memory": "26214400",
        "requests.kubegpu.io/gpu-compute": "1000000",
        "requests.kubegpu.io/gpu-shared": "16000",
    }


def test_helm_itself_refuses_a_number_past_the_maximum() -> None:
    helm = _helm()
    if helm is None:
        missing("no helm binary", "e2e/components/helm/build.sh builds it; .ci/run does first")
    for path, node in numbers(_schema()):
        done = subprocess.run(
            [helm, "template", "t", str(CHART), "--set", f"{path}={node['maximum'] + 1}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode != 0, f"helm took {path}={node['maximum'] + 1}"
        assert "maximum" in done.stderr and path.split(".")[-1] in done.stderr, done.stderr
