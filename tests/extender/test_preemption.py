"""Preemption that sees cards, over real HTTP against the fake API server: kube-scheduler's
preempt verb, narrowed to victims that free a card, and the extender's own preemption for the
shares kube-scheduler's cannot help (victims marked and deleted, the pod nominated, the card
held for it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    AllocationDecision,
    CardShare,
    ContainerAllocation,
    decode_allocation,
    encode_allocation,
)
from kubegpu.testing.apiserver import FakeApiServer
from kubegpu.testing.waiting import wait_until_async
from tests.deploy.rbac import allowed, rbac_rules
from tests.extender.cluster import (
    filter_args,
    gpu_node,
    http_session,
    post,
    running_extender,
    shared_pod,
    whole_pod,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def placed(name: str, node: str, card: int, compute: int, priority: int) -> dict[str, Any]:
    """A share bound to ``card`` of ``node`` with its decision recorded, at ``priority``."""
    pod = shared_pod(name, memory_mib=1024, compute_milli=compute)
    share = CardShare(f"GPU-{node}-{card:02d}", card, compute, 1024)
    decision = AllocationDecision(
        node,
        (share,),
        (ContainerAllocation("main", False, (share,)),),
        "2026-01-01T00:00:00Z",
        "kubegpu",
        True,
    )
    pod["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: encode_allocation(decision)}
    pod["spec"].update(nodeName=node, priority=priority, terminationGracePeriodSeconds=30)
    pod["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    return pod


def waiting(name: str, compute: int, priority: int) -> dict[str, Any]:
    pod = shared_pod(name, memory_mib=1024, compute_milli=compute)
    pod["spec"]["priority"] = priority
    return pod


def uid(server: FakeApiServer, name: str) -> str:
    pod = server.store.get("pods", "default", name)
    assert pod is not None
    return str(pod["metadata"]["uid"])


def seed_two_cards(server: FakeApiServer) -> None:
    """Card 0: a 600-milli share at priority 5 beside a 400-milli one at 1000. Card 1: two
    500-milli shares at priority 10. A 900-milli share at 1000 fits only if both of card 1 go."""
    server.store.put("nodes", gpu_node("node-a", cards=2))
    for pod in (
        placed("low", "node-a", 0, 600, 5),
        placed("high", "node-a", 0, 400, 1000),
        placed("m1", "node-a", 1, 500, 10),
        placed("m2", "node-a", 1, 500, 10),
    ):
        server.store.put("pods", pod)


async def seen(ext: Any, *names: str) -> None:
    await wait_until_async(
        lambda: all(("default", n) in ext.view.pod_json for n in names),
        timeout_s=5,
        what=f"{names} seen",
    )


async def test_the_verb_swaps_victims_on_the_wrong_card_for_those_on_the_right_one() -> None:
    async with FakeApiServer() as server:
        seed_two_cards(server)
        async with running_extender(server) as ext, http_session() as http:
            server.store.put("pods", waiting("urgent", 900, 1000))
            await seen(ext, "low", "high", "m1", "m2", "urgent")
            pod = server.store.get("pods", "default", "urgent")
            # kube-scheduler's dry run counts slots: one pod frees one, it takes the lowest.
            body = {
                "Pod": pod,
                "NodeNameToVictims": None,
                "NodeNameToMetaVictims": {
                    "node-a": {"Pods": [{"UID": uid(server, "low")}], "NumPDBViolations": 0}
                },
            }
            status, reply = await post(http, f"{ext.url}/preempt", body)
            assert status == 200
            victims = reply["NodeNameToMetaVictims"]["node-a"]
            assert {v["UID"] for v in victims["Pods"]} == {uid(server, "m1"), uid(server, "m2")}
            assert victims["NumPDBViolations"] == 0
            # kube-scheduler deletes them; the card stays held for the preemptor meanwhile.
            for name in ("m1", "m2"):
                server.store.remove("pods", "default", name)
            await wait_until_async(
                lambda: (
                    ("default", "m2") not in ext.view.pod_json
                    and ("default", "urgent") in ext.view.pod_json
                ),
                timeout_s=5,
                what="victims gone, preemptor seen",
            )
            other = waiting("other", 500, 1)
            _, reply = await post(http, f"{ext.url}/filter", filter_args(other, ["node-a"]))
            assert reply["NodeNames"] == []
            urgent = server.store.get("pods", "default", "urgent")
            _, reply = await post(http, f"{ext.url}/filter", filter_args(urgent, ["node-a"]))
            assert reply["NodeNames"] == ["node-a"]


async def test_the_verb_frees_a_card_of_shares_for_a_whole_gpu_rather_than_a_busier_pod() -> None:
    # The node agent withdraws a card holding shares from nvidia.com/gpu, so kube-scheduler
    # counts the node full and proposes the only whole-GPU pod of lower priority. Evicting the
    # lower-priority share frees a card, and that card's whole GPU, as well.
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=2))
        server.store.put("pods", placed("notebook", "node-a", 0, 100, 5))
        trainer = placed("trainer", "node-a", 1, 1000, 10)
        card = CardShare("GPU-node-a-01", 1, 1000, 81920)
        whole = AllocationDecision(
            "node-a",
            (card,),
            (ContainerAllocation("main", False, (card,)),),
            "2026-01-01T00:00:00Z",
            "kubegpu",
            False,
        )
        trainer["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: encode_allocation(whole)}
        trainer["spec"]["containers"][0]["resources"] = {
            "requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {"nvidia.com/gpu": "1"},
        }
        server.store.put("pods", trainer)
        async with running_extender(server) as ext, http_session() as http:
            await seen(ext, "notebook", "trainer")
            urgent = whole_pod("urgent", 1)
            urgent["spec"]["priority"] = 1000
            body = {
                "Pod": urgent,
                "NodeNameToMetaVictims": {
                    "node-a": {"Pods": [{"UID": uid(server, "trainer")}], "NumPDBViolations": 0}
                },
            }
            _, reply = await post(http, f"{ext.url}/preempt", body)
            victims = reply["NodeNameToMetaVictims"]["node-a"]["Pods"]
            assert victims == [{"UID": uid(server, "notebook")}]
            # The share gone, the pod nominated there: kube-scheduler still counts the GPU short
            # until the node agent gives the card back, and proposes the whole-GPU pod again.
            # Its card is free; nothing more is evicted.
            server.store.remove("pods", "default", "notebook")
            await wait_until_async(
                lambda: ("default", "notebook") not in ext.view.pod_json,
                timeout_s=5,
                what="notebook's deletion seen",
            )
            urgent["status"] = {"nominatedNodeName": "node-a"}
            _, reply = await post(http, f"{ext.url}/preempt", body)
    assert reply == {"NodeNameToMetaVictims": {}}


async def test_the_verb_counts_budget_violations_of_the_victims_it_names() -> None:
    async with FakeApiServer() as server:
        seed_two_cards(server)
        for name in ("m1", "m2"):
            pod = server.store.get("pods", "default", name)
            assert pod is not None
            pod["metadata"]["labels"] = {"app": "notebook"}
            server.store.put("pods", pod)
        server.store.put(
            "poddisruptionbudgets",
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "notebooks", "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": "notebook"}}, "maxUnavailable": 1},
                "status": {"disruptionsAllowed": 1},
            },
        )
        async with running_extender(server) as ext, http_session() as http:
            await seen(ext, "m1", "m2")
            body = {
                "Pod": waiting("urgent", 900, 1000),
                "NodeNameToMetaVictims": {
                    "node-a": {"Pods": [{"UID": uid(server, "low")}], "NumPDBViolations": 0}
                },
            }
            _, reply = await post(http, f"{ext.url}/preempt", body)
    assert reply["NodeNameToMetaVictims"]["node-a"]["NumPDBViolations"] == 1


async def test_the_verb_leaves_out_a_node_where_no_card_can_be_freed() -> None:
    async with FakeApiServer() as server:
        seed_two_cards(server)
        async with running_extender(server) as ext, http_session() as http:
            await seen(ext, "low", "m1", "m2")
            body = {
                "Pod": waiting("modest", 900, 8),  # outranks only "low": card 0 stays 400 used
                "NodeNameToMetaVictims": {
                    "node-a": {"Pods": [{"UID": uid(server, "low")}], "NumPDBViolations": 0}
                },
            }
            status, reply = await post(http, f"{ext.url}/preempt", body)
            assert (status, reply) == (200, {"NodeNameToMetaVictims": {}})
            # Malformed: named for the field.
            status, reply = await post(
                http, f"{ext.url}/preempt", {"Pod": {}, "NodeNameToMetaVictims": {"node-a": 3}}
            )
    assert status == 400 and "NodeNameToMetaVictims[node-a]" in reply["Error"]


async def test_the_extender_preempts_for_a_share_kube_scheduler_cannot_help() -> None:
    async with FakeApiServer(graceful_pod_deletion=True) as server:
        seed_two_cards(server)
        server.store.put("pods", waiting("urgent", 900, 1000))
        async with running_extender(server) as ext, http_session() as http:
            ext.app.preemption.verb_grace_s = 0.05
            await seen(ext, "low", "high", "m1", "m2", "urgent")
            pod = server.store.get("pods", "default", "urgent")
            _, reply = await post(http, f"{ext.url}/filter", filter_args(pod, ["node-a"]))
            assert reply["NodeNames"] == []

            def nominated() -> bool:
                got = server.store.get("pods", "default", "urgent") or {}
                return (got.get("status") or {}).get("nominatedNodeName") == "node-a"

            await wait_until_async(nominated, timeout_s=5, what="urgent nominated to node-a")
            for name in ("m1", "m2"):
                victim = server.store.get("pods", "default", name)
                assert victim is not None and victim["metadata"].get("deletionTimestamp")
                conditions = {c["type"]: c for c in victim["status"]["conditions"]}
                assert conditions["DisruptionTarget"]["reason"] == "PreemptionByScheduler"
                assert "default/urgent" in conditions["DisruptionTarget"]["message"]
            for name in ("low", "high"):
                untouched = server.store.get("pods", "default", name)
                assert untouched is not None and not untouched["metadata"].get("deletionTimestamp")

            # Filtered again while its victims terminate: no second preemption.
            await post(http, f"{ext.url}/filter", filter_args(pod, ["node-a"]))
            # The victims go; a lower-priority share finds card 1 held for the preemptor.
            for name in ("m1", "m2"):
                server.store.remove("pods", "default", name)
            await wait_until_async(
                lambda: (
                    ("default", "m1") not in ext.view.pod_json
                    and ("default", "m2") not in ext.view.pod_json
                ),
                timeout_s=5,
                what="victims' deletion seen",
            )
            other = waiting("other", 500, 1)
            _, reply = await post(http, f"{ext.url}/filter", filter_args(other, ["node-a"]))
            assert reply["NodeNames"] == []
            # The preemptor itself fits there, and is bound to the freed card.
            _, reply = await post(http, f"{ext.url}/filter", filter_args(pod, ["node-a"]))
            assert reply["NodeNames"] == ["node-a"]
            status, bound = await post(
                http,
                f"{ext.url}/bind",
                {
                    "PodName": "urgent",
                    "PodNamespace": "default",
                    "PodUID": uid(server, "urgent"),
                    "Node": "node-a",
                },
            )
            assert (status, bound) == (200, {"Error": ""})
    final = server.store.get("pods", "default", "urgent")
    assert final is not None
    assert decode_allocation(
        final["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    ).gpu_indices == (1,)
    assert server.store.get("pods", "default", "low") is not None


async def test_no_preemption_when_turned_off_or_not_allowed() -> None:
    async with FakeApiServer(graceful_pod_deletion=True) as server:
        seed_two_cards(server)
        never = waiting("polite", 900, 1000)
        never["spec"]["preemptionPolicy"] = "Never"
        server.store.put("pods", never)
        server.store.put("pods", waiting("urgent", 900, 1000))
        async with running_extender(server, preemption=False) as ext, http_session() as http:
            ext.app.preemption.verb_grace_s = 0.01
            await seen(ext, "m1", "m2", "urgent", "polite")
            for name in ("urgent", "polite"):
                pod = server.store.get("pods", "default", name)
                await post(http, f"{ext.url}/filter", filter_args(pod, ["node-a"]))
            ext.app.preemption.enabled = True  # on now, but "polite" never preempts
            pod = server.store.get("pods", "default", "polite")
            await post(http, f"{ext.url}/filter", filter_args(pod, ["node-a"]))
            await wait_until_async(
                lambda: not ext.app.preemption._tasks, timeout_s=5, what="no decision pending"
            )
    for name in ("m1", "m2", "low"):
        pod = server.store.get("pods", "default", name)
        assert pod is not None and not pod["metadata"].get("deletionTimestamp")


async def test_every_request_of_a_preemption_is_one_the_shipped_rbac_allows() -> None:
    rules = list(rbac_rules(DEPLOY / "base" / "extender-clusterrole.yaml"))
    async with FakeApiServer(graceful_pod_deletion=True) as server:
        seed_two_cards(server)
        server.store.put("pods", waiting("urgent", 900, 1000))
        async with running_extender(server) as ext:
            await seen(ext, "m1", "m2", "urgent")
            done = await ext.app.preemption.preempt_for("default", "urgent", uid(server, "urgent"))
            assert done is not None and set(done.uids) == {uid(server, "m1"), uid(server, "m2")}
        requests = list(server.request_log)
    made = {(r.verb, r.resource, r.name) for r in requests}
    assert ("patch", "pods/status", "m1") in made and ("delete", "pods", "m2") in made
    assert ("patch", "pods/status", "urgent") in made
    assert ("list", "poddisruptionbudgets", None) in made
    assert [r for r in requests if not allowed(rules, r)] == []
