"""Pod JSON -> GPU request: quantities, kube-scheduler's effective-request arithmetic, and the
refusals a user must be able to act on."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from kubegpu.sharing.resources import (
    RequestError,
    RequestKind,
    ResourceNames,
    gpu_request,
    parse_quantity,
)

MEM, COMP, SLOT, WHOLE = (
    "kubegpu.io/gpu-memory",
    "kubegpu.io/gpu-compute",
    "kubegpu.io/gpu-shared",
    "nvidia.com/gpu",
)


def container(
    name: str,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "name": name,
        "resources": {"requests": requests or {}, "limits": limits or {}},
        **extra,
    }


def pod(
    containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"containers": containers, "initContainers": init or [], **spec},
    }


def share(name: str, mib: int, milli: int, cpu: str = "0") -> dict[str, Any]:
    return container(name, {"cpu": cpu}, {MEM: str(mib), COMP: str(milli), SLOT: "1"})


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", "0.5"),
        ("2", "2"),
        ("10Gi", str(10 * 2**30)),
        ("1e3", "1000"),
        ("1.5k", "1500"),
        ("128Mi", str(128 * 2**20)),
        (3, "3"),
    ],
)
def test_parses_kubernetes_quantities(text: object, value: str) -> None:
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize("text", ["", "abc", "1Q", "-1", "1.2.3", "Gi", True, None, "1e99999"])
def test_refuses_what_is_not_a_quantity(text: object) -> None:
    with pytest.raises(RequestError):
        parse_quantity(text)


def test_a_pod_without_gpu_resources_is_passed_through() -> None:
    request = gpu_request(pod([container("c", {"cpu": "250m", "memory": "1Gi"})]))
    assert request.kind is RequestKind.NONE
    assert (request.cpu_milli, request.host_memory_mib) == (250, 1024)


def test_effective_request_is_max_of_init_peak_and_app_sum() -> None:
    # App containers sum to 3 CPUs; the init container alone needs 5: effective 5.
    request = gpu_request(
        pod(
            [
                container("a", {"cpu": "1"}, {WHOLE: "1"}),
                container("b", {"cpu": "2"}, {WHOLE: "2"}),
            ],
            init=[container("i", {"cpu": "5"}, {WHOLE: "1"})],
        )
    )
    assert request.kind is RequestKind.WHOLE
    assert (request.cpu_milli, request.whole_gpus) == (5000, 3)


def test_sidecars_add_to_the_app_sum_and_to_later_init_steps() -> None:
    request = gpu_request(
        pod(
            [container("app", {"cpu": "1"})],
            init=[
                container("side", {"cpu": "2"}, restartPolicy="Always"),
                container("later", {"cpu": "2"}),
            ],
            overhead={"cpu": "100m", "memory": "64Mi"},
        )
    )
    # app 1 + sidecar 2 = 3; init step "later" = 2 + sidecar 2 = 4; plus overhead.
    assert (request.cpu_milli, request.host_memory_mib) == (4100, 64)


def test_shared_request_sums_containers_on_one_card_and_keeps_the_split() -> None:
    request = gpu_request(pod([share("a", 4096, 200, "1"), share("b", 2048, 100, "1")]))
    assert request.kind is RequestKind.SHARED
    assert (request.gpu_memory_mib, request.compute_milli) == (6144, 300)
    placement = request.to_placement()
    assert (placement.gpu_count, placement.gpu_milli, placement.gpu_memory_mib) == (1, 300, 6144)
    assert [(c.name, c.gpu_memory_mib, c.compute_milli) for c in request.containers] == [
        ("a", 4096, 200),
        ("b", 2048, 100),
    ]


def test_requests_default_to_limits_and_must_equal_them_for_extended_resources() -> None:
    with pytest.raises(RequestError, match="request and limit must be equal"):
        gpu_request(pod([container("c", {WHOLE: "1"}, {WHOLE: "2"})]))


@pytest.mark.parametrize(
    ("containers", "message"),
    [
        (
            [container("c", limits={WHOLE: "1", MEM: "10", COMP: "10", SLOT: "1"})],
            "use one or the other",
        ),
        ([share("a", 1024, 600), share("b", 1024, 500)], "must fit on one card"),
        ([container("c", limits={MEM: "1024", COMP: "100", SLOT: "2"})], "exactly 1"),
        ([container("c", limits={SLOT: "1"})], "say how much of the card"),
        ([container("c", limits={COMP: "100", SLOT: "1"})], "needs both"),
        ([container("c", limits={MEM: "1.5", COMP: "100", SLOT: "1"})], "whole number"),
        ([container("c", limits={WHOLE: "lots"})], "not a Kubernetes quantity"),
    ],
    ids=[
        "whole-and-shared",
        "over-one-card",
        "two-slots",
        "slot-only",
        "compute-only",
        "fractional",
        "garbage",
    ],
)
def test_unservable_requests_are_refused_with_a_reason(
    containers: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(RequestError, match=message) as excinfo:
        gpu_request(pod(containers))
    assert "ns/p" in str(excinfo.value)


def test_resource_names_are_configurable_and_checked() -> None:
    names = ResourceNames(gpu_memory="example.com/vram", gpu_compute="example.com/sm")
    request = gpu_request(
        pod(
            [container("c", limits={"example.com/vram": "100", "example.com/sm": "10", SLOT: "1"})]
        ),
        names,
    )
    assert request.kind is RequestKind.SHARED
    with pytest.raises(ValueError, match="distinct"):
        ResourceNames(gpu_memory=WHOLE)
    with pytest.raises(ValueError, match="not a valid extended resource name"):
        ResourceNames(gpu_memory="memory")


def test_gpu_model_annotation_narrows_the_models() -> None:
    p = pod([container("c", limits={WHOLE: "1"})])
    p["metadata"]["annotations"] = {"kubegpu.io/gpu-models": "H100-80GB, A100-80GB"}
    assert gpu_request(p).gpu_models == frozenset({"H100-80GB", "A100-80GB"})


@pytest.mark.parametrize(
    "annotation", ["Tesla T4", "Tesla-T4", " Tesla  T4 ", "Tesla T4,Tesla-T4", "(Tesla T4)"]
)
def test_nvml_and_label_spellings_of_a_model_are_one_model(annotation: str) -> None:
    # The inventory says "Tesla T4" (NVML), the labels "Tesla-T4": a pod may copy either.
    p = pod([container("c", limits={WHOLE: "1"})])
    p["metadata"]["annotations"] = {"kubegpu.io/gpu-models": annotation}
    assert gpu_request(p).gpu_models == frozenset({"Tesla-T4"})


def test_a_model_name_without_letters_or_digits_is_refused_by_name() -> None:
    p = pod([container("c", limits={WHOLE: "1"})])
    p["metadata"]["annotations"] = {"kubegpu.io/gpu-models": "Tesla T4, --"}
    with pytest.raises(RequestError, match=r"kubegpu\.io/gpu-models: '--' is not a GPU model name"):
        gpu_request(p)
