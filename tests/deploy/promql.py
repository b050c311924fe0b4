"""The metric names a PromQL expression reads, and every expression kubegpu ships (the rules
file and the Grafana dashboard): what tests check against the metrics really served.

A small scanner, not a parser: PromQL's syntax is checked by the real ``promtool`` (see
test_monitoring.py); this only needs to tell metric names from functions, aggregation
operators, keywords, label names and Grafana's ``$variables``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
RULES = MONITORING / "kubegpu-rules.yaml"
DASHBOARD = MONITORING / "kubegpu-dashboard.json"

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'" + r"|`[^`]*`")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
# by (a, b), without (...), on (...), ignoring (...), group_left (...), group_right (...):
# the parentheses hold label names, not metrics.
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan", "Inf", "NaN", "atan2"}
)
_AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"}
    | {"bottomk", "topk", "quantile"}
)


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects (``foo`` in ``rate(foo{a="b"}[5m])``)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name in _KEYWORDS or name in _AGGREGATIONS:
            continue
        if re.fullmatch(r"\d.*", name):
            continue
        names.add(name)
    return names


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return groups


def rules() -> list[dict[str, Any]]:
    return [rule for group in rule_groups() for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for panel in panels:
        found.append(panel)
        found.extend(_panels(panel.get("panels", [])))
    return found


_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*\w+\)$")


def dashboard_exprs() -> dict[str, str]:
    """Where -> expression, for every panel target and every query variable."""
    board = dashboard()
    exprs = {}
    for panel in _panels(board["panels"]):
        for target in panel.get("targets", []):
            exprs[f"panel {panel['title']!r} target {target['refId']}"] = target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = _LABEL_VALUES.match(variable["query"]["query"])
        assert match, f"variable {variable['name']}: only label_values(<selector>, <label>)"
        exprs[f"variable {variable['name']}"] = match.group(1)
    return exprs


# Grafana's variables, as a query would receive them, so that promtool can parse the result.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "${datasource}": ""}


def as_promql(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return re.sub(r"\$\w+", ".*", expr)  # $node in a =~ matcher: every value
