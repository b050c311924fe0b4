"""The shipped KubeSchedulerConfiguration files reference exactly what the code serves: the URL
paths of the extender's routes, the resource names it manages, and the settings kube-scheduler's
validation requires."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from aiohttp import web

from kubegpu.extender.config import ExtenderConfig, load_config_file
from kubegpu.extender.scheduler import GpuScheduler
from kubegpu.extender.server import ExtenderApp
from kubegpu.kube.view import ClusterView
from kubegpu.sharing.resources import ResourceNames

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "scheduler"
CONFIGS = ["kubegpu-scheduler.yaml", "default-scheduler.yaml"]


def served_post_paths() -> set[str]:
    # Routes only: nothing is served or called, so no API client is needed.
    view = ClusterView(cast(Any, None))
    app = ExtenderApp(GpuScheduler(view), client=cast(Any, None))
    application: web.Application = app.application()
    return {
        route.resource.canonical
        for route in application.router.routes()
        if route.method == "POST" and route.resource is not None
    }


def load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / name).read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("name", CONFIGS)
def test_scheduler_config_wires_the_extender_verbs_and_resources(name: str) -> None:
    doc = load(name)
    assert (doc["apiVersion"], doc["kind"]) == (
        "kubescheduler.config.k8s.io/v1",
        "KubeSchedulerConfiguration",
    )
    assert doc["percentageOfNodesToScore"] == 100
    (extender,) = doc["extenders"]
    paths = served_post_paths()
    prefix = extender["urlPrefix"]
    assert not prefix.endswith("/")
    for verb in ("filterVerb", "prioritizeVerb", "bindVerb"):
        assert f"/{extender[verb]}" in paths
    assert extender["weight"] > 0  # required with prioritizeVerb
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is False
    assert re.fullmatch(r"\d+s", extender["httpTimeout"])
    names = ResourceNames()
    managed = {r["name"]: r["ignoredByScheduler"] for r in extender["managedResources"]}
    assert managed == {
        names.whole_gpu: False,
        names.share_slot: False,
        names.gpu_memory: True,
        names.gpu_compute: True,
    }
    host = re.match(r"(https?)://([^:/]+):(\d+)$", prefix)
    assert host is not None
    scheme, address, _port = host.groups()
    assert extender["enableHTTPS"] is (scheme == "https")
    # What the extender would have to be started with to accept this scheduler's calls.
    ExtenderConfig(
        host=address,
        allow_insecure_http=False,
        tls_cert_file=Path("s.crt") if scheme == "https" else None,
        tls_key_file=Path("s.key") if scheme == "https" else None,
    ).validate()


def test_second_profile_is_named_kubegpu_scheduler_and_default_config_keeps_the_default() -> None:
    assert [p["schedulerName"] for p in load("kubegpu-scheduler.yaml")["profiles"]] == [
        "kubegpu-scheduler"
    ]
    default = load("default-scheduler.yaml")
    assert [p["schedulerName"] for p in default["profiles"]] == ["default-scheduler"]
    tls = default["extenders"][0]["tlsConfig"]
    assert tls["insecure"] is False and {"caFile", "certFile", "keyFile"} <= set(tls)


def test_extender_settings_file_loads_into_a_valid_config() -> None:
    settings = load_config_file(DEPLOY / "extender-config.yaml")
    names = ResourceNames(
        settings["whole_gpu_resource"],
        settings["gpu_memory_resource"],
        settings["gpu_compute_resource"],
        settings["share_slot_resource"],
    )
    config = ExtenderConfig(
        host=settings["host"], port=settings["port"], policy=settings["policy"], names=names
    )
    config.validate()
    assert config.names == ResourceNames()


def test_rbac_grants_only_reads_pod_patches_and_bindings() -> None:
    # The one definition every overlay binds (tests/deploy checks the bindings).
    role = yaml.safe_load((DEPLOY.parent / "base" / "extender-clusterrole.yaml").read_text())
    assert role["kind"] == "ClusterRole"
    grants = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert grants == {
        ("nodes", "get"),
        ("nodes", "list"),
        ("nodes", "watch"),
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods", "patch"),
        ("pods/binding", "create"),
    }
