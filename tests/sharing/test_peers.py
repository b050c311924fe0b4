"""Peer compat modes, the pure rules: a Volcano- or Aliyun-style pod read as a share, the
admission patch that gives it our slot, the peers' env and node figures."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.sharing.claim import mentions_gpu, read_claim
from kubegpu.sharing.peers import (
    admission_patch,
    admission_refusal,
    container_env,
    node_capacity,
    peer_compat,
)
from kubegpu.sharing.resources import RequestError, RequestKind, ResourceNames, gpu_request
from kubegpu.webhook.review import apply_patch

PEERS = peer_compat(["volcano", "aliyun"])
NAMES = ResourceNames(peers=PEERS)
SLOT = "kubegpu.io/gpu-shared"


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "volcano", "containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": {"name": "gpu-pod1", "namespace": "volcano-pod"}, "spec": spec}


def container(name: str, **limits: Any) -> dict[str, Any]:
    return {"name": name, "image": "cuda", "resources": {"limits": dict(limits)}}


def volcano(mib: int, name: str = "cuda-container-1") -> dict[str, Any]:
    return container(name, **{"volcano.sh/gpu-memory": mib})


def aliyun(gib: int, name: str = "binpack-1") -> dict[str, Any]:
    return container(name, **{"aliyun.com/gpu-mem": gib})


def admitted(p: dict[str, Any], scheduler: str = "") -> dict[str, Any]:
    return apply_patch(p, admission_patch(p, PEERS, SLOT, scheduler_name=scheduler))


@pytest.mark.parametrize(
    ("spec", "memory_mib", "compute_milli"),
    [
        (pod(volcano(1024)), 1024, 1),
        (pod(aliyun(2)), 2048, 1),
        (pod(aliyun(2), aliyun(3, "second")), 5120, 2),
        (pod(volcano(512), container("cpu-only", cpu="1")), 512, 1),
    ],
    ids=["volcano-walkthrough", "aliyun-sample", "aliyun-two-containers", "with-a-cpu-container"],
)
def test_a_peer_pod_after_admission_is_a_share_in_mib(
    spec: dict[str, Any], memory_mib: int, compute_milli: int
) -> None:
    request = gpu_request(admitted(spec), NAMES)
    assert request.kind is RequestKind.SHARED
    assert (request.gpu_memory_mib, request.compute_milli) == (memory_mib, compute_milli)
    assert request.to_placement().gpu_count == 1


def test_without_compat_modes_the_peer_memory_is_not_read() -> None:
    assert gpu_request(pod(volcano(1024)), ResourceNames()).kind is RequestKind.NONE
    # With a slot added by hand the memory is still not read, so the share is refused.
    with pytest.raises(RequestError, match=r"without kubegpu\.io/gpu-memory"):
        gpu_request(admitted(pod(volcano(1024))), ResourceNames())


def test_a_peer_pod_the_webhook_never_saw_is_refused_naming_the_webhook() -> None:
    with pytest.raises(RequestError, match="volcano compat mode: is kubegpu's peer webhook"):
        gpu_request(pod(volcano(1024)), NAMES)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            pod(container("c", **{"volcano.sh/gpu-number": 1, "volcano.sh/gpu-memory": 10})),
            "volcano.sh/gpu-number is a node figure",
        ),
        (
            pod(container("c", **{"aliyun.com/gpu-mem": 1, "kubegpu.io/gpu-memory": 10})),
            "asks for aliyun.com/gpu-mem and kubegpu.io/gpu-memory",
        ),
        (pod(aliyun(2), container("w", **{"nvidia.com/gpu": 1})), "whole GPUs"),
    ],
    ids=["gpu-number-asked", "peer-and-ours", "peer-and-whole"],
)
def test_peer_requests_that_cannot_be_served_say_why(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        gpu_request(admitted(spec), NAMES)


def test_the_admission_patch_adds_one_slot_to_each_peer_container_only() -> None:
    spec = pod(volcano(1024), container("sidecar", cpu="1"), init=(aliyun(1, "warm"),))
    spec["spec"]["containers"][0]["resources"]["requests"] = {"volcano.sh/gpu-memory": "1024"}
    ops = admission_patch(spec, PEERS, SLOT)
    slot = "kubegpu.io~1gpu-shared"
    assert ops == [
        {"op": "add", "path": f"/spec/initContainers/0/resources/limits/{slot}", "value": "1"},
        {"op": "add", "path": f"/spec/containers/0/resources/limits/{slot}", "value": "1"},
        {"op": "add", "path": f"/spec/containers/0/resources/requests/{slot}", "value": "1"},
    ]
    patched = apply_patch(spec, ops)
    assert patched["spec"]["containers"][1]["resources"] == {"limits": {"cpu": "1"}}
    # Applying it twice (a re-invocation) adds nothing.
    assert admission_patch(patched, PEERS, SLOT) == []


def refusal(spec: dict[str, Any], peers: Any = PEERS) -> str:
    return admission_refusal(spec, peers, whole_gpu="nvidia.com/gpu", key="volcano-pod/gpu-pod1")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            pod(container("c", **{"volcano.sh/gpu-number": 1})),
            "pod volcano-pod/gpu-pod1 container c: volcano.sh/gpu-number (Volcano's whole-card "
            "count) is not served by kubegpu; ask for nvidia.com/gpu for whole cards, or for "
            "volcano.sh/gpu-memory alone for a share of one card",
        ),
        (
            pod(container("c", **{"aliyun.com/gpu-count": 1})),
            "pod volcano-pod/gpu-pod1 container c: aliyun.com/gpu-count (gpushare's whole-card "
            "count) is not served by kubegpu; ask for nvidia.com/gpu for whole cards, or for "
            "aliyun.com/gpu-mem alone for a share of one card",
        ),
        (
            pod(container("c", **{"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-memory": 3000})),
            "pod volcano-pod/gpu-pod1 container c: volcano.sh/vgpu-number (Volcano vGPU) is not "
            "served by kubegpu; ask for nvidia.com/gpu for whole cards, or for "
            "volcano.sh/gpu-memory alone for a share of one card",
        ),
        (
            pod(container("web", cpu="1"), init=(container("i", **{"volcano.sh/vgpu-cores": 5}),)),
            "pod volcano-pod/gpu-pod1 init container i: volcano.sh/vgpu-cores (Volcano vGPU)",
        ),
        (
            pod({"name": "r", "resources": {"requests": {"aliyun.com/gpu-mem": "2"}}}),
            "pod volcano-pod/gpu-pod1 container r: aliyun.com/gpu-mem is in requests but not in "
            "limits; set it in limits",
        ),
    ],
    ids=["gpu-number-alone", "gpu-count-alone", "vgpu", "vgpu-in-init", "memory-requests-only"],
)
def test_peer_resources_kubegpu_does_not_serve_are_refused_naming_the_alternative(
    spec: dict[str, Any], message: str
) -> None:
    assert refusal(spec).startswith(message)


def test_only_the_modes_on_are_refused_and_servable_pods_are_not() -> None:
    count = pod(container("c", **{"aliyun.com/gpu-count": 1}))
    assert refusal(count, peer_compat(["volcano"])) == ""
    assert refusal(count, peer_compat(["aliyun"]))
    for servable in (
        pod(volcano(1024)),
        pod(aliyun(2)),
        pod(container("z", **{"volcano.sh/gpu-number": "0"})),
    ):
        assert refusal(servable) == ""


@pytest.mark.parametrize(
    "spec",
    [
        pod(container("web", cpu="1")),
        pod(container("train", **{"nvidia.com/gpu": 1})),
        pod(container("ours", **{"kubegpu.io/gpu-memory": 10, "kubegpu.io/gpu-compute": 1})),
        pod(container("zero", **{"volcano.sh/gpu-memory": "0"})),
        {"metadata": {"name": "no-spec"}},
    ],
    ids=["cpu", "whole", "kubegpu-share", "zero-peer-memory", "no-spec"],
)
def test_pods_asking_for_no_peer_resource_are_not_touched(spec: dict[str, Any]) -> None:
    assert admission_patch(spec, PEERS, SLOT, scheduler_name="kubegpu-scheduler") == []


def test_the_scheduler_is_set_only_when_asked_and_only_for_peer_pods() -> None:
    assert admitted(pod(volcano(1024)))["spec"]["schedulerName"] == "volcano"
    moved = admitted(pod(volcano(1024)), scheduler="kubegpu-scheduler")
    assert moved["spec"]["schedulerName"] == "kubegpu-scheduler"


def test_the_claim_knows_which_container_asked_in_which_peer_unit() -> None:
    claim = read_claim(admitted(pod(aliyun(2), aliyun(3, "second"), volcano(7, "v"))), NAMES)
    assert claim.totals is not None
    asked = {c.name: (c.peer, c.peer_units, c.gpu_memory_mib) for c in claim.totals.containers}
    assert asked == {
        "binpack-1": ("aliyun", 2, 2048),
        "second": ("aliyun", 3, 3072),
        "v": ("volcano", 7, 7),
    }
    assert mentions_gpu(pod(volcano(1)), NAMES)
    assert not mentions_gpu(pod(volcano(1)), ResourceNames())


def test_volcano_env_matches_the_walkthrough() -> None:
    (vol,) = peer_compat(["volcano"])
    env = container_env(
        vol, card_index=0, card_memory_mib=10989, container_units=1024, pod_units=1024
    )
    assert env == {
        "VOLCANO_GPU_TOTAL": "10989",
        "VOLCANO_GPU_MEMORY_TOTAL": "10989",
        "VOLCANO_GPU_ALLOCATED": "1024",
    }


@pytest.mark.parametrize(
    ("unit", "expected"),
    [("GiB", ("3", "5", "2", "15")), ("MiB", ("3", "5", "2", "15360"))],
)
def test_aliyun_env_is_in_the_configured_unit(unit: str, expected: tuple[str, ...]) -> None:
    (ali,) = peer_compat(["aliyun"], aliyun_memory_unit=unit)
    env = container_env(ali, card_index=3, card_memory_mib=15360, container_units=2, pod_units=5)
    assert (
        env["ALIYUN_COM_GPU_MEM_IDX"],
        env["ALIYUN_COM_GPU_MEM_POD"],
        env["ALIYUN_COM_GPU_MEM_CONTAINER"],
        env["ALIYUN_COM_GPU_MEM_DEV"],
    ) == expected


def test_node_figures_add_up_every_card_in_the_peers_unit_and_offer_no_card_count() -> None:
    # The walk-through's node: two 10,989 MiB cards show 21978 MiB. The card count is 0: a pod
    # can ask for it and nothing hands cards out under it, so counted as the cards it let a
    # gpu-number pod that skipped the webhook run with no card.
    assert node_capacity(peer_compat(["volcano"]), [10989, 10989]) == {
        "volcano.sh/gpu-memory": "21978",
        "volcano.sh/gpu-number": "0",
    }
    # 8 x 80 GB in GiB: each card rounded down, as gpushare counts its fake devices.
    assert node_capacity(peer_compat(["aliyun"]), [81559] * 8) == {
        "aliyun.com/gpu-mem": str(8 * 79),
        "aliyun.com/gpu-count": "0",
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"modes": ["hami"]}, "unknown peer compat mode 'hami'"),
        ({"modes": ["aliyun"], "aliyun_memory_unit": "KiB"}, "aliyun memory unit"),
        ({"modes": ["volcano"], "compute_milli": 1000}, "1..999"),
        ({"modes": ["volcano"], "volcano_memory_factor": 0}, "factor"),
    ],
)
def test_bad_compat_settings_are_refused_naming_the_value(
    kwargs: dict[str, Any], message: str
) -> None:
    modes = kwargs.pop("modes")
    with pytest.raises(ValueError, match=message):
        peer_compat(modes, **kwargs)
