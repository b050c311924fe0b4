"""Cards in MIG mode in the inspect report: under their node with their MIG devices, the pods
the kubelet gave each (through the exporter), else the pods asking for them; in the model, the
tables, ``-o json`` and the command against the fake API server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner, Result

from kubegpu.cli.main import cli
from kubegpu.inspect.model import build_report
from kubegpu.inspect.render import load_schema, render_text, report_to_json
from kubegpu.inspect.report import Filters, InspectReport, MigRequest, NodeView, WarningKind
from kubegpu.inspect.usage import NodeUsage, UsageResult, parse_exporter_metrics
from kubegpu.sharing.annotations import MIG_DEVICES_ANNOTATION
from kubegpu.testing.apiserver import FakeApiServer, ServerThread, make_namespace
from tests.inspect import mig_cluster as mc
from tests.inspect.metrics_server import NodePage, serve_metrics

INFER_ON = mc.CARD2.mig_devices[1]  # a 3g.40gb
TRAIN_ON = mc.CARD1.mig_devices[3]  # one of its two 1g.10gb


def report(usage: dict[str, UsageResult] | None = None, **kwargs: Any) -> InspectReport:
    return build_report(mc.nodes(), mc.pods(), usage, **kwargs)


def node(r: InspectReport, name: str) -> NodeView:
    return next(n for n in r.nodes if n.name == name)


def kubelet_says(mig_pods: dict[str, frozenset[tuple[str, str]]]) -> dict[str, UsageResult]:
    return {"h100": UsageResult("h100", "http://x/metrics", NodeUsage(mig_pods=mig_pods))}


NAMED = kubelet_says(
    {INFER_ON.uuid: frozenset({("ml", "infer")}), TRAIN_ON.uuid: frozenset({("ml", "train")})}
)


def test_cards_in_mig_mode_are_listed_under_their_node_with_their_mig_devices() -> None:
    h100 = node(report(), "h100")
    assert [c.index for c in h100.cards] == [3]  # the whole card, from the inventory
    assert [(c.index, c.uuid, c.model) for c in h100.mig_cards] == [
        (g.index, g.uuid, g.product_name) for g in (mc.CARD0, mc.CARD1, mc.CARD2)
    ]
    card0 = h100.mig_cards[0]
    assert [
        (d.gpu_instance_id, d.profile, d.start, d.slices, d.memory_mib, d.resource)
        for d in card0.devices
    ] == [
        (1, "3g.40gb", 0, 4, 40448, mc.THREE_G),
        (2, "2g.20gb", 4, 2, 20096, mc.TWO_G),
        (3, "1g.10gb", 6, 1, 9984, mc.ONE_G),
    ]
    assert h100.mig_devices == 12
    # None of the MIG cards counts among the whole or shared cards.
    assert h100.totals.gpus == 1 and h100.totals.memory_mib == mc.CARD3.memory_total_mib


def test_without_usage_pods_asking_for_mig_devices_hold_instances_not_named() -> None:
    h100 = node(report(), "h100")
    assert not any(d.pods for c in h100.mig_cards for d in c.devices)
    assert h100.mig_requests == (
        MigRequest("ml", "infer", "Running", mc.THREE_G, "3g.40gb", 1, 40448),
        MigRequest("ml", "train", "Running", mc.ONE_G, "1g.10gb", 2, 9984),
        MigRequest("web", "encode", "Running", mc.TWO_G, "2g.20gb", 1, 20096),
    )
    assert h100.totals.pods == 4  # three on MIG devices and ml/whole on card 3
    assert [p.key for p in h100.cards[0].pods] == ["ml/whole"]


def test_with_usage_the_kubelets_word_names_each_pods_mig_device() -> None:
    h100 = node(report(NAMED), "h100")
    held = {d.uuid: [p.key for p in d.pods] for c in h100.mig_cards for d in c.devices}
    assert held[INFER_ON.uuid] == ["ml/infer"]
    assert held[TRAIN_ON.uuid] == ["ml/train"]
    assert sum(len(keys) for keys in held.values()) == 2
    # train asked for two and the kubelet names one: the other is still a request.
    assert [(r.key, r.count) for r in h100.mig_requests] == [("ml/train", 1), ("web/encode", 1)]
    assert h100.mig_cards[2].devices[1].pods[0].phase == "Running"


def test_under_single_a_plain_gpu_pod_holds_mig_devices_not_whole_cards() -> None:
    r = report()
    single = node(r, "single")
    assert single.cards == () and single.unplaced == ()
    assert single.mig_requests == (
        MigRequest("ml", "plain", "Running", "nvidia.com/gpu", "1g.10gb", 2, 9984),
    )
    assert single.totals.pods == 1
    assert not [w for w in r.warnings if w.node == "single"]


def test_an_unreadable_mig_annotation_is_a_warning_and_its_node_is_listed() -> None:
    r = report()
    broken = node(r, "broken")
    assert broken.mig_cards == () and "not JSON" in broken.mig_error
    (warning,) = [w for w in r.warnings if w.node == "broken"]
    assert warning.kind is WarningKind.INVALID_MIG_DEVICES
    assert MIG_DEVICES_ANNOTATION in warning.message


def test_an_unhealthy_mig_device_still_holding_a_pod_is_a_warning() -> None:
    nodes = mc.nodes()
    annotations = nodes[0]["metadata"]["annotations"]
    doc = json.loads(annotations[MIG_DEVICES_ANNOTATION])
    doc["gpus"][2]["migDevices"][1]["healthy"] = False
    annotations[MIG_DEVICES_ANNOTATION] = json.dumps(doc)
    r = build_report(nodes, mc.pods(), NAMED)
    (warning,) = [w for w in r.warnings if w.uuid == INFER_ON.uuid]
    assert warning.kind is WarningKind.UNHEALTHY_CARD_IN_USE
    assert "is unhealthy and still holds ml/infer" in warning.message


def test_a_namespace_filter_narrows_mig_pods_but_not_mig_devices() -> None:
    h100 = node(report(NAMED, filters=Filters(namespace="web")), "h100")
    assert h100.mig_devices == 12
    assert not any(d.pods for c in h100.mig_cards for d in c.devices)
    assert [r.key for r in h100.mig_requests] == ["web/encode"]
    assert h100.totals.pods == 1


def test_the_json_document_validates_and_carries_the_mig_devices() -> None:
    doc = report_to_json(report(NAMED))
    jsonschema.validate(doc, load_schema())
    h100 = next(n for n in doc["nodes"] if n["name"] == "h100")
    card2 = h100["migCards"][2]
    assert (card2["index"], card2["uuid"], card2["healthy"]) == (2, mc.CARD2.uuid, True)
    assert card2["migDevices"][1] == {
        "uuid": INFER_ON.uuid,
        "profile": "3g.40gb",
        "placementStart": 4,
        "placementSlices": 4,
        "memoryMiB": 40448,
        "gpuInstanceId": 2,
        "resource": mc.THREE_G,
        "healthy": True,
        "pods": [{"namespace": "ml", "name": "infer", "phase": "Running"}],
    }
    assert h100["migRequests"][0] == {
        "namespace": "ml",
        "name": "train",
        "phase": "Running",
        "resource": mc.ONE_G,
        "profile": "1g.10gb",
        "count": 1,
        "memoryMiB": 9984,
    }
    assert h100["migError"] == ""
    broken = next(n for n in doc["nodes"] if n["name"] == "broken")
    assert broken["migCards"] == [] and broken["migError"]


def test_the_schema_rejects_a_mig_device_without_its_placement() -> None:
    doc = report_to_json(report())
    del doc["nodes"][1]["migCards"][0]["migDevices"][0]["placementStart"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, load_schema())


def test_the_table_lists_mig_devices_under_their_card_and_the_pods_on_them() -> None:
    text = render_text(report(NAMED))
    lines = text.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("node h100"))
    assert lines[title].endswith("3 card(s) in MIG mode, 12 MIG device(s)")
    card2 = lines.index("  GPU 2 · NVIDIA H100 80GB HBM3 · 79.6Gi · in MIG mode · 2 MIG device(s)")
    assert lines[card2 + 2].split() == [
        "2",
        "GI",
        "2",
        "3g.40gb",
        "4:4",
        "39.5Gi",
        "ok",
        "ml/infer",
    ]
    assert "ml/train (a 1g.10gb instance; which one is not known)" in text
    assert "19 MIG device(s) on 4 card(s) in MIG mode" in text
    assert "node single · 1 card(s) in MIG mode, 7 MIG device(s)" in text
    assert "ml/plain (2 1g.10gb instances; which ones are not known)" in text


def test_the_wide_table_adds_each_mig_devices_resource_and_uuid() -> None:
    text = render_text(report(), wide=True)
    row = next(line for line in text.splitlines() if INFER_ON.uuid in line)
    assert row.split()[:8] == ["2", "GI", "2", "3g.40gb", "4:4", "39.5Gi", "ok", mc.THREE_G]


def test_the_exporter_page_names_the_pods_on_each_mig_device() -> None:
    page = NodePage(
        "h100",
        mig_allocated={
            ("ml", "infer", "main", 2, mc.CARD2.uuid, INFER_ON.uuid, "3g.40gb"): 1.0,
            ("ml", "infer", "side", 2, mc.CARD2.uuid, INFER_ON.uuid, "3g.40gb"): 1.0,
            ("ml", "gone", "main", 1, mc.CARD1.uuid, TRAIN_ON.uuid, "1g.10gb"): 0.0,
        },
    )
    usage = parse_exporter_metrics(page.render().decode())
    assert usage.mig_pods == {INFER_ON.uuid: frozenset({("ml", "infer")})}
    assert usage.pod_cards == {}


# -- the command against the fake API server -----------------------------------------------


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    with FakeApiServer().run_in_thread() as server:
        _fill(server)
        yield server.write_kubeconfig(tmp_path / "kubeconfig")


def _fill(server: ServerThread) -> None:
    for namespace in ("default", "ml", "web"):
        server.store.put("namespaces", make_namespace(namespace))
    for item in mc.nodes():
        server.store.put("nodes", item)
    for pod in mc.pods():
        server.store.put("pods", pod)


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["inspect", *args], catch_exceptions=False)


def test_kubegpu_inspect_shows_the_mig_devices_and_their_pods_from_the_exporter(
    kubeconfig: Path,
) -> None:
    page = NodePage(
        "h100",
        mig_allocated={("ml", "infer", "main", 2, mc.CARD2.uuid, INFER_ON.uuid, "3g.40gb"): 1.0},
    )
    with serve_metrics({"h100": page}) as metrics:
        result = run(
            "--kubeconfig",
            str(kubeconfig),
            "-o",
            "json",
            "--exporter-url-template",
            metrics.url + "/{node}/metrics",
            "--exporter-timeout",
            "5",
        )
        asked = set(metrics.requests)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, load_schema())
    assert {"/h100/metrics", "/single/metrics"} <= asked
    h100 = next(n for n in doc["nodes"] if n["name"] == "h100")
    held = {d["uuid"]: d["pods"] for c in h100["migCards"] for d in c["migDevices"]}
    assert held[INFER_ON.uuid] == [{"namespace": "ml", "name": "infer", "phase": "Running"}]
    assert [(r["name"], r["count"]) for r in h100["migRequests"]] == [("train", 2), ("encode", 1)]


def test_kubegpu_inspect_without_usage_lists_the_mig_devices_in_its_table(
    kubeconfig: Path,
) -> None:
    result = run("--kubeconfig", str(kubeconfig), "--no-usage", "--node", "h100")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "GPU 0 · NVIDIA H100 80GB HBM3 · 79.6Gi · in MIG mode · 3 MIG device(s)" in out
    assert "ml/infer (a 3g.40gb instance; which one is not known)" in out
    assert "web/encode (a 2g.20gb instance; which one is not known)" in out
    assert "node single" not in out
