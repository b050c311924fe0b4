#!/usr/bin/env python3
"""Writes prometheusrule.yaml (the Prometheus Operator's PrometheusRule) from kubegpu-rules.yaml,
the one source of kubegpu's rules: the object's spec is the rules file's groups, unchanged.

    python3 deploy/monitoring/render_prometheusrule.py          # rewrite the object
    python3 deploy/monitoring/render_prometheusrule.py --check  # exit 1 when it is stale

tests/deploy/test_monitoring.py runs the check, so the two cannot drift.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "kubegpu-rules.yaml"
TARGET = HERE / "prometheusrule.yaml"
HEADER = (
    "# Generated from kubegpu-rules.yaml by render_prometheusrule.py: edit that file, then run\n"
    "#   python3 deploy/monitoring/render_prometheusrule.py\n"
    "# Part of deploy/overlays/monitoring (needs the Prometheus Operator's CRDs).\n"
)


def render(source: str) -> str:
    groups = yaml.safe_load(source)["groups"]
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "kubegpu",
            "labels": {"app.kubernetes.io/name": "kubegpu-rules"},
        },
        "spec": {"groups": groups},
    }
    return HEADER + yaml.safe_dump(rule, sort_keys=False, width=4096)


def main(argv: list[str]) -> int:
    wanted = render(SOURCE.read_text(encoding="utf-8"))
    if argv == ["--check"]:
        if not TARGET.exists() or TARGET.read_text(encoding="utf-8") != wanted:
            print(f"{TARGET} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    if argv:
        print(f"usage: {Path(__file__).name} [--check]", file=sys.stderr)
        return 2
    TARGET.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
