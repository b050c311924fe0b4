"""Every request the node agent makes in shared mode is one its shipped RBAC grants: a real
``kubegpu device-plugin`` process (sharing on, so the coordinator lists and watches its node's
pods, records and reconciles shares and whole cards, and publishes the inventory) against the
fake API server, each request it logged checked against ``deploy/base/node-agent-rbac.yaml``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubegpu.sharing.annotations import INVENTORY_ANNOTATION
from kubegpu.sharing.ledger import ALLOCATED_ANNOTATION, decode_ledger
from kubegpu.testing.apiserver.server import RequestRecord
from tests.deploy.manifests import DEPLOY
from tests.deploy.rbac import allowed, rbac_rules
from tests.kubelet.sharenode import NODE, WHOLE, SharedNode, ShareSpec, ready_shared_node

NODE_AGENT_RBAC = DEPLOY / "base" / "node-agent-rbac.yaml"


@pytest.fixture
def node() -> Iterator[SharedNode]:
    with ready_shared_node() as shared:
        yield shared


def request_log(node: SharedNode) -> list[RequestRecord]:
    async def copy() -> list[RequestRecord]:
        # On the server's loop: the deque is appended there.
        return list(node.api.server.request_log)

    return node.api.call(copy)


def annotations(node: SharedNode, resource: str, name: str) -> dict[str, str]:
    """Read from the store, not over HTTP: the test's own requests must not enter the log."""
    namespace = None if resource == "nodes" else "default"
    stored = node.api.store.get(resource, namespace, name) or {}
    return dict(stored.get("metadata", {}).get("annotations") or {})


def verified(node: SharedNode, pod: str) -> bool:
    raw = annotations(node, "pods", pod).get(ALLOCATED_ANNOTATION)
    return raw is not None and all(c.verified for c in decode_ledger(raw).containers)


def test_every_request_the_node_agent_makes_is_one_its_rbac_allows(node: SharedNode) -> None:
    uid = node.add_shared_pod("a", 0, [ShareSpec("main", 300, 3000)])
    node.allocate_share(uid, "a", "main")
    node.wait_until(lambda: verified(node, "a"), "pod a's share recorded and verified")
    uid = node.add_whole_pod("w", [1])
    node.kubelet.allocate(WHOLE, 1, pod_uid=uid, pod_name="w", container="main")
    node.wait_until(
        lambda: any(r.verb == "watch" and r.resource == "pods" for r in request_log(node)),
        "the coordinator watching its node's pods",
    )
    node.wait_until(
        lambda: INVENTORY_ANNOTATION in annotations(node, "nodes", NODE),
        "inventory annotation published",
    )
    requests = request_log(node)
    rules = list(rbac_rules(NODE_AGENT_RBAC))
    assert [(r.verb, r.resource, r.name) for r in requests if not allowed(rules, r)] == []
    made = {(r.verb, r.resource) for r in requests}
    # It really exercised what the rules are for: its Node, its pods' list, watch and records.
    assert {("patch", "nodes"), ("list", "pods"), ("watch", "pods"), ("patch", "pods")} <= made
    watch = next(r for r in requests if r.verb == "watch" and r.resource == "pods")
    assert watch.params.get("fieldSelector") == f"spec.nodeName={NODE}"
    # The check can fail: the ClusterRole of an older release (pods: list, patch) refuses the
    # watch, which made the agent fall back to listing every syncIntervalS.
    without_watch = [
        (ns, {**rule, "verbs": [v for v in rule["verbs"] if v != "watch"]}) for ns, rule in rules
    ]
    assert not allowed(without_watch, watch)
