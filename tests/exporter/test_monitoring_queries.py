"""Every metric the shipped rules and Grafana dashboard query is one kubegpu really serves.

The served names come from the real collectors (the exporter's over the scenario of
``conftest.py``, the extender's metric set; the same families the docs/metrics.md test reads),
as the sample names Prometheus stores: counters with ``_total``, histograms as ``_bucket``,
``_sum`` and ``_count``. Recording rules' names and Prometheus's own series are allowed too."""

from __future__ import annotations

import pytest

from tests.deploy.promql import dashboard_exprs, metric_names, recorded_names, rules
from tests.exporter.conftest import Node
from tests.exporter.test_metrics_doc import exporter_families, extender_families

# Series Prometheus makes itself: target health and the alerts it evaluates.
PROMETHEUS_OWN = frozenset({"up", "ALERTS"})


def served(node: Node) -> set[str]:
    families = [*exporter_families(node), *extender_families()]
    return {sample.name for family in families for sample in family.samples}


def unknown_metrics(exprs: dict[str, str], node: Node) -> dict[str, set[str]]:
    known = served(node) | recorded_names() | PROMETHEUS_OWN
    return {
        where: names - known
        for where, expr in exprs.items()
        if (names := metric_names(expr)) - known
    }


def test_the_dashboard_queries_only_served_metrics(node: Node) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) > 20  # every panel was found
    assert unknown_metrics(exprs, node) == {}


def test_the_rules_query_only_served_metrics(node: Node) -> None:
    exprs = {rule.get("alert") or rule["record"]: rule["expr"] for rule in rules()}
    assert unknown_metrics(exprs, node) == {}


def test_every_served_family_is_on_the_dashboard(node: Node) -> None:
    # The dashboard covers the metrics; a new one should get a panel (or be named here).
    used = set().union(*(metric_names(e) for e in dashboard_exprs().values()))
    used |= set().union(*(metric_names(r["expr"]) for r in rules() if r.get("record") in used))
    families = [*exporter_families(node), *extender_families()]
    missing = {
        family.name
        for family in families
        if not any(sample.name in used for sample in family.samples)
    }
    assert missing == set()


@pytest.mark.parametrize("name", ["kubegpu_gpu_memry_used_bytes", "kubegpu_gpu_xid_errors"])
def test_a_misspelt_or_unsuffixed_metric_is_caught(name: str, node: Node) -> None:
    assert unknown_metrics({"panel": f"sum({name})"}, node) == {"panel": {name}}
