"""Builders for the Kubernetes JSON of nodes, pods and namespaces that tests seed.

They return plain wire dicts (what a client would POST), because the fake API server stores
wire JSON; our own domain types never appear here.
"""

from __future__ import annotations

from typing import Any


def make_namespace(name: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": dict(labels or {})},
    }


def make_node(
    name: str,
    *,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: str = "110",
    extended: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    ready: bool = True,
) -> dict[str, Any]:
    """A registered, Ready node; ``extended`` adds resources such as ``{"nvidia.com/gpu": "8"}``."""
    capacity = {"cpu": cpu, "memory": memory, "pods": pods, **(extended or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                **(labels or {}),
            },
            "annotations": dict(annotations or {}),
        },
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "KubeletNotReady",
                }
            ],
            "addresses": [{"type": "Hostname", "address": name}],
        },
    }


def make_pod(
    name: str,
    namespace: str = "default",
    *,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    node_name: str | None = None,
    scheduler_name: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    image: str = "registry.k8s.io/pause:3.10",
) -> dict[str, Any]:
    """A one-container pod; extended resources belong in ``limits`` (requests default to them)."""
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = dict(requests)
    if limits:
        resources["limits"] = dict(limits)
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": image, "resources": resources}]
    }
    if node_name:
        spec["nodeName"] = node_name
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
    }
