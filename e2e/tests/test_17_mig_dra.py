"""MIG through the DRA driver on the real components (issue 30, docs/mig.md): static MIG
devices selected by a CEL selector on their profile, whole-GPU classes never handed a MIG
device, and dynamic MIG, where the real allocator picks a placement over the card's counter set
and the driver creates the instance on prepare and destroys it when the pod goes.

Runs on a DRA cluster of its own (the `mig_dra` fixture: four fake H100s, card 0 partitioned
2g.20gb@0 + 1g.10gb@2 + 3g.40gb@4, card 1 in MIG mode and empty, cards 2 and 3 whole), with the
DRAPartitionableDevices gate (alpha in 1.35, beta and on by default from 1.36)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubegpu_e2e.cluster import Cluster
from kubegpu_e2e.dra import COMPONENT, DraDriver
from kubegpu_e2e.images import WORKLOAD_IMAGE
from kubegpu_e2e.mig_dra import MIG_DEVICES, STATIC_LAYOUT
from kubegpu_e2e.workloads import ENV_END, container_env, pending_reason, wait_running

from kubegpu.core.gpu import mig_cap_minors
from kubegpu.inventory.fake import send_fake_gpu_command

pytestmark = pytest.mark.e2e

Dra = tuple[Cluster, DraDriver]
DRIVER = "gpu.kubegpu.io"
PRINT = (
    'trap "exit 0" TERM; env | sort; '
    "echo KUBEGPU_E2E_DEV=$(ls /dev | grep nvidia | sort | tr '\\n' ' '); "
    "echo KUBEGPU_E2E_CAPS=$(ls /dev/nvidia-caps 2>/dev/null | sort | tr '\\n' ' '); "
    f"echo {ENV_END}; while :; do sleep 1; done"
)


def pod(name: str, namespace: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "c0",
                    "image": WORKLOAD_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", PRINT],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
        },
    }


def template(name: str, namespace: str, device_class: str, cel: str | None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def create(cluster: Cluster, *objects: dict[str, Any]) -> None:
    for o in objects:
        cluster.kubectl("create", "-f", "-", input=json.dumps(o))


def allocated_device(cluster: Cluster, namespace: str, name: str) -> str:
    status = cluster.get("pod", "-n", namespace, name)["status"]
    (entry,) = status["resourceClaimStatuses"]
    claim = cluster.get("resourceclaim", "-n", namespace, entry["resourceClaimName"])
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def card_instances(driver: DraDriver, card: int) -> list[dict[str, Any]]:
    reply = send_fake_gpu_command(driver.fake_control, "status")
    assert reply["ok"], reply
    return list(reply["gpus"][card]["mig"])


def on_card(profile: str, card_uuid: str) -> str:
    attributes = f'device.attributes["{DRIVER}"]'
    return f'{attributes}.profile == "{profile}" && {attributes}.parentUUID == "{card_uuid}"'


def card_uuid(index: int) -> str:
    return f"GPU-4a000000-0000-0000-0000-00000000000{index}"


def test_static_mig_devices_are_published_instead_of_their_card(mig_dra: Dra) -> None:
    _, driver = mig_dra
    devices = driver.devices()
    assert set(devices) == {
        "gpu-0-mig-2g20gb-14-0",
        "gpu-0-mig-1g10gb-19-2",
        "gpu-0-mig-3g40gb-9-4",
        "gpu-2",
        "gpu-3",
    }
    three = devices["gpu-0-mig-3g40gb-9-4"]["attributes"]
    assert three["profile"] == {"string": "3g.40gb"}
    assert three["parentUUID"] == {"string": card_uuid(0)}
    assert three["uuid"]["string"].startswith("MIG-")
    assert len(devices) == MIG_DEVICES


def test_a_static_mig_claim_selected_by_profile_runs_on_exactly_its_instance(
    mig_dra: Dra, mig_namespace: str
) -> None:
    cluster, driver = mig_dra
    ns = mig_namespace
    cel = f'device.attributes["{DRIVER}"].profile == "3g.40gb"'
    create(cluster, template("three-g", ns, "mig.kubegpu.io", cel), pod("mig", ns, "three-g"))
    wait_running(cluster, ns, "mig")
    device = allocated_device(cluster, ns, "mig")
    assert device == "gpu-0-mig-3g40gb-9-4"
    env = cluster.wait_for("mig's environment", lambda: container_env(cluster, ns, "mig", "c0"))
    published = driver.devices()[device]["attributes"]["uuid"]["string"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == published
    # The card's node and the instance's two capability nodes, nothing of another card.
    assert [n for n in env["KUBEGPU_E2E_DEV"].split() if n[6:].isdigit()] == ["nvidia0"]
    gi = 1 + [p for p, _ in STATIC_LAYOUT].index("3g.40gb")  # the spec's order gives the ids
    assert env["KUBEGPU_E2E_CAPS"].split() == sorted(
        f"nvidia-cap{m}" for m in mig_cap_minors(0, gi, 0)
    )


def test_whole_gpu_claims_never_get_a_mig_device(mig_dra: Dra, mig_namespace: str) -> None:
    cluster, _ = mig_dra
    ns = mig_namespace
    create(cluster, template("whole", ns, "gpu.kubegpu.io", None))
    for name in ("w0", "w1", "w2"):
        create(cluster, pod(name, ns, "whole"))
    wait_running(cluster, ns, "w0", "w1")
    assert {allocated_device(cluster, ns, n) for n in ("w0", "w1")} == {"gpu-2", "gpu-3"}
    reason = cluster.wait_for("w2 refused", lambda: pending_reason(cluster, ns, "w2"), 90)
    assert "cannot allocate all claims" in reason, reason


@pytest.fixture(scope="module")
def dynamic(mig_dra: Dra, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dra]:
    """The module's driver restarted with dra.mig: dynamic."""
    cluster, driver = mig_dra
    config = yaml.safe_load((COMPONENT / "dra-driver-config.yaml").read_text())
    config["dra"]["mig"] = "dynamic"
    path: Path = tmp_path_factory.mktemp("mig") / "dynamic.yaml"
    path.write_text(yaml.safe_dump(config))
    driver.stop()
    # Cards 0 and 1 offer their 25 placements each, cards 2 and 3 themselves.
    driver.device_count = 2 * 25 + 2
    driver.start(path)
    yield cluster, driver


def test_dynamic_mig_creates_the_instance_on_prepare_and_removes_it_with_the_pod(
    dynamic: Dra, mig_namespace: str
) -> None:
    cluster, driver = dynamic
    ns = mig_namespace
    slices = driver.slices()
    counters = [s for s in slices if "sharedCounters" in s["spec"]]
    assert {c["name"] for s in counters for c in s["spec"]["sharedCounters"]} == {
        "gpu-0-counter-set",
        "gpu-1-counter-set",
    }, "the API server kept the counter sets (DRAPartitionableDevices)"
    assert card_instances(driver, 0) == [], "no prepared claim held card 0's instances"
    create(
        cluster,
        template("three-g", ns, "mig.kubegpu.io", on_card("3g.40gb", card_uuid(1))),
        pod("dyn", ns, "three-g"),
    )
    wait_running(cluster, ns, "dyn")
    device = allocated_device(cluster, ns, "dyn")
    assert device in ("gpu-1-mig-3g40gb-9-0", "gpu-1-mig-3g40gb-9-4")
    (made,) = card_instances(driver, 1)
    assert (made["profile"], made["start"]) == ("3g.40gb", int(device.rsplit("-", 1)[1]))
    env = cluster.wait_for("dyn's environment", lambda: container_env(cluster, ns, "dyn", "c0"))
    assert env["NVIDIA_VISIBLE_DEVICES"] == made["uuid"]
    cluster.kubectl("delete", "pod", "-n", ns, "dyn", "--wait=true", "--timeout=120s")
    cluster.wait_for("the instance destroyed", lambda: card_instances(driver, 1) == [], 60)


def test_dynamic_claims_pack_a_cards_placements_and_one_that_does_not_fit_waits(
    dynamic: Dra, mig_namespace: str
) -> None:
    cluster, driver = dynamic
    ns = mig_namespace
    create(
        cluster,
        template("three-g", ns, "mig.kubegpu.io", on_card("3g.40gb", card_uuid(1))),
        template("one-g", ns, "mig.kubegpu.io", on_card("1g.10gb", card_uuid(1))),
        pod("a", ns, "three-g"),
        pod("b", ns, "three-g"),
    )
    wait_running(cluster, ns, "a", "b")
    # Two 3g.40gb take memory slices 0-3 and 4-7: the table's only layout for two of them.
    assert sorted(m["start"] for m in card_instances(driver, 1)) == [0, 4]
    create(cluster, pod("c", ns, "one-g"))
    reason = cluster.wait_for("c refused", lambda: pending_reason(cluster, ns, "c"), 90)
    assert "cannot allocate all claims" in reason, reason
    assert len(card_instances(driver, 1)) == 2
