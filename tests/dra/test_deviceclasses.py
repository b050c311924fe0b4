"""The DeviceClasses shipped in deploy/components/dra-driver select exactly our driver's devices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kubegpu.core.dra import DEFAULT_DRIVER_NAME

DEPLOY_DRA = Path(__file__).resolve().parents[2] / "deploy" / "components" / "dra-driver"


def classes() -> list[dict[str, Any]]:
    text = (DEPLOY_DRA / "deviceclasses.yaml").read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def test_whole_and_shared_classes_are_v1_device_classes() -> None:
    docs = classes()
    assert [(d["apiVersion"], d["kind"]) for d in docs] == [
        ("resource.k8s.io/v1", "DeviceClass")
    ] * 2
    assert [d["metadata"]["name"] for d in docs] == ["gpu.kubegpu.io", "gpu-share.kubegpu.io"]
    assert all(set(d) == {"apiVersion", "kind", "metadata", "spec"} for d in docs)


def test_each_class_selects_on_the_driver_name_with_cel() -> None:
    for doc in classes():
        (selector,) = doc["spec"]["selectors"]
        assert set(selector) == {"cel"}
        assert selector["cel"]["expression"] == f'device.driver == "{DEFAULT_DRIVER_NAME}"'
