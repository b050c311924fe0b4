"""The DeviceClasses shipped in deploy/components/dra-driver select exactly our driver's devices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kubegpu.config.model import AgentConfig
from kubegpu.core.dra import DEFAULT_DRIVER_NAME

from ..deploy.manifests import render

DEPLOY_DRA = Path(__file__).resolve().parents[2] / "deploy" / "components" / "dra-driver"


def classes() -> list[dict[str, Any]]:
    text = (DEPLOY_DRA / "deviceclasses.yaml").read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


# Cards and shares of cards: our driver's devices that are not MIG devices (those carry a
# profile); MIG devices: the ones that do.
NOT_MIG = (
    f'device.driver == "{DEFAULT_DRIVER_NAME}" && '
    f'!("profile" in device.attributes["{DEFAULT_DRIVER_NAME}"])'
)
MIG = (
    f'device.driver == "{DEFAULT_DRIVER_NAME}" && '
    f'"profile" in device.attributes["{DEFAULT_DRIVER_NAME}"]'
)


def test_whole_shared_and_mig_classes_are_v1_device_classes() -> None:
    docs = classes()
    assert [(d["apiVersion"], d["kind"]) for d in docs] == [
        ("resource.k8s.io/v1", "DeviceClass")
    ] * 3
    assert [d["metadata"]["name"] for d in docs] == [
        "gpu.kubegpu.io",
        "gpu-share.kubegpu.io",
        "mig.kubegpu.io",
    ]
    assert all(set(d) == {"apiVersion", "kind", "metadata", "spec"} for d in docs)


def test_each_class_selects_on_the_driver_name_and_mig_with_cel() -> None:
    expected = {"gpu.kubegpu.io": NOT_MIG, "gpu-share.kubegpu.io": NOT_MIG, "mig.kubegpu.io": MIG}
    for doc in classes():
        (selector,) = doc["spec"]["selectors"]
        assert set(selector) == {"cel"}
        assert selector["cel"]["expression"] == expected[doc["metadata"]["name"]]


# --------------------------------------------------------- extended-resource mapping (opt-in)
EXTENDED = "examples/dra-extended-resource"


def device_classes(example: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in render(example) if o["kind"] == "DeviceClass"}


def test_the_extended_resource_class_maps_nvidia_gpu_to_our_devices() -> None:
    found = device_classes(EXTENDED)
    assert set(found) == {
        "gpu.kubegpu.io",
        "gpu-share.kubegpu.io",
        "gpu-extended-resource.kubegpu.io",
        "mig.kubegpu.io",
    }
    mapped = found["gpu-extended-resource.kubegpu.io"]
    assert mapped["apiVersion"] == "resource.k8s.io/v1"
    assert mapped["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    (selector,) = mapped["spec"]["selectors"]
    assert selector == {"cel": {"expression": NOT_MIG}}
    # No config and no capacity request: each device consumes the request policy's default,
    # the whole card, so `nvidia.com/gpu: 1` stays an exclusive GPU.
    assert set(mapped["spec"]) == {"selectors", "extendedResourceName"}
    assert mapped["metadata"]["labels"]["app.kubernetes.io/part-of"] == "kubegpu"
    # The name a pod asks for is the device plugin's: the node agent's whole-GPU resource.
    assert (
        mapped["spec"]["extendedResourceName"]
        == AgentConfig().sharing.gpu_share.whole_resource_name
    )


def test_the_mapping_is_opt_in() -> None:
    # extendedResourceName needs an alpha gate in 1.35: the default DRA install does not set it.
    for name, cls in device_classes("examples/dra").items():
        assert "extendedResourceName" not in cls["spec"], name


# ------------------------------------------------------------- NVIDIA's naming (opt-in)
NVIDIA_NAMING_EXAMPLE = "examples/dra-nvidia-naming"


def test_under_nvidias_naming_its_class_replaces_ours_and_both_roles_are_told() -> None:
    objs = render(NVIDIA_NAMING_EXAMPLE)
    found = {o["metadata"]["name"]: o for o in objs if o["kind"] == "DeviceClass"}
    assert set(found) == {"gpu.nvidia.com", "mig.nvidia.com"}
    # NVIDIA's chart's MIG class, verbatim.
    assert found["mig.nvidia.com"]["spec"] == {
        "selectors": [
            {
                "cel": {
                    "expression": "device.driver == 'gpu.nvidia.com' && "
                    "device.attributes['gpu.nvidia.com'].type == 'mig'"
                }
            }
        ]
    }
    spec = found["gpu.nvidia.com"]["spec"]
    # NVIDIA's chart's expression and extended resource, verbatim.
    assert spec == {
        "selectors": [
            {
                "cel": {
                    "expression": "device.driver == 'gpu.nvidia.com' && "
                    "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                }
            }
        ],
        "extendedResourceName": "nvidia.com/gpu",
    }
    (driver,) = [
        o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("dra-driver")
    ]
    (container,) = driver["spec"]["template"]["spec"]["containers"]
    assert "--dra-naming=nvidia" in container["args"]
    (scheduler,) = [o for o in objs if o["kind"] == "Deployment"]
    (extender,) = [
        c for c in scheduler["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"
    ]
    assert {"name": "KUBEGPU_EXTENDER_DRA_NAMING", "value": "nvidia"} in extender["env"]
