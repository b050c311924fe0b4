"""Every KubeSchedulerConfiguration kubegpu ships, wherever it is (deploy/scheduler, the copies
in the overlays, the rendered ConfigMaps, YAML blocks in the docs), passes the strict v1 schema
in :mod:`tests.deploy.scheduler_config_schema`: kube-scheduler decodes its config strictly, so
a misspelt key there stops it from starting, and nothing else in the suite would notice."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import DEPLOY, kustomizations, render
from tests.deploy.scheduler_config_schema import API_VERSION, KIND, problems

DOCS = DEPLOY.parent / "docs"
Doc = dict[str, Any]


def _is_scheduler_config(doc: object) -> bool:
    return isinstance(doc, dict) and doc.get("kind") == KIND


def shipped() -> Iterator[tuple[str, Doc]]:
    """(where, document) for every KubeSchedulerConfiguration in the repository's deliverables."""
    for path in sorted(DEPLOY.rglob("*.yaml")):
        # The Helm chart's templates are Go templates, not YAML; e2e/tests/test_07_helm.py
        # renders them with the real helm and compares them with these overlays.
        if path.is_relative_to(DEPLOY / "helm") and path.parent.name == "templates":
            continue
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if _is_scheduler_config(doc):
                yield f"{path.relative_to(DEPLOY.parent)}#{i}", doc
    for kustomization in kustomizations():
        for obj in render(kustomization):
            if obj["kind"] != "ConfigMap":
                continue
            for key, text in (obj.get("data") or {}).items():
                doc = yaml.safe_load(text)
                if _is_scheduler_config(doc):
                    # Without the content hash, so that the test's name is stable.
                    name = re.sub(r"-[a-z0-9]{10}$", "", obj["metadata"]["name"])
                    yield f"{kustomization}: ConfigMap {name} {key}", doc
    for path in sorted(DOCS.glob("*.md")):
        for i, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", path.read_text(), re.S)):
            try:
                docs = list(yaml.safe_load_all(block))
            except yaml.YAMLError:
                continue  # a fragment (e.g. a patch with "..."); not a whole config
            for doc in docs:
                if _is_scheduler_config(doc):
                    yield f"{path.relative_to(DEPLOY.parent)} yaml block {i}", doc


SHIPPED = dict(shipped())


def test_every_shipped_scheduler_config_is_found() -> None:
    # The two files, their copies in the overlays, and the ConfigMaps made from the copies.
    assert set(SHIPPED) >= {
        "deploy/scheduler/kubegpu-scheduler.yaml#0",
        "deploy/scheduler/default-scheduler.yaml#0",
        "deploy/overlays/second-scheduler/kube-scheduler-config.yaml#0",
        "deploy/overlays/default-scheduler/kube-scheduler-config.yaml#0",
    }
    assert "overlays/second-scheduler: ConfigMap kubegpu-scheduler-config config.yaml" in SHIPPED
    assert (
        "overlays/default-scheduler: ConfigMap kubegpu-default-scheduler-config config.yaml"
        in SHIPPED
    )


@pytest.mark.parametrize("where", sorted(SHIPPED))
def test_every_shipped_scheduler_config_passes_the_strict_v1_schema(where: str) -> None:
    doc = SHIPPED[where]
    assert doc["apiVersion"] == API_VERSION
    assert problems(doc) == []


def _base() -> Doc:
    return copy.deepcopy(SHIPPED["deploy/scheduler/default-scheduler.yaml#0"])


def _rename(path: tuple[Any, ...], old: str, new: str) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        target: Any = doc
        for step in path:
            target = target[step]
        target[new] = target.pop(old)

    return mutate


def _set(path: tuple[Any, ...], value: Any) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        target: Any = doc
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return mutate


def _second_binder(doc: Doc) -> None:
    other = copy.deepcopy(doc["extenders"][0])
    other["urlPrefix"] = "http://127.0.0.1:9999"
    other["managedResources"] = [{"name": "example.com/other"}]
    doc["extenders"].append(other)


def _managed_twice(doc: Doc) -> None:
    doc["extenders"][0]["managedResources"].append({"name": "nvidia.com/gpu"})


MISTAKES: dict[str, tuple[Callable[[Doc], None], str]] = {
    # Misspelt keys, at every level we write.
    "percentageOfNodeToScore": (
        _rename((), "percentageOfNodesToScore", "percentageOfNodeToScore"),
        "'percentageOfNodeToScore' was unexpected",
    ),
    "managedResource": (
        _rename(("extenders", 0), "managedResources", "managedResource"),
        "'managedResource' was unexpected",
    ),
    "ignoredByScheduler": (
        _rename(("extenders", 0, "managedResources", 0), "ignoredByScheduler", "ignoreByScheduler"),
        "'ignoreByScheduler' was unexpected",
    ),
    "tlsConfig.caFile": (
        _rename(("extenders", 0, "tlsConfig"), "caFile", "caFiles"),
        "'caFiles' was unexpected",
    ),
    "enableHttps": (
        _rename(("extenders", 0), "enableHTTPS", "enableHttps"),
        "'enableHttps' was unexpected",
    ),
    "clientConnection.kubeConfig": (
        _rename(("clientConnection",), "kubeconfig", "kubeConfig"),
        "'kubeConfig' was unexpected",
    ),
    "profiles.name": (_rename(("profiles", 0), "schedulerName", "name"), "'name' was unexpected"),
    "leaderElection.leaderElection": (
        _set(("leaderElection",), {"leaderElection": True}),
        "'leaderElection' was unexpected",
    ),
    # Wrong types and values.
    "httpTimeout without unit": (_set(("extenders", 0, "httpTimeout"), "10"), "httpTimeout"),
    "percentage as text": (_set(("percentageOfNodesToScore",), "100"), "percentageOfNodesToScore"),
    "percentage over 100": (_set(("percentageOfNodesToScore",), 101), "percentageOfNodesToScore"),
    "nodeCacheCapable as text": (
        _set(("extenders", 0, "nodeCacheCapable"), "true"),
        "nodeCacheCapable",
    ),
    "old apiVersion": (_set(("apiVersion",), "kubescheduler.config.k8s.io/v1beta3"), "apiVersion"),
    "feature-gated field": (
        _set(("percentageOfPlacementsToScore",), 50),
        "'percentageOfPlacementsToScore' was",
    ),
    # kube-scheduler's cross-field validation.
    "weight 0 with prioritize": (_set(("extenders", 0, "weight"), 0), "positive weight"),
    "two binders": (_second_binder, "only one extender can implement bind"),
    "resource managed twice": (_managed_twice, "managed twice"),
    "native resource": (
        _set(("extenders", 0, "managedResources", 0, "name"), "cpu"),
        "not an extended resource name",
    ),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_a_mistake_kube_scheduler_would_refuse_fails_the_check(mistake: str) -> None:
    mutate, named = MISTAKES[mistake]
    doc = _base()
    assert problems(doc) == []
    mutate(doc)
    found = problems(doc)
    assert found, f"{mistake} passed"
    assert any(named in line for line in found), found
