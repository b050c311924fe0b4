"""The peer webhook's ``matchConditions``, evaluated: every pod asking for any resource of the
peers (served or not, in limits or requests, in any container) reaches the webhook, and no other
pod does or makes the expression fail (under ``failurePolicy: Fail`` an evaluation error would
refuse that pod). The component's expression and the chart's are the same text, and name
exactly the resources :mod:`kubegpu.sharing.peers` knows."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kubegpu.sharing.peers import ALIYUN, VOLCANO, peer_compat
from tests.webhook.cel import CelError, CelSyntaxError, evaluate
from tests.webhook.match_conditions import sends, shipped_expressions

EXPRESSIONS = sorted(shipped_expressions().items())
ALL_PEER_RESOURCES = {r for peer in peer_compat([VOLCANO, ALIYUN]) for r in peer.resources}


def test_the_chart_and_the_component_ship_one_expression() -> None:
    expressions = shipped_expressions()
    assert expressions["chart"] == expressions["component"]


def test_the_expression_names_exactly_the_peer_resources_kubegpu_knows() -> None:
    quoted = set(re.findall(r"'([^']*)'", shipped_expressions()["component"]))
    assert quoted - {"limits", "requests"} == ALL_PEER_RESOURCES


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init is not None:
        spec["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "n"}, "spec": spec}


def asking(part: str, amounts: dict[str, str], name: str = "c") -> dict[str, Any]:
    return {"name": name, "image": "i", "resources": {part: amounts}}


PLAIN = {"name": "plain", "image": "i"}


@pytest.mark.parametrize(
    "spec",
    [
        pod(PLAIN),
        pod({**PLAIN, "resources": {}}),
        pod(asking("limits", {"cpu": "1", "memory": "1Gi"})),
        pod(asking("requests", {"cpu": "1"})),
        pod(asking("limits", {"nvidia.com/gpu": "1"})),
        pod(asking("limits", {"kubegpu.io/gpu-memory": "1024", "kubegpu.io/gpu-compute": "100"})),
        pod(asking("limits", {"example.com/volcano.sh-gpu-memory": "1"})),
        pod(PLAIN, init=[]),
        pod(PLAIN, init=[PLAIN, asking("limits", {"cpu": "1"})]),
        pod(asking("limits", {})),
    ],
    ids=[
        "no-resources",
        "empty-resources",
        "cpu-memory",
        "requests-only-cpu",
        "whole-gpu",
        "kubegpu-share",
        "look-alike-name",
        "empty-init-list",
        "plain-init-containers",
        "empty-limits",
    ],
)
@pytest.mark.parametrize(("where", "expression"), EXPRESSIONS)
def test_pods_asking_for_no_peer_resource_never_reach_the_webhook(
    where: str, expression: str, spec: dict[str, Any]
) -> None:
    assert sends(expression, spec) is False


@pytest.mark.parametrize("resource", sorted(ALL_PEER_RESOURCES))
@pytest.mark.parametrize(("where", "expression"), EXPRESSIONS)
def test_a_peer_resource_anywhere_in_the_pod_reaches_the_webhook(
    where: str, expression: str, resource: str
) -> None:
    # Behind other containers, in requests or limits, in the second init container.
    for part in ("limits", "requests"):
        gpu = asking(part, {"cpu": "1", resource: "1"}, "gpu")
        for spec in (
            pod(PLAIN, gpu),
            pod(PLAIN, init=[PLAIN, gpu]),
            pod(asking("limits", {"cpu": "1"}), init=[gpu]),
        ):
            assert sends(expression, spec) is True, (part, spec)


# The evaluator agrees with CEL where the expression relies on it, and refuses what it does not
# know rather than guess.
def test_the_evaluator_follows_cel_on_missing_fields_and_error_absorbing_logic() -> None:
    obj = {"a": {"b": 1}, "m": {"k": "v"}, "l": ["x"]}
    assert evaluate("has(object.a.b)", object=obj) is True
    assert evaluate("has(object.a.c)", object=obj) is False
    with pytest.raises(CelError, match="no such key"):
        evaluate("object.a.c", object=obj)
    # An error on one side of || (&&) is absorbed when the other side is true (false).
    assert evaluate("object.a.c || true", object=obj) is True
    assert evaluate("true && object.a.c in object.l || 'k' in object.m", object=obj) is True
    with pytest.raises(CelError):
        evaluate("object.a.c || false", object=obj)
    assert evaluate("object.m.exists(k, k in ['k'])", object=obj) is True
    assert evaluate("(object.l + []).exists(e, e in object.m)", object=obj) is False
    assert evaluate("has(object.z) ? object.z : object.l", object=obj) == ["x"]
    for unknown in ("object.l.size()", "size(object.l)", "object.a.b == 1", "!true"):
        with pytest.raises(CelSyntaxError):
            evaluate(unknown, object=obj)
