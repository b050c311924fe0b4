"""The shipped KubeSchedulerConfiguration files reference exactly what the code serves: the URL
paths of the extender's routes, the resource names it manages, and the settings kube-scheduler's
validation requires; and the extender's RBAC in each overlay allows every request it really makes
there, Lease read included."""

from __future__ import annotations

import os
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from aiohttp import web

from kubegpu.cli.extender import settings_keys
from kubegpu.config.extender import ExtenderConfig, load_config_file
from kubegpu.extender.scheduler import GpuScheduler
from kubegpu.extender.server import ExtenderApp
from kubegpu.kube.view import ClusterView
from kubegpu.sharing.resources import ResourceNames
from kubegpu.testing.apiserver import FakeApiServer
from tests.deploy.rbac import allowed, rbac_rules
from tests.extender.cluster import gpu_node, http_session, post, running_extender, whole_pod

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "scheduler"
OVERLAYS = DEPLOY.parent / "overlays"
CONFIGS = ["kubegpu-scheduler.yaml", "default-scheduler.yaml"]


def served_post_paths() -> set[str]:
    # Routes only: nothing is served or called, so no API client is needed.
    view = ClusterView(cast(Any, None))
    app = ExtenderApp(GpuScheduler(view), pods=cast(Any, None))
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
    extender = doc["extenders"][0]
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


def test_the_second_profile_also_asks_the_extender_to_rank_dra_nodes() -> None:
    # kube-scheduler sends an extender only the pods requesting one of its managedResources,
    # or every pod when it lists none: DRA pods request none of ours, so the extender is named
    # again without any, to score only. Not in the default scheduler's config (opt-in there:
    # every pod of the cluster would be sent, docs/dra.md).
    doc = load("kubegpu-scheduler.yaml")
    main, dra = doc["extenders"]
    assert f"/{dra['prioritizeVerb']}" in served_post_paths()
    assert dra["prioritizeVerb"] == "prioritize-dra"
    assert dra["urlPrefix"] == main["urlPrefix"]
    assert dra["enableHTTPS"] is main["enableHTTPS"]
    assert dra["nodeCacheCapable"] is main["nodeCacheCapable"]
    # Scores only: the one bind stays with the main entry (kube-scheduler allows one binder),
    # and no filter, since DRA's allocator decides what fits.
    assert "bindVerb" not in dra and "filterVerb" not in dra and "preemptVerb" not in dra
    assert "managedResources" not in dra
    assert dra["ignorable"] is True and dra["weight"] == main["weight"]
    assert re.fullmatch(r"\d+s", dra["httpTimeout"])
    assert [e["prioritizeVerb"] for e in load("default-scheduler.yaml")["extenders"]] == [
        "prioritize"
    ]


def test_second_profile_is_named_kubegpu_scheduler_and_default_config_keeps_the_default() -> None:
    assert [p["schedulerName"] for p in load("kubegpu-scheduler.yaml")["profiles"]] == [
        "kubegpu-scheduler"
    ]
    default = load("default-scheduler.yaml")
    assert [p["schedulerName"] for p in default["profiles"]] == ["default-scheduler"]
    tls = default["extenders"][0]["tlsConfig"]
    assert tls["insecure"] is False and {"caFile", "certFile", "keyFile"} <= set(tls)


def test_extender_settings_file_loads_into_a_valid_config() -> None:
    settings = load_config_file(DEPLOY / "extender-config.yaml", settings_keys())
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


@pytest.mark.parametrize(
    ("extender_config", "scheduler_config"),
    [
        (DEPLOY / "extender-config.yaml", DEPLOY / "kubegpu-scheduler.yaml"),
        *(
            (OVERLAYS / o / "extender-config.yaml", OVERLAYS / o / "kube-scheduler-config.yaml")
            for o in ("second-scheduler", "default-scheduler")
        ),
    ],
    ids=["deploy/scheduler", "second-scheduler", "default-scheduler"],
)
def test_every_shipped_extender_config_binds_only_beside_its_leading_scheduler(
    extender_config: Path, scheduler_config: Path
) -> None:
    # Without a lease two extenders started from one file both bind and over-commit cards:
    # each shipped file names the Lease its kube-scheduler elects with.
    settings = load_config_file(extender_config, settings_keys())
    election = yaml.safe_load(scheduler_config.read_text())["leaderElection"]
    assert election["leaderElect"] is True
    assert settings["leader_lease"] == (
        f"{election['resourceNamespace']}/{election['resourceName']}"
    )


def test_rbac_grants_only_reads_pod_patches_bindings_and_preemption() -> None:
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
        # Its own preemption (kubegpu.extender.preemption): kube-scheduler's steps.
        ("pods", "delete"),
        ("pods/status", "patch"),
        ("poddisruptionbudgets", "list"),
        ("resourceslices", "list"),
        ("resourceslices", "watch"),
        ("resourceclaims", "list"),
        ("resourceclaims", "watch"),
    }


# -- the extender's requests against its RBAC, per overlay ---------------------------------


def kube_scheduler_hostname() -> str:
    """What kube-scheduler's os.Hostname() returns on Linux (it reads this file, else uname),
    the part of its holderIdentity before "_<uuid>"."""
    path = Path("/proc/sys/kernel/hostname")
    return path.read_text().strip() if path.exists() else os.uname().nodename


@pytest.mark.parametrize("overlay", ["second-scheduler", "default-scheduler"])
async def test_every_request_the_extender_makes_is_one_its_rbac_in_the_overlay_allows(
    overlay: str,
) -> None:
    settings = load_config_file(OVERLAYS / overlay / "extender-config.yaml", settings_keys())
    lease = settings["leader_lease"]
    namespace, name = lease.split("/")
    rules = [
        *rbac_rules(DEPLOY.parent / "base" / "extender-clusterrole.yaml"),
        *rbac_rules(OVERLAYS / overlay / "extender-lease-rbac.yaml"),
    ]
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=2))
        server.store.put("pods", whole_pod("a", 1))
        # As kube-scheduler on this host writes it, and the extender left to its default
        # identity (the overlays set none).
        holder = f"{kube_scheduler_hostname()}_{uuid.uuid4()}"
        server.store.put(
            "leases",
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "holderIdentity": holder,
                    "leaseDurationSeconds": 15,
                    "renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                },
            },
        )
        assert "leader_identity" not in settings
        async with running_extender(server, leader_lease=lease) as ext, http_session() as http:
            pod = server.store.get("pods", "default", "a")
            assert pod is not None
            body = {
                "PodName": "a",
                "PodNamespace": "default",
                "PodUID": pod["metadata"]["uid"],
                "Node": "node-a",
            }
            status, answer = await post(http, f"{ext.url}/bind", body)
        assert (status, answer["Error"]) == (200, "")
        requests = list(server.request_log)
    made = {(r.verb, r.resource, r.namespace, r.name) for r in requests}
    # The bind really went through the gate and to the API server: the Lease read, the
    # decision and the Binding (the lists and watches of the cluster view are checked below).
    assert ("get", "leases", namespace, name) in made
    assert ("create", "pods/binding", "default", "a") in made  # the decision rides on it
    assert [r for r in requests if not allowed(rules, r)] == []
    # The check can fail: without this overlay's Role, or with the other overlay's (another
    # Lease), the Lease read is refused.
    lease_get = next(r for r in requests if r.resource == "leases")
    assert lease_get.verb == "get"
    other = "default-scheduler" if overlay == "second-scheduler" else "second-scheduler"
    base_only = list(rbac_rules(DEPLOY.parent / "base" / "extender-clusterrole.yaml"))
    assert not allowed(base_only, lease_get)
    assert not allowed(
        [*base_only, *rbac_rules(OVERLAYS / other / "extender-lease-rbac.yaml")], lease_get
    )
