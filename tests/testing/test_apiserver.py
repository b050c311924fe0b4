"""The fake API server's verbs, selectors, patches and conflicts, through the sync lightkube
client over real HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import lightkube
import msgspec
import pytest
from lightkube import ApiError, operators
from lightkube.config.kubeconfig import KubeConfig
from lightkube.generic_resource import GenericNamespacedStatus
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import (
    ConfigMap,
    Event,
    Namespace,
    Node,
    NodeStatus,
    Pod,
    PodBinding,
    PodStatus,
    ResourceQuota,
)
from lightkube.types import PatchType

from kubegpu.testing.apiserver import FakeApiServer, ServerThread, make_node, make_pod


class PodBindingRequest(GenericNamespacedStatus):
    """pods/binding with a dict-typed reply: the real server answers a binding with a Status,
    which lightkube's typed PodBinding cannot decode (see the test below)."""

    _api_info = PodBinding._api_info


@pytest.fixture
def client(fake_api_server: ServerThread) -> Iterator[lightkube.Client]:
    with fake_api_server.client() as client:
        yield client


def bind(client: lightkube.Client, pod: str, node: str, **meta: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod, "namespace": "default", **meta},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    client.create(PodBindingRequest(body), name=pod, namespace="default")


def api_error(excinfo: pytest.ExceptionInfo[ApiError]) -> tuple[int, str]:
    return excinfo.value.status.code, excinfo.value.status.reason


def test_created_node_gets_uid_timestamp_generation_and_a_new_resource_version(
    client: lightkube.Client, fake_api_server: ServerThread
) -> None:
    before = fake_api_server.store.resource_version
    node = client.create(Node.from_dict(make_node("gpu-a")))
    assert node.metadata.uid
    assert node.metadata.creationTimestamp is not None
    assert node.metadata.generation == 1
    assert int(node.metadata.resourceVersion) == before + 1
    assert client.get(Node, "gpu-a").metadata.uid == node.metadata.uid


def test_every_write_takes_the_next_global_resource_version(client: lightkube.Client) -> None:
    first = client.create(Node.from_dict(make_node("n1")))
    pod = client.create(Pod.from_dict(make_pod("p1")))
    patched = client.patch(Node, "n1", {"metadata": {"labels": {"x": "y"}}})
    versions = [int(o.metadata.resourceVersion) for o in (first, pod, patched)]
    assert versions == [versions[0], versions[0] + 1, versions[0] + 2]


def test_get_of_a_missing_pod_is_a_not_found_status(client: lightkube.Client) -> None:
    with pytest.raises(ApiError) as excinfo:
        client.get(Pod, "ghost", namespace="default")
    assert api_error(excinfo) == (404, "NotFound")
    assert excinfo.value.status.message == 'pods "ghost" not found'


def test_creating_an_existing_name_is_already_exists(client: lightkube.Client) -> None:
    client.create(Pod.from_dict(make_pod("p1")))
    with pytest.raises(ApiError) as excinfo:
        client.create(Pod.from_dict(make_pod("p1")))
    assert api_error(excinfo) == (409, "AlreadyExists")


def test_generate_name_gives_each_pod_a_distinct_name(client: lightkube.Client) -> None:
    body = make_pod("")
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = "worker-"
    names = {client.create(Pod.from_dict(body)).metadata.name for _ in range(5)}
    assert len(names) == 5
    assert all(n.startswith("worker-") and len(n) == len("worker-") + 5 for n in names)


def test_creating_in_a_missing_namespace_is_not_found(client: lightkube.Client) -> None:
    with pytest.raises(ApiError) as excinfo:
        client.create(Pod.from_dict(make_pod("p1", namespace="nope")))
    assert api_error(excinfo) == (404, "NotFound")
    client.create(Namespace(metadata=ObjectMeta(name="nope")))
    assert client.create(Pod.from_dict(make_pod("p1", namespace="nope"))).metadata.name == "p1"


def test_a_pod_without_an_image_is_invalid(client: lightkube.Client) -> None:
    body = make_pod("p1")
    del body["spec"]["containers"][0]["image"]
    with pytest.raises(ApiError) as excinfo:
        client.create(Pod.from_dict(body))
    assert api_error(excinfo) == (422, "Invalid")
    assert "spec.containers[0].image" in excinfo.value.status.message


def test_a_label_value_with_spaces_is_invalid_as_on_a_real_cluster(
    client: lightkube.Client,
) -> None:
    client.create(Node.from_dict(make_node("n1")))
    with pytest.raises(ApiError) as excinfo:
        client.patch(Node, "n1", {"metadata": {"labels": {"gpu.model": "NVIDIA H100 80GB"}}})
    assert api_error(excinfo) == (422, "Invalid")


def test_pod_create_resets_status_to_pending_and_fills_scheduler_name(
    client: lightkube.Client,
) -> None:
    body = make_pod("p1")
    body["status"] = {"phase": "Running"}
    pod = client.create(Pod.from_dict(body))
    assert pod.status.phase == "Pending"
    assert pod.spec.schedulerName == "default-scheduler"


def test_list_returns_the_current_resource_version_across_and_within_namespaces(
    client: lightkube.Client, fake_api_server: ServerThread
) -> None:
    client.create(Namespace(metadata=ObjectMeta(name="team")))
    client.create(Pod.from_dict(make_pod("a")))
    client.create(Pod.from_dict(make_pod("b", namespace="team")))
    everywhere = client.list(Pod, namespace="*")
    assert sorted(p.metadata.name for p in everywhere) == ["a", "b"]
    assert everywhere.resourceVersion == str(fake_api_server.store.resource_version)
    assert [p.metadata.name for p in client.list(Pod, namespace="team")] == ["b"]


def test_list_pages_with_limit_and_continue(
    client: lightkube.Client, fake_api_server: ServerThread
) -> None:
    for i in range(7):
        client.create(ConfigMap(metadata=ObjectMeta(name=f"cm-{i}"), data={"i": str(i)}))
    names = [c.metadata.name for c in client.list(ConfigMap, chunk_size=3)]
    assert names == [f"cm-{i}" for i in range(7)]
    assert fake_api_server.count("list", "configmaps") == 3


LABELLED = {
    "a": {"gpu": "h100", "tier": "prod"},
    "b": {"gpu": "a100", "tier": "dev"},
    "c": {"tier": "dev"},
    "d": {"gpu": "h100"},
}


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"gpu": "h100"}, ["a", "d"]),
        ({"gpu": operators.not_equal("h100")}, ["b", "c"]),
        ({"gpu": operators.in_(["a100", "h100"])}, ["a", "b", "d"]),
        ({"gpu": operators.not_in(["h100"])}, ["b", "c"]),
        ({"gpu": operators.exists()}, ["a", "b", "d"]),
        ({"gpu": operators.not_exists()}, ["c"]),
        ({"gpu": "h100", "tier": "prod"}, ["a"]),
        ({"tier": operators.in_(["dev"]), "gpu": operators.not_exists()}, ["c"]),
    ],
    ids=[
        "equals",
        "not-equals",
        "in",
        "notin",
        "exists",
        "not-exists",
        "and",
        "set-and-not-exists",
    ],
)
def test_label_selector_picks_the_matching_nodes(
    client: lightkube.Client,
    fake_api_server: ServerThread,
    labels: dict[str, Any],
    expected: list[str],
) -> None:
    for name, node_labels in LABELLED.items():
        fake_api_server.store.put("nodes", make_node(name, labels=node_labels))
    assert sorted(n.metadata.name for n in client.list(Node, labels=labels)) == expected


def raw(
    fake_api_server: ServerThread,
    path: str,
    method: str = "GET",
    body: bytes | None = None,
    content_type: str = "application/json",
) -> tuple[int, dict[str, Any]]:
    """One plain HTTP request, for what lightkube cannot send (bad bodies, preconditions)."""
    request = urllib.request.Request(
        fake_api_server.url + path, data=body, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def raw_get(fake_api_server: ServerThread, path: str) -> tuple[int, dict[str, Any]]:
    return raw(fake_api_server, path)


def test_label_selector_accepts_double_equals_and_rejects_malformed_input(
    fake_api_server: ServerThread,
) -> None:
    for name, node_labels in LABELLED.items():
        fake_api_server.store.put("nodes", make_node(name, labels=node_labels))
    code, body = raw_get(fake_api_server, "/api/v1/nodes?labelSelector=" + quote("gpu==h100,tier"))
    assert code == 200
    assert [n["metadata"]["name"] for n in body["items"]] == ["a"]
    for bad in ("gpu in (h100", "gpu=h 100", "-bad-=x", "gpu in ()"):
        code, body = raw_get(fake_api_server, "/api/v1/nodes?labelSelector=" + quote(bad))
        assert (code, body["kind"], body["reason"]) == (400, "Status", "BadRequest"), bad


def test_field_selectors_on_node_name_phase_and_name(
    client: lightkube.Client, fake_api_server: ServerThread
) -> None:
    fake_api_server.store.put("pods", make_pod("on-a", node_name="node-a"))
    fake_api_server.store.put("pods", make_pod("on-b", node_name="node-b"))
    fake_api_server.store.put("pods", make_pod("pending"))
    running = make_pod("running", node_name="node-a")
    running["status"] = {"phase": "Running"}
    fake_api_server.store.put("pods", running)

    def names(fields: dict[str, Any]) -> list[str]:
        return sorted(p.metadata.name for p in client.list(Pod, fields=fields))

    assert names({"spec.nodeName": "node-a"}) == ["on-a", "running"]
    assert names({"spec.nodeName": ""}) == ["pending"]
    assert names({"spec.nodeName": operators.not_equal("")}) == ["on-a", "on-b", "running"]
    assert names({"status.phase": "Running"}) == ["running"]
    assert names({"metadata.name": "on-b"}) == ["on-b"]
    assert names({"spec.nodeName": "node-a", "status.phase": operators.not_equal("Running")}) == [
        "on-a"
    ]


def test_an_unsupported_field_selector_is_a_bad_request(client: lightkube.Client) -> None:
    with pytest.raises(ApiError) as excinfo:
        list(client.list(Pod, fields={"spec.priority": "1"}))
    assert api_error(excinfo) == (400, "BadRequest")
    assert "field label not supported" in excinfo.value.status.message


def test_merge_patch_adds_and_removes_annotations(client: lightkube.Client) -> None:
    client.create(Node.from_dict(make_node("n1", annotations={"old": "1", "keep": "2"})))
    node = client.patch(
        Node,
        "n1",
        {"metadata": {"annotations": {"old": None, "new": "3"}}},
        patch_type=PatchType.MERGE,
    )
    assert node.metadata.annotations == {"keep": "2", "new": "3"}


def test_strategic_patch_merges_containers_by_name_where_merge_patch_replaces_the_list(
    client: lightkube.Client,
) -> None:
    body = make_pod("p1")
    body["spec"]["containers"].append({"name": "sidecar", "image": "busybox:1"})
    client.create(Pod.from_dict(body))
    change = {"spec": {"containers": [{"name": "sidecar", "image": "busybox:2"}]}}

    pod = client.patch(Pod, "p1", change, patch_type=PatchType.STRATEGIC)
    assert [(c.name, c.image) for c in pod.spec.containers] == [
        ("main", "registry.k8s.io/pause:3.10"),
        ("sidecar", "busybox:2"),
    ]

    # Merge patch replaces the list, which drops a container: a forbidden pod spec change.
    with pytest.raises(ApiError) as excinfo:
        client.patch(Pod, "p1", change, patch_type=PatchType.MERGE)
    assert api_error(excinfo) == (422, "Invalid")


def test_strategic_patch_on_node_status_merges_conditions_by_type(
    client: lightkube.Client,
) -> None:
    client.create(Node.from_dict(make_node("n1")))
    node = client.patch(
        NodeStatus,
        "n1",
        {"status": {"conditions": [{"type": "GPUHealthy", "status": "False"}]}},
    )
    assert {c.type: c.status for c in node.status.conditions} == {
        "Ready": "True",
        "GPUHealthy": "False",
    }


def test_json_patch_applies_only_when_its_test_passes(client: lightkube.Client) -> None:
    client.create(Node.from_dict(make_node("n1", annotations={"gpu/owner": "none"})))
    applied = client.patch(
        Node,
        "n1",
        [
            {"op": "test", "path": "/metadata/annotations/gpu~1owner", "value": "none"},
            {"op": "replace", "path": "/metadata/annotations/gpu~1owner", "value": "pod-1"},
        ],
        patch_type=PatchType.JSON,
    )
    assert applied.metadata.annotations == {"gpu/owner": "pod-1"}
    with pytest.raises(ApiError) as excinfo:
        client.patch(
            Node,
            "n1",
            [
                {"op": "test", "path": "/metadata/annotations/gpu~1owner", "value": "none"},
                {"op": "replace", "path": "/metadata/annotations/gpu~1owner", "value": "pod-2"},
            ],
            patch_type=PatchType.JSON,
        )
    assert api_error(excinfo) == (422, "Invalid")
    assert client.get(Node, "n1").metadata.annotations == {"gpu/owner": "pod-1"}


def test_put_with_a_stale_resource_version_conflicts_and_without_one_succeeds(
    client: lightkube.Client,
) -> None:
    node = client.create(Node.from_dict(make_node("n1")))
    client.patch(Node, "n1", {"metadata": {"labels": {"moved": "on"}}})
    node.metadata.labels = {"stale": "write"}
    with pytest.raises(ApiError) as excinfo:
        client.replace(node)
    assert api_error(excinfo) == (409, "Conflict")
    assert "the object has been modified" in excinfo.value.status.message
    node.metadata.resourceVersion = None
    assert client.replace(node).metadata.labels == {"stale": "write"}


def test_put_for_a_recreated_object_conflicts_on_its_uid(client: lightkube.Client) -> None:
    node = client.create(Node.from_dict(make_node("n1")))
    client.delete(Node, "n1")
    client.create(Node.from_dict(make_node("n1")))
    node.metadata.resourceVersion = None
    with pytest.raises(ApiError) as excinfo:
        client.replace(node)
    assert api_error(excinfo) == (409, "Conflict")
    assert "Precondition failed: UID" in excinfo.value.status.message


def test_put_with_the_current_resource_version_succeeds(client: lightkube.Client) -> None:
    node = client.create(Node.from_dict(make_node("n1")))
    node.metadata.labels = {"fresh": "write"}
    replaced = client.replace(node)
    assert replaced.metadata.labels == {"fresh": "write"}
    assert int(replaced.metadata.resourceVersion) > int(node.metadata.resourceVersion)


def test_a_patch_carrying_a_stale_resource_version_conflicts(client: lightkube.Client) -> None:
    node = client.create(Node.from_dict(make_node("n1")))
    client.patch(Node, "n1", {"metadata": {"labels": {"moved": "on"}}})
    for patch_type in (PatchType.MERGE, PatchType.STRATEGIC):
        with pytest.raises(ApiError) as excinfo:
            client.patch(
                Node,
                "n1",
                {
                    "metadata": {
                        "resourceVersion": node.metadata.resourceVersion,
                        "labels": {"x": "y"},
                    }
                },
                patch_type=patch_type,
            )
        assert api_error(excinfo) == (409, "Conflict")
    current = client.get(Node, "n1").metadata.resourceVersion
    ok = client.patch(
        Node,
        "n1",
        {"metadata": {"resourceVersion": current, "labels": {"x": "y"}}},
        patch_type=PatchType.MERGE,
    )
    assert ok.metadata.labels["x"] == "y"


def test_a_patch_that_changes_nothing_keeps_the_resource_version(
    client: lightkube.Client,
) -> None:
    node = client.create(Node.from_dict(make_node("n1", labels={"a": "b"})))
    same = client.patch(Node, "n1", {"metadata": {"labels": {"a": "b"}}})
    assert same.metadata.resourceVersion == node.metadata.resourceVersion


def test_status_endpoint_changes_only_status_and_main_endpoint_ignores_status(
    client: lightkube.Client,
) -> None:
    client.create(Pod.from_dict(make_pod("p1")))
    pod = client.patch(
        PodStatus,
        "p1",
        {"status": {"phase": "Running"}, "metadata": {"labels": {"ignored": "yes"}}},
        patch_type=PatchType.MERGE,
        namespace="default",
    )
    assert pod.status.phase == "Running"
    assert "ignored" not in (pod.metadata.labels or {})
    pod = client.patch(
        Pod,
        "p1",
        {"status": {"phase": "Failed"}, "metadata": {"labels": {"l": "v"}}},
        patch_type=PatchType.MERGE,
    )
    assert pod.status.phase == "Running"
    assert pod.metadata.labels["l"] == "v"
    assert client.get(PodStatus, "p1", namespace="default").status.phase == "Running"


def test_replacing_node_status_changes_allocatable_but_not_labels(
    client: lightkube.Client,
) -> None:
    client.create(Node.from_dict(make_node("n1")))
    status = client.get(NodeStatus, "n1")
    status.status.allocatable["nvidia.com/gpu"] = "4"
    status.metadata.labels["sneaky"] = "x"
    replaced = client.replace(status)
    assert replaced.status.allocatable["nvidia.com/gpu"] == "4"
    assert "sneaky" not in client.get(Node, "n1").metadata.labels


def test_spec_node_name_cannot_be_patched_on_a_pod(client: lightkube.Client) -> None:
    client.create(Pod.from_dict(make_pod("p1")))
    with pytest.raises(ApiError) as excinfo:
        client.patch(Pod, "p1", {"spec": {"nodeName": "n1"}})
    assert api_error(excinfo) == (422, "Invalid")


def test_binding_sets_node_name_copies_annotations_and_a_second_binding_conflicts(
    client: lightkube.Client, fake_api_server: ServerThread
) -> None:
    created = client.create(Pod.from_dict(make_pod("p1")))
    bind(client, "p1", "node-a", uid=created.metadata.uid, annotations={"kubegpu.io/gpus": "GPU-1"})  # type: ignore[arg-type]
    pod = client.get(Pod, "p1")
    assert pod.spec.nodeName == "node-a"
    assert pod.metadata.annotations["kubegpu.io/gpus"] == "GPU-1"
    assert any(c.type == "PodScheduled" and c.status == "True" for c in pod.status.conditions)
    assert int(pod.metadata.resourceVersion) > int(created.metadata.resourceVersion)
    with pytest.raises(ApiError) as excinfo:
        bind(client, "p1", "node-b")
    assert api_error(excinfo) == (409, "Conflict")
    assert 'already assigned to node "node-a"' in excinfo.value.status.message
    assert fake_api_server.count("create", "pods/binding") == 2


def test_binding_a_missing_pod_is_not_found(client: lightkube.Client) -> None:
    with pytest.raises(ApiError) as excinfo:
        bind(client, "ghost", "node-a")
    assert api_error(excinfo) == (404, "NotFound")


def test_binding_with_a_stale_uid_precondition_conflicts(client: lightkube.Client) -> None:
    client.create(Pod.from_dict(make_pod("p1")))
    with pytest.raises(ApiError) as excinfo:
        bind(client, "p1", "node-a", uid="not-the-uid")
    assert api_error(excinfo) == (409, "Conflict")
    assert client.get(Pod, "p1").spec.nodeName is None


def test_typed_pod_binding_cannot_decode_the_status_reply_although_the_pod_is_bound(
    client: lightkube.Client,
) -> None:
    # Like kube-apiserver, the fake answers a binding with a v1.Status; lightkube decodes the
    # reply as a Binding and fails after the bind happened. Callers must use a dict-typed
    # resource (PodBindingRequest above) or treat this error as success.
    client.create(Pod.from_dict(make_pod("p1")))
    binding = PodBinding(
        metadata=ObjectMeta(name="p1"), target=ObjectReference(kind="Node", name="node-a")
    )
    with pytest.raises(msgspec.ValidationError):
        client.create(binding, name="p1", namespace="default")
    assert client.get(Pod, "p1").spec.nodeName == "node-a"


def test_injected_failures_fail_the_next_writes_then_clear(
    client: lightkube.Client, fake_api_server: ServerThread
) -> None:
    client.create(Node.from_dict(make_node("n1")))
    fake_api_server.inject_failures("nodes", "n1", count=2, code=409)
    fake_api_server.inject_failures("pods", count=1, code=500)
    for _ in range(2):
        with pytest.raises(ApiError) as excinfo:
            client.patch(Node, "n1", {"metadata": {"labels": {"try": "x"}}})
        assert api_error(excinfo) == (409, "Conflict")
    assert client.patch(Node, "n1", {"metadata": {"labels": {"try": "x"}}}).metadata.labels["try"]
    with pytest.raises(ApiError) as excinfo:
        client.create(Pod.from_dict(make_pod("p1")))
    assert api_error(excinfo) == (500, "InternalError")
    assert client.create(Pod.from_dict(make_pod("p1"))).metadata.name == "p1"


def test_finalizers_hold_a_deleted_object_until_they_are_removed(
    client: lightkube.Client,
) -> None:
    client.create(ConfigMap(metadata=ObjectMeta(name="held", finalizers=["kubegpu.io/cleanup"])))
    client.delete(ConfigMap, "held")
    held = client.get(ConfigMap, "held")
    assert held.metadata.deletionTimestamp is not None
    client.patch(ConfigMap, "held", {"metadata": {"finalizers": None}}, patch_type=PatchType.MERGE)
    with pytest.raises(ApiError) as excinfo:
        client.get(ConfigMap, "held")
    assert api_error(excinfo) == (404, "NotFound")


def test_events_and_resource_quotas_are_stored_and_listed(client: lightkube.Client) -> None:
    client.create(
        Event.from_dict(
            {
                "metadata": {"name": "p1.1"},
                "involvedObject": {"kind": "Pod", "name": "p1", "namespace": "default"},
                "reason": "GPUAssigned",
                "message": "GPU-1",
                "type": "Normal",
            }
        )
    )
    client.create(
        ResourceQuota.from_dict(
            {
                "metadata": {"name": "gpus"},
                "spec": {"hard": {"requests.nvidia.com/gpu": "4"}},
            }
        )
    )
    assert [e.reason for e in client.list(Event, fields={"involvedObject.name": "p1"})] == [
        "GPUAssigned"
    ]
    assert [q.spec.hard for q in client.list(ResourceQuota)] == [{"requests.nvidia.com/gpu": "4"}]


def test_a_written_kubeconfig_file_points_lightkube_at_the_server(
    fake_api_server: ServerThread, tmp_path: Path
) -> None:
    path = fake_api_server.write_kubeconfig(tmp_path / "kubeconfig")
    fake_api_server.store.put("nodes", make_node("n1"))
    with lightkube.Client(KubeConfig.from_file(path), trust_env=False) as client:
        assert [n.metadata.name for n in client.list(Node)] == ["n1"]


PODS = "/api/v1/namespaces/default/pods"


@pytest.mark.parametrize(
    ("method", "path", "body", "content_type", "expected"),
    [
        ("POST", PODS, b"{not json", "application/json", (400, "BadRequest")),
        (
            "POST",
            PODS,
            json.dumps(make_node("n1")).encode(),
            "application/json",
            (400, "BadRequest"),
        ),
        ("POST", PODS, b"[1, 2]", "application/json", (400, "BadRequest")),
        (
            "POST",
            PODS,
            json.dumps(make_pod("p1")).encode(),
            "text/plain",
            (415, "UnsupportedMediaType"),
        ),
        (
            "PATCH",
            PODS + "/p0",
            b"{}",
            "application/apply-patch+yaml",
            (415, "UnsupportedMediaType"),
        ),
        (
            "PATCH",
            PODS + "/p0",
            b'{"op": "add"}',
            "application/json-patch+json",
            (400, "BadRequest"),
        ),
        (
            "PUT",
            PODS + "/other",
            json.dumps(make_pod("p0")).encode(),
            "application/json",
            (400, "BadRequest"),
        ),
        (
            "POST",
            "/api/v1/namespaces/team/pods",
            json.dumps(make_pod("p1")).encode(),
            "application/json",
            (400, "BadRequest"),
        ),
        ("GET", "/api/v1/widgets", None, "application/json", (404, "NotFound")),
        ("GET", "/api/v1/namespaces/default/nodes", None, "application/json", (404, "NotFound")),
        ("POST", PODS + "/p0", b"{}", "application/json", (405, "MethodNotAllowed")),
        (
            "GET",
            PODS + "?watch=1&resourceVersion=abc",
            None,
            "application/json",
            (400, "BadRequest"),
        ),
    ],
    ids=[
        "malformed-json",
        "wrong-kind",
        "not-an-object",
        "wrong-media-type",
        "apply-patch",
        "bad-json-patch",
        "name-mismatch",
        "namespace-mismatch",
        "unknown-resource",
        "cluster-resource-in-namespace",
        "post-to-an-object",
        "non-numeric-version",
    ],
)
def test_bad_requests_get_a_status_with_the_real_code_and_reason(
    fake_api_server: ServerThread,
    method: str,
    path: str,
    body: bytes | None,
    content_type: str,
    expected: tuple[int, str],
) -> None:
    fake_api_server.store.put("pods", make_pod("p0"))
    code, status = raw(fake_api_server, path, method, body, content_type)
    assert (code, status["reason"]) == expected
    assert (status["kind"], status["apiVersion"], status["status"]) == ("Status", "v1", "Failure")
    assert status["code"] == code


def test_a_body_over_the_size_limit_is_rejected_with_413() -> None:
    with FakeApiServer(max_body_bytes=4096).run_in_thread() as server:
        pod = make_pod("big", annotations={"filler": "x" * 8192})
        code, status = raw(server, PODS, "POST", json.dumps(pod).encode())
        assert (code, status["reason"]) == (413, "RequestEntityTooLarge")
        assert server.store.get("pods", "default", "big") is None


def test_delete_with_a_stale_resource_version_precondition_conflicts(
    client: lightkube.Client,
    fake_api_server: ServerThread,
) -> None:
    created = client.create(ConfigMap(metadata=ObjectMeta(name="cm")))
    client.patch(ConfigMap, "cm", {"data": {"k": "v"}})
    options = {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "preconditions": {"resourceVersion": created.metadata.resourceVersion},
    }
    path = "/api/v1/namespaces/default/configmaps/cm"
    code, status = raw(fake_api_server, path, "DELETE", json.dumps(options).encode())
    assert (code, status["reason"]) == (409, "Conflict")
    options["preconditions"] = {
        "resourceVersion": client.get(ConfigMap, "cm").metadata.resourceVersion
    }
    code, deleted = raw(fake_api_server, path, "DELETE", json.dumps(options).encode())
    assert code == 200
    assert deleted["metadata"]["name"] == "cm"
    assert fake_api_server.store.get("configmaps", "default", "cm") is None


def test_deleting_a_namespace_removes_what_is_in_it(client: lightkube.Client) -> None:
    client.create(Namespace(metadata=ObjectMeta(name="team")))
    client.create(Pod.from_dict(make_pod("p1", namespace="team")))
    client.create(Pod.from_dict(make_pod("p1")))
    client.delete(Namespace, "team")
    assert [(p.metadata.namespace, p.metadata.name) for p in client.list(Pod, namespace="*")] == [
        ("default", "p1")
    ]


def test_discovery_lists_the_served_resources_and_the_binding_subresource(
    fake_api_server: ServerThread,
) -> None:
    code, core = raw_get(fake_api_server, "/api/v1")
    assert code == 200
    names = {r["name"] for r in core["resources"]}
    assert {
        "nodes",
        "pods",
        "pods/binding",
        "pods/status",
        "nodes/status",
        "namespaces",
        "events",
        "configmaps",
        "resourcequotas",
    } <= names
    assert raw_get(fake_api_server, "/api")[1]["versions"] == ["v1"]


def test_graceful_pod_deletion_marks_a_running_pod_until_a_zero_grace_delete() -> None:
    with (
        FakeApiServer(graceful_pod_deletion=True).run_in_thread() as fake_api_server,
        fake_api_server.client() as client,
    ):
        fake_api_server.store.put("pods", make_pod("running", node_name="node-a"))
        fake_api_server.store.put("pods", make_pod("unscheduled"))
        client.delete(Pod, "running")
        terminating = client.get(Pod, "running")
        assert terminating.metadata.deletionTimestamp is not None
        assert terminating.metadata.deletionGracePeriodSeconds == 30
        client.delete(Pod, "running", grace_period=0)  # what the kubelet sends at the end
        client.delete(Pod, "unscheduled")  # nothing to stop: goes at once
        assert list(client.list(Pod)) == []
