"""Every peer resource kubegpu advertises or sees ends in exactly one of two ways: served (the
webhook gives the container kubegpu's share slot, and the pod is a share kubegpu places), or
refused at creation by the webhook with a message naming the resource and what to ask for
instead. Never admitted untouched: such a pod ran with no card (``volcano.sh/gpu-number: 1``)
or waited forever without a word (Volcano's vGPU).

For each of Volcano's and Aliyun's resource names, asked alone, with its companion, in requests
only, in limits only and in an init container: the shipped ``matchConditions`` send the pod to
the webhook (both the component's and the chart's), and the webhook's answer is the rule's."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from kubegpu.sharing.claim import read_claim
from kubegpu.sharing.peers import (
    ALIYUN_CORE_PERCENTAGE,
    ALIYUN_COUNT,
    ALIYUN_MEMORY,
    UNSERVED,
    VOLCANO_MEMORY,
    VOLCANO_NUMBER,
    VOLCANO_VGPU_CORES,
    VOLCANO_VGPU_MEMORY,
    VOLCANO_VGPU_MEMORY_PERCENTAGE,
    VOLCANO_VGPU_NUMBER,
    peer_compat,
)
from kubegpu.sharing.resources import RequestKind, ResourceNames
from kubegpu.webhook.review import apply_patch, review_response
from tests.webhook.match_conditions import sends, shipped_expressions

NAMES = ResourceNames(peers=peer_compat(["volcano", "aliyun"]))
SCHEDULER = "kubegpu-scheduler"
SLOT = "kubegpu.io/gpu-shared"

# name -> (its peer's memory resource, the resource it comes with in the peer's own examples)
PEER_RESOURCES: dict[str, tuple[str, str]] = {
    VOLCANO_MEMORY: (VOLCANO_MEMORY, VOLCANO_NUMBER),
    VOLCANO_NUMBER: (VOLCANO_MEMORY, VOLCANO_MEMORY),
    VOLCANO_VGPU_NUMBER: (VOLCANO_MEMORY, VOLCANO_VGPU_MEMORY),
    VOLCANO_VGPU_MEMORY: (VOLCANO_MEMORY, VOLCANO_VGPU_NUMBER),
    VOLCANO_VGPU_MEMORY_PERCENTAGE: (VOLCANO_MEMORY, VOLCANO_VGPU_NUMBER),
    VOLCANO_VGPU_CORES: (VOLCANO_MEMORY, VOLCANO_VGPU_NUMBER),
    ALIYUN_MEMORY: (ALIYUN_MEMORY, ALIYUN_COUNT),
    ALIYUN_COUNT: (ALIYUN_MEMORY, ALIYUN_MEMORY),
    ALIYUN_CORE_PERCENTAGE: (ALIYUN_MEMORY, ALIYUN_MEMORY),
}
SERVED = frozenset({VOLCANO_MEMORY, ALIYUN_MEMORY})
AMOUNT = {VOLCANO_MEMORY: "1024", VOLCANO_VGPU_MEMORY: "3000", ALIYUN_MEMORY: "2"}
CASES = ("alone", "with-companion", "requests-only", "limits-only", "init-container")


def test_the_table_is_every_resource_kubegpu_knows_of_the_peers() -> None:
    # A resource added to kubegpu.sharing.peers is in this table, and so in every case below.
    known = {r for peer in NAMES.peers for r in peer.resources}
    assert known == set(PEER_RESOURCES)
    assert {r for unserved in UNSERVED.values() for r in unserved} == set(PEER_RESOURCES) - SERVED


def peer_pod(resource: str, case: str) -> dict[str, Any]:
    """A pod asking for ``resource`` as ``case`` says, as the API server hands it to the webhook
    (after defaulting: requests copied from limits where limits are given)."""
    asked = {resource: AMOUNT.get(resource, "1")}
    if case == "with-companion":
        companion = PEER_RESOURCES[resource][1]
        asked[companion] = AMOUNT.get(companion, "1")
    if case == "requests-only":
        resources = {"requests": asked}
    elif case == "limits-only":
        resources = {"limits": asked}
    else:
        resources = {"limits": asked, "requests": dict(asked)}
    gpu = {"name": "cuda-container", "image": "cuda", "resources": resources}
    spec: dict[str, Any] = {"schedulerName": "volcano"}
    if case == "init-container":
        spec["initContainers"] = [gpu]
        spec["containers"] = [{"name": "main", "image": "cuda", "resources": {}}]
    else:
        spec["containers"] = [gpu]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-pod1", "namespace": "volcano-pod"},
        "spec": spec,
    }


def answer(pod: dict[str, Any], names: ResourceNames = NAMES) -> dict[str, Any]:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "volcano-pod",
            "object": copy.deepcopy(pod),
        },
    }
    response: dict[str, Any] = review_response(review, names, scheduler_name=SCHEDULER)["response"]
    assert response["uid"] == "u-1"
    return response


def refused_for(resource: str, case: str) -> str:
    """The resource the refusal must name, or "" where the pod is served."""
    companion = PEER_RESOURCES[resource][1]
    if resource not in SERVED:
        return resource
    if case == "with-companion" and companion not in SERVED:
        return companion
    if case == "requests-only":
        return resource
    return ""


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("resource", sorted(PEER_RESOURCES))
def test_every_peer_resource_is_served_or_refused_at_creation_naming_what_to_ask_instead(
    resource: str, case: str
) -> None:
    pod = peer_pod(resource, case)
    for where, expression in shipped_expressions().items():
        assert sends(expression, pod), f"the {where}'s matchConditions let the pod past"
    response = answer(pod)
    refused = refused_for(resource, case)
    memory = PEER_RESOURCES[resource][0]
    if refused:
        assert response["allowed"] is False, response
        assert "patch" not in response
        assert response["status"]["code"] == 422
        message = response["status"]["message"]
        assert message.startswith("kubegpu peer compat: pod volcano-pod/gpu-pod1 ")
        if refused in SERVED:
            assert f"{refused} is in requests but not in limits; set it in limits" in message
        else:
            # With two unserved resources (vGPU's number and memory) either is a right answer.
            asked = [resource, PEER_RESOURCES[resource][1]] if case == "with-companion" else []
            named = [r for r in [refused, *asked] if r not in SERVED]
            assert any(f": {r} (" in message for r in named), message
            assert "is not served by kubegpu" in message
            assert (
                f"ask for nvidia.com/gpu for whole cards, or for {memory} alone for a share of "
                "one card" in message
            )
        return
    assert response["allowed"] is True, response
    group = "initContainers" if case == "init-container" else "containers"
    ops = json.loads(base64.b64decode(response["patch"]))
    slot_paths = {op["path"] for op in ops if op["path"].endswith("kubegpu.io~1gpu-shared")}
    assert slot_paths and all(p.startswith(f"/spec/{group}/0/resources/") for p in slot_paths)
    assert {"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER} in ops
    # What the API server stores is a share kubegpu places, in MiB of the peer's unit.
    claim = read_claim(apply_patch(pod, ops), NAMES)
    assert claim.request is not None and claim.request.kind is RequestKind.SHARED, claim.refusal
    mib = int(AMOUNT[resource]) * (1024 if resource == ALIYUN_MEMORY else 1)
    assert claim.request.gpu_memory_mib == mib


@pytest.mark.parametrize("resource", sorted(PEER_RESOURCES))
def test_a_zero_amount_asks_for_nothing_and_is_admitted_untouched(resource: str) -> None:
    pod = peer_pod(resource, "alone")
    for part in pod["spec"]["containers"][0]["resources"].values():
        part[resource] = "0"
    assert answer(pod) == {"uid": "u-1", "allowed": True}


def test_a_peer_whose_mode_is_off_is_left_to_whoever_serves_it() -> None:
    # Refusals follow the modes the webhook runs with: with only Volcano's on, an Aliyun pod
    # (gpushare may still run beside kubegpu) is none of kubegpu's business.
    volcano_only = ResourceNames(peers=peer_compat(["volcano"]))
    for resource in (ALIYUN_MEMORY, ALIYUN_COUNT, ALIYUN_CORE_PERCENTAGE):
        assert answer(peer_pod(resource, "alone"), volcano_only) == {"uid": "u-1", "allowed": True}
    assert answer(peer_pod(VOLCANO_NUMBER, "alone"), volcano_only)["allowed"] is False


def test_the_refusal_names_a_renamed_whole_gpu_resource() -> None:
    names = ResourceNames(whole_gpu="example.com/gpu", peers=NAMES.peers)
    message = answer(peer_pod(VOLCANO_NUMBER, "alone"), names)["status"]["message"]
    assert "ask for example.com/gpu for whole cards" in message
