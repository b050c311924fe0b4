"""docs/metrics.md lists every metric kubegpu emits, with the type and labels it really has.

The metrics are collected from the real collectors (the exporter's over the scenario in
``conftest.py``, with a failed refresh stage so the failure counter has a sample; the
extender's metric set over a fresh registry) and compared with the tables in the doc."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from kubegpu.core.health import HealthEvent, HealthEventKind
from kubegpu.extender.metrics import ExtenderMetrics
from kubegpu.extender.pending import PendingGpuPods
from kubegpu.sharing.resources import ResourceNames
from tests.exporter.conftest import Node
from tests.exporter.test_collector import registry_for
from tests.exporter.test_mig_metrics import mig_scrape

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
GPU_LABELS = {"node", "gpu", "uuid", "model"}
_ROW = re.compile(r"^\| `(kubegpu_[a-z_]+)` \| (\w+) \| [^|]* \| ([^|]*) \|", re.M)


def documented() -> dict[str, tuple[str, set[str]]]:
    """name -> (type, label names) from the doc's tables."""
    rows: dict[str, tuple[str, set[str]]] = {}
    for name, kind, labels in _ROW.findall(DOC.read_text(encoding="utf-8")):
        names: set[str] = set()
        # "`type` (`corrected`, `uncorrected`)": the parentheses list values, not labels.
        for part in re.sub(r"\([^)]*\)", "", labels).split(","):
            part = part.strip()
            if part == "GPU labels":
                names |= GPU_LABELS
            elif part.startswith("`"):
                names.add(part.split("`")[1])
        assert name not in rows, f"{name} is listed twice"
        rows[name] = (kind, names)
    return rows


def exposed_name(family: Metric) -> str:
    return family.name + "_total" if family.type == "counter" else family.name


def sample_labels(family: Metric) -> set[str] | None:
    """The label names of the family's samples (``None`` when it has none to tell by)."""
    names = {key for sample in family.samples for key in sample.labels} - {"le"}
    return names if family.samples else None


def exporter_families(node: Node) -> list[Metric]:
    node.health.count(HealthEvent(HealthEventKind.XID, node.uuids[0], xid=79))
    refresher = node.refresher(read_timeout_s=0.2)
    assert refresher.refresh_once()  # the fixture's scenario: every family has samples
    node.metrics.hang()  # the next read times out: kubegpu_exporter_refresh_failures
    try:
        assert not refresher.refresh_once()
    finally:
        node.metrics.release()
    # And a node with a card in MIG mode, whose MIG families the 4xT4 scenario lacks.
    mig = [f for f in mig_scrape(node)[0].collect() if "_mig_" in f.name]
    return [*registry_for(node, refresher).collect(), *mig]


def extender_families() -> list[Metric]:
    registry = CollectorRegistry(auto_describe=False)
    metrics = ExtenderMetrics(registry)
    metrics.latency.labels("filter").observe(0.01)
    metrics.decisions.labels("filter", "fits").inc()
    metrics.rejections.labels("no-gpu").inc()
    metrics.binds.labels("bound").inc()
    metrics.conflicts.inc()
    metrics.stale_binds.labels("none").inc()
    metrics.tentative.labels("made").inc()
    metrics.bad_requests.labels("bind").inc()
    metrics.refused.labels("busy").inc()
    registry.register(PendingGpuPods(list, ResourceNames(), lambda: True))  # as ExtenderApp does
    return [family for family in registry.collect() if family.name.startswith("kubegpu_")]


@pytest.mark.parametrize("source", ["exporter", "extender"])
def test_every_emitted_metric_is_documented_with_its_type_and_labels(
    source: str, node: Node
) -> None:
    families = exporter_families(node) if source == "exporter" else extender_families()
    rows = documented()
    emitted = {exposed_name(family) for family in families}
    missing = sorted(emitted - set(rows))
    assert not missing, f"docs/metrics.md does not list {missing}"
    for family in families:
        kind, labels = rows[exposed_name(family)]
        assert kind == family.type, family.name
        found = sample_labels(family)
        if found is not None:
            assert found == labels, (family.name, found, labels)


def test_the_doc_lists_no_metric_that_is_not_emitted(node: Node) -> None:
    emitted = {exposed_name(f) for f in [*exporter_families(node), *extender_families()]}
    stale = sorted(set(documented()) - emitted)
    assert not stale, f"docs/metrics.md lists metrics nothing emits: {stale}"


def test_every_exporter_family_had_samples_to_check_labels_by(node: Node) -> None:
    # Guards the label check above: a family without samples would pass unchecked.
    empty = [f.name for f in exporter_families(node) if not f.samples]
    assert not empty, empty
