"""deploy/monitoring: the rules file and its PrometheusRule hold the same groups and ship in the
monitoring overlay; every alert has a runbook in docs/troubleshooting.md and promtool tests
that make it fire and stay quiet; the real ``promtool`` accepts the rules, passes those tests
and parses every dashboard query.

promtool comes from Debian's ``prometheus`` package (``e2e/install-deps``). Without it these
tests skip, except under CI (``CI`` set), where a missing promtool fails; the e2e scenario
test_08_monitoring runs the same tool checks and never skips.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import find, render
from tests.deploy.promql import (
    MONITORING,
    RULES,
    alerts,
    as_promql,
    dashboard_exprs,
    metric_names,
    rule_groups,
)
from tests.tools import missing

REPO = Path(__file__).resolve().parents[2]
TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
PROMTOOL_TESTS = sorted((MONITORING / "tests").glob("*.test.yaml"))


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        missing("promtool not installed", "apt-get install prometheus, or e2e/install-deps")
    return found


def run_promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


# ------------------------------------------------------------------ one source, two forms


def test_the_prometheusrule_is_generated_from_the_rules_file() -> None:
    check = subprocess.run(
        [sys.executable, str(MONITORING / "render_prometheusrule.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stderr
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text(encoding="utf-8"))
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == rule_groups()


def test_the_monitoring_overlay_ships_the_prometheusrule_with_the_same_groups() -> None:
    rule = find(render("overlays/monitoring"), "PrometheusRule", "kubegpu")
    assert rule["metadata"]["namespace"] == "kubegpu"
    assert rule["spec"]["groups"] == rule_groups()


# ------------------------------------------------------------------ alerts and runbooks


def runbook_sections() -> dict[str, str]:
    """Alert name -> the text of its ``### <alert>`` section under "Alerts (runbooks)"."""
    text = TROUBLESHOOTING.read_text(encoding="utf-8")
    start = text.index("\n## Alerts (runbooks)\n")
    end = text.index("\n## ", start + 1)
    sections: dict[str, str] = {}
    for block in re.split(r"\n### ", text[start:end])[1:]:
        heading, _, body = block.partition("\n")
        sections[heading.strip()] = body.strip()
    return sections


def test_every_alert_links_to_its_runbook_section() -> None:
    sections = runbook_sections()
    for alert in alerts():
        name = alert["alert"]
        # GitHub's anchor for "### KubegpuGpuUnhealthy" is #kubegpugpuunhealthy.
        assert alert["annotations"]["runbook_url"] == f"docs/troubleshooting.md#{name.lower()}"
        assert name in sections, f"docs/troubleshooting.md has no runbook for {name}"
        steps = [line for line in sections[name].splitlines() if re.match(r"\d+\. ", line)]
        assert steps, f"the runbook of {name} lists no steps to take"


def test_no_runbook_section_names_an_alert_that_does_not_exist() -> None:
    assert set(runbook_sections()) == {alert["alert"] for alert in alerts()}


def test_the_runbook_check_above_can_fail() -> None:
    # A misspelt heading must not count as a runbook.
    assert "KubegpuGpuUnhealty" not in runbook_sections()


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_every_alert_has_a_severity_a_summary_and_a_description(alert: dict[str, Any]) -> None:
    assert alert["labels"]["severity"] in {"critical", "warning"}
    assert alert["annotations"]["summary"].strip()
    assert alert["annotations"]["description"].strip()


def promtool_cases() -> list[dict[str, Any]]:
    cases = []
    for path in PROMTOOL_TESTS:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert loaded["rule_files"] == ["../kubegpu-rules.yaml"], path
        for test in loaded["tests"]:
            cases.extend(test.get("alert_rule_test", []))
    return cases


def test_every_alert_has_promtool_tests_where_it_fires_and_where_it_stays_quiet() -> None:
    cases = promtool_cases()
    fires = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    names = {alert["alert"] for alert in alerts()}
    assert names - fires == set(), "alerts no promtool test makes fire"
    assert names - quiet == set(), "alerts no promtool test shows staying quiet"


# ------------------------------------------------------------------ the real promtool


def test_promtool_accepts_the_rules_file() -> None:
    done = run_promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule_groups())} rules found" in done.stdout


def test_promtool_rule_tests_pass() -> None:
    assert PROMTOOL_TESTS
    done = run_promtool("test", "rules", *(str(p) for p in PROMTOOL_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_rule_tests_fail_when_an_alert_does_not_fire_as_expected(
    tmp_path: Path,
) -> None:
    # The tests above can fail: the same tests against rules whose GPU alert never fires.
    broken = RULES.read_text(encoding="utf-8").replace(
        "expr: kubegpu_gpu_healthy == 0", "expr: kubegpu_gpu_healthy == 2"
    )
    (tmp_path / "kubegpu-rules.yaml").write_text(broken, encoding="utf-8")
    (tmp_path / "tests").mkdir()
    test = tmp_path / "tests" / "gpus.test.yaml"
    shutil.copy(MONITORING / "tests" / "gpus.test.yaml", test)
    done = run_promtool("test", "rules", str(test))
    assert done.returncode != 0
    assert "KubegpuGpuUnhealthy" in done.stdout + done.stderr


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    # promtool parses expressions only as rules: each query becomes a recording rule.
    exprs = dashboard_exprs()
    rules = [
        {"record": f"kubegpu:dashboard_query_{i}", "expr": as_promql(expr)}
        for i, expr in enumerate(exprs.values())
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = run_promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


# ------------------------------------------------------------------ the PromQL scanner


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up == 0", {"up"}),
        ('rate(foo_total{a="b", c=~"x|y"}[5m])', {"foo_total"}),
        ("sum by (node, uuid) (a) / on (uuid) group_left (model) b", {"a", "b"}),
        ("histogram_quantile(0.99, sum by (le) (rate(h_bucket[$__rate_interval])))", {"h_bucket"}),
        ("kubegpu:rec:ratio > 0.9 and kubegpu:rec:ratio <= 1", {"kubegpu:rec:ratio"}),
        ('count(x{node=~"$node"} == 0) or vector(0)', {"x"}),
        ('label_replace(m, "dst", "$1", "src", "(.*)")', {"m"}),
        ("max without (instance) (p) offset 5m", {"p"}),
        ("1e3 * m2", {"m2"}),
    ],
)
def test_metric_names_are_found_in_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
