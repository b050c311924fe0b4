"""Our copies of the kubelet's DRA and plugin-registration protos are the official files.

The official files are read from the Go module cache, at the version of ``k8s.io/kubelet`` that
e2e/components pins; .ci/run fetches it there (``go mod download k8s.io/kubelet`` in
e2e/components) before the unit tests, and under CI a missing module fails these tests rather
than skipping them (tests/tools.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kubegpu.dra.api.dra.v1 import api_pb2 as dra_v1
from kubegpu.dra.api.dra.v1beta1 import api_pb2 as dra_v1beta1
from kubegpu.dra.api.dra_health.v1alpha1 import api_pb2 as health
from kubegpu.dra.api.pluginregistration.v1 import api_pb2 as reg
from kubegpu.kubelet import protogen
from tests.tools import missing

REPO = Path(__file__).resolve().parents[2]
COMPONENTS_GO_MOD = REPO / "e2e" / "components" / "go.mod"
# sha256 of k8s.io/kubelet@v0.35.4 pkg/apis/<dir>/api.proto (the pinned Kubernetes, v1.35.4).
KUBELET_VERSION = "v0.35.4"


def module_cache() -> Path:
    """Where ``go`` keeps modules: ``go env GOMODCACHE`` (it honours GOMODCACHE and GOPATH)."""
    go = shutil.which("go")
    if go is not None:
        found = subprocess.run(
            [go, "env", "GOMODCACHE"], capture_output=True, text=True, timeout=60, check=False
        ).stdout.strip()
        if found:
            return Path(found)
    if os.environ.get("GOMODCACHE"):
        return Path(os.environ["GOMODCACHE"])
    gopath = os.environ.get("GOPATH", "").split(os.pathsep)[0]
    return Path(gopath or Path.home() / "go") / "pkg" / "mod"


def kubelet_module() -> Path:
    return module_cache() / f"k8s.io/kubelet@{KUBELET_VERSION}" / "pkg" / "apis"


OFFICIAL_SHA256 = {
    "dra/v1": "b3066ad7f6abcfd0003c47b06ceb801d76997d78d6be505597478d3905b9cc57",
    "dra/v1beta1": "7900b11793ad897d0375d67b3bbae675869b574e21dfb1bf5334cc1556138c42",
    "pluginregistration/v1": "7a67a0000a1a167c155286834bc9ccb489f8bcdb394e006daba270189c272afa",
    "dra_health/v1alpha1": "43edf7c6922305a273cb7fdc5aac40f1aaeeb53c82ec39d538f6324f38b51293",
}


def ours(api: str) -> Path:
    return protogen.SOURCE_ROOT / "kubegpu/dra/api" / api / "api.proto"


@pytest.mark.parametrize("api", sorted(OFFICIAL_SHA256))
def test_committed_proto_has_the_recorded_official_sha256(api: str) -> None:
    assert hashlib.sha256(ours(api).read_bytes()).hexdigest() == OFFICIAL_SHA256[api]


@pytest.mark.parametrize("api", sorted(OFFICIAL_SHA256))
def test_recorded_sha256_is_that_of_the_module_cache_file(api: str) -> None:
    # Python packages cannot have a dash: our dra_health is the module's dra-health.
    official = kubelet_module() / api.replace("_", "-") / "api.proto"
    if not official.exists():
        missing(
            f"{official} is not in the Go module cache",
            "cd e2e/components && go mod download k8s.io/kubelet (.ci/run does)",
        )
    assert hashlib.sha256(official.read_bytes()).hexdigest() == OFFICIAL_SHA256[api]
    assert ours(api).read_bytes() == official.read_bytes()


def test_the_kubelet_version_read_is_the_one_the_e2e_components_pin() -> None:
    # .ci/run downloads k8s.io/kubelet at e2e/components' version: the one read here.
    text = COMPONENTS_GO_MOD.read_text(encoding="utf-8")
    pinned = re.findall(r"^\s*k8s\.io/kubelet => k8s\.io/kubelet (v\S+)", text, re.MULTILINE)
    assert pinned == [KUBELET_VERSION]


def test_ci_fetches_the_kubelet_module_before_the_unit_tests() -> None:
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    fetch = script.index("(cd e2e/components && go mod download k8s.io/kubelet)")
    assert fetch < script.index(".venv/bin/pytest")


@pytest.mark.parametrize("api", sorted(OFFICIAL_SHA256))
def test_new_protos_are_generated_by_protogen(api: str) -> None:
    # The staleness test in tests/kubelet_api regenerates everything in PROTO_FILES.
    assert f"kubegpu/dra/api/{api}/api.proto" in protogen.PROTO_FILES


def test_wire_names_are_the_kubelets() -> None:
    assert dra_v1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    )
    assert dra_v1beta1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    )
    assert reg.DESCRIPTOR.services_by_name["Registration"].full_name == (
        "pluginregistration.Registration"
    )
    assert dra_v1.Device.DESCRIPTOR.fields_by_name["share_id"].number == 5
    assert dra_v1.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence
    assert "share_id" not in dra_v1beta1.Device.DESCRIPTOR.fields_by_name
    assert health.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name == (
        "v1alpha1.DRAResourceHealth"
    )
