"""The peer webhook's ``matchConditions`` as shipped, and whether the API server would call the
webhook for a pod: the component's as kustomize renders it, the chart's as its template
writes it (the chart is rendered with the real helm only in e2e/tests/test_07_helm.py, which
also checks that both render the same)."""

from __future__ import annotations

import functools
import re
import textwrap
from typing import Any

import yaml

from tests.deploy.manifests import DEPLOY, find, render
from tests.webhook.cel import evaluate

CHART_TEMPLATE = DEPLOY / "helm" / "kubegpu" / "templates" / "peer-compat.yaml"
CONDITION = "asks-for-a-peer-gpu-resource"


@functools.cache
def shipped_expressions() -> dict[str, str]:
    """``{"component": ..., "chart": ...}``: the one match condition's CEL of each."""
    registration = find(
        render("examples/peer-compat"), "MutatingWebhookConfiguration", "kubegpu-peer-compat"
    )
    (webhook,) = registration["webhooks"]
    (component,) = webhook["matchConditions"]
    assert component["name"] == CONDITION
    # The template's matchConditions block has no template directives: it is YAML as it stands.
    text = CHART_TEMPLATE.read_text()
    found = re.search(r"^( *)matchConditions:\n((?:\1 .*\n)+)", text, re.M)
    assert found, f"no matchConditions in {CHART_TEMPLATE}"
    (chart,) = yaml.safe_load(textwrap.dedent(found.group(2)))
    assert chart["name"] == CONDITION
    return {"component": component["expression"], "chart": chart["expression"]}


def sends(expression: str, pod: dict[str, Any]) -> bool:
    """Whether the API server calls the webhook for ``pod`` (an evaluation error raises: under
    ``failurePolicy: Fail`` it would refuse the pod, whatever it asks for)."""
    result = evaluate(expression, object=pod)
    assert isinstance(result, bool), result
    return result
