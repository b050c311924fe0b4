"""filter / prioritize / bind over real HTTP, with payloads shaped like kube-scheduler's, against
the fake API server through lightkube."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kubegpu.placement.model import PodRequest
from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION, decode_allocation
from kubegpu.testing.apiserver import FakeApiServer, make_pod
from kubegpu.testing.waiting import wait_until_async
from tests.extender.cluster import (
    COMPUTE,
    MEMORY,
    SLOT,
    filter_args,
    gpu_node,
    http_session,
    post,
    running_extender,
    shared_pod,
    whole_pod,
)


def seed(server: FakeApiServer, *objects: tuple[str, dict[str, Any]]) -> None:
    for resource, obj in objects:
        server.store.put(resource, obj)


def stored_pod(server: FakeApiServer, name: str) -> dict[str, Any]:
    pod = server.store.get("pods", "default", name)
    assert pod is not None
    return pod


async def test_unschedulable_pod_gets_a_reason_for_every_node() -> None:
    async with FakeApiServer() as server:
        seed(
            server,
            ("nodes", gpu_node("node-a", cards=2, memory_mib=6144)),
            ("nodes", gpu_node("node-b", cards=1, memory_mib=16384, cpu="1")),
            (
                "nodes",
                {
                    "metadata": {"name": "node-c"},
                    "status": {"allocatable": {"cpu": "8", "memory": "8Gi"}},
                },
            ),
        )
        async with running_extender(server) as ext, http_session() as http:
            pod = shared_pod("big", memory_mib=10240, compute_milli=300, cpu="2")
            status, body = await post(
                http,
                f"{ext.url}/filter",
                filter_args(pod, ["node-a", "node-b", "node-c", "node-x"]),
            )
    assert status == 200
    assert body["NodeNames"] == [] and body["Nodes"] is None and body["Error"] == ""
    unresolvable = body["FailedAndUnresolvableNodes"]
    failed = body["FailedNodes"]
    assert unresolvable == {
        "node-a": "node(s) have no card with 10240 MiB of GPU memory in total",
        "node-c": "node(s) have no GPU inventory published (annotation kubegpu.io/gpu-inventory "
        "missing: is the kubegpu node agent running there?)",
    }
    assert failed == {
        "node-b": "node(s) have less than 2000 milli-CPU free",
        "node-x": "node(s) not yet seen by the kubegpu extender's node watch",
    }


async def test_filter_names_the_largest_free_card_when_memory_is_taken() -> None:
    async with FakeApiServer() as server:
        seed(server, ("nodes", gpu_node("node-a", cards=1, memory_mib=16384)))
        async with running_extender(server, policy="binpack") as ext, http_session() as http:
            pod = shared_pod("next", memory_mib=8192, compute_milli=100)
            server.store.put("pods", pod)
            await eventually_seen(ext, "next")
            _, first = await post(http, f"{ext.url}/filter", filter_args(pod, ["node-a"]))
            assert first["NodeNames"] == ["node-a"]
            status, body = await post(
                http,
                f"{ext.url}/bind",
                {
                    "PodName": "next",
                    "PodNamespace": "default",
                    "PodUID": stored_pod(server, "next")["metadata"]["uid"],
                    "Node": "node-a",
                },
            )
            assert (status, body) == (200, {"Error": ""})
            again = shared_pod("again", memory_mib=10240, compute_milli=100)
            _, second = await post(http, f"{ext.url}/filter", filter_args(again, ["node-a"]))
    assert second["FailedNodes"] == {
        "node-a": "node(s) have no card with 100 milli of GPU compute and 10240 MiB of GPU memory "
        "free"
    }


async def test_bind_records_the_decision_then_binds_the_pod() -> None:
    async with FakeApiServer() as server:
        seed(
            server,
            ("nodes", gpu_node("node-a", cards=4)),
            ("pods", whole_pod("train", 2)),
            ("pods", shared_pod("infer", 10240, 300)),
        )
        async with running_extender(server) as ext, http_session() as http:
            for name in ("train", "infer"):
                uid = stored_pod(server, name)["metadata"]["uid"]
                status, body = await post(
                    http,
                    f"{ext.url}/bind",
                    {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": "node-a"},
                )
                assert (status, body) == (200, {"Error": ""})
    train = stored_pod(server, "train")
    infer = stored_pod(server, "infer")
    assert train["spec"]["nodeName"] == infer["spec"]["nodeName"] == "node-a"
    whole = decode_allocation(train["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    share = decode_allocation(infer["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    assert not whole.shared and len(whole.cards) == 2
    assert all(c.compute_milli == 1000 and c.gpu_memory_mib == 81920 for c in whole.cards)
    assert share.shared and share.cards[0].compute_milli == 300
    assert share.cards[0].gpu_memory_mib == 10240
    assert share.cards[0].uuid not in whole.gpu_uuids  # never on a card given away whole
    assert [c.name for c in share.containers] == ["main"]
    assert share.node == whole.node == "node-a"
    assert share.policy == "kubegpu" and share.decided_at.endswith("Z")


async def test_prioritize_answers_a_host_priority_list_within_the_extender_range() -> None:
    async with FakeApiServer() as server:
        busy = shared_pod("busy", 40960, 500)
        seed(
            server,
            ("nodes", gpu_node("node-a", cards=2)),
            ("nodes", gpu_node("node-b", cards=2)),
            ("pods", busy),
        )
        async with running_extender(server, policy="binpack") as ext, http_session() as http:
            uid = stored_pod(server, "busy")["metadata"]["uid"]
            await post(
                http,
                f"{ext.url}/bind",
                {"PodName": "busy", "PodNamespace": "default", "PodUID": uid, "Node": "node-b"},
            )
            pod = shared_pod("next", 8192, 200)
            status, body = await post(
                http, f"{ext.url}/prioritize", filter_args(pod, ["node-a", "node-b"])
            )
            _, spread = await post(http, f"{ext.url}/filter", filter_args(pod, ["node-a"]))
    assert status == 200
    assert {entry["Host"] for entry in body} == {"node-a", "node-b"}
    assert all(set(entry) == {"Host", "Score"} and 0 <= entry["Score"] <= 10 for entry in body)
    scores = {entry["Host"]: entry["Score"] for entry in body}
    assert scores["node-b"] > scores["node-a"]  # binpack prefers the partly used node
    assert spread["NodeNames"] == ["node-a"]


async def test_spread_policy_prefers_the_emptier_node_and_card() -> None:
    async with FakeApiServer() as server:
        seed(
            server,
            ("nodes", gpu_node("node-a", cards=2)),
            ("nodes", gpu_node("node-b", cards=2)),
            ("pods", shared_pod("one", 20480, 500)),
            ("pods", shared_pod("two", 20480, 500)),
        )
        async with running_extender(server, policy="spread") as ext, http_session() as http:
            for name in ("one", "two"):
                uid = stored_pod(server, name)["metadata"]["uid"]
                _, body = await post(
                    http,
                    f"{ext.url}/bind",
                    {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": "node-b"},
                )
                assert body == {"Error": ""}
            _, scores = await post(
                http,
                f"{ext.url}/prioritize",
                filter_args(shared_pod("x", 1024, 100), ["node-a", "node-b"]),
            )
    one = decode_allocation(
        stored_pod(server, "one")["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    )
    two = decode_allocation(
        stored_pod(server, "two")["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    )
    assert one.cards[0].index != two.cards[0].index
    by_host = {e["Host"]: e["Score"] for e in scores}
    assert by_host["node-a"] > by_host["node-b"]


async def test_non_gpu_pods_pass_through_untouched() -> None:
    async with FakeApiServer() as server:
        seed(
            server, ("nodes", gpu_node("node-a")), ("pods", make_pod("web", requests={"cpu": "1"}))
        )
        async with running_extender(server) as ext, http_session() as http:
            pod = stored_pod(server, "web")
            _, filtered = await post(http, f"{ext.url}/filter", filter_args(pod, ["node-a", "n2"]))
            _, scores = await post(http, f"{ext.url}/prioritize", filter_args(pod, ["node-a"]))
            _, bound = await post(
                http,
                f"{ext.url}/bind",
                {
                    "PodName": "web",
                    "PodNamespace": "default",
                    "PodUID": pod["metadata"]["uid"],
                    "Node": "node-a",
                },
            )
    assert filtered["NodeNames"] == ["node-a", "n2"] and filtered["FailedNodes"] == {}
    assert scores == []
    assert bound == {"Error": ""}
    web = stored_pod(server, "web")
    assert web["spec"]["nodeName"] == "node-a"
    assert ALLOCATION_ANNOTATION not in web["metadata"].get("annotations", {})


async def test_full_node_objects_are_echoed_back_when_not_cache_capable() -> None:
    async with FakeApiServer() as server:
        a, b = gpu_node("node-a", cards=1, memory_mib=8192), gpu_node("node-b", cards=1)
        seed(server, ("nodes", a), ("nodes", b))
        async with running_extender(server) as ext, http_session() as http:
            pod = shared_pod("p", 10240, 100)
            args = {"Pod": pod, "Nodes": {"metadata": {}, "items": [a, b]}, "NodeNames": None}
            _, body = await post(http, f"{ext.url}/filter", args)
    assert body["NodeNames"] is None
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["node-b"]
    assert set(body["FailedAndUnresolvableNodes"]) == {"node-a"}


@pytest.mark.parametrize(
    ("limits", "needle"),
    [
        ({"nvidia.com/gpu": "1", MEMORY: "1024", COMPUTE: "100", SLOT: "1"}, "one or the other"),
        ({MEMORY: "1024", COMPUTE: "1500", SLOT: "1"}, "must fit on one card"),
        ({MEMORY: "1024", COMPUTE: "100"}, f"exactly 1 {SLOT}"),
        ({MEMORY: "1024", SLOT: "1"}, "needs both"),
    ],
    ids=["whole-and-shared", "more-than-a-card", "no-slot", "memory-only"],
)
async def test_unservable_requests_are_refused_on_every_node_with_the_reason(
    limits: dict[str, str], needle: str
) -> None:
    async with FakeApiServer() as server:
        seed(server, ("nodes", gpu_node("node-a")))
        async with running_extender(server) as ext, http_session() as http:
            pod = make_pod("bad", limits=limits)
            pod["metadata"]["uid"] = "u-bad"
            _, body = await post(http, f"{ext.url}/filter", filter_args(pod, ["node-a"]))
    assert body["NodeNames"] == []
    assert needle in body["FailedAndUnresolvableNodes"]["node-a"]


async def test_bind_of_a_pod_that_no_longer_fits_returns_the_reason() -> None:
    async with FakeApiServer() as server:
        seed(
            server,
            ("nodes", gpu_node("node-a", cards=1)),
            ("pods", whole_pod("first", 1)),
            ("pods", whole_pod("second", 1)),
        )
        async with running_extender(server) as ext, http_session() as http:
            errors = []
            for name in ("first", "second"):
                uid = stored_pod(server, name)["metadata"]["uid"]
                _, body = await post(
                    http,
                    f"{ext.url}/bind",
                    {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": "node-a"},
                )
                errors.append(body["Error"])
    assert errors == ["", "node-a: needs 1 whole GPUs, 0 free"]
    assert stored_pod(server, "second")["spec"].get("nodeName") is None


async def test_probes_and_metrics() -> None:
    async with FakeApiServer() as server:
        seed(server, ("nodes", gpu_node("node-a")))
        async with running_extender(server) as ext, http_session() as http:
            await post(
                http, f"{ext.url}/filter", filter_args(shared_pod("p", 1 << 20, 100), ["node-a"])
            )
            async with http.get(f"{ext.url}/healthz") as r:
                assert r.status == 200
            async with http.get(f"{ext.url}/readyz") as r:
                assert r.status == 200
            async with http.get(f"{ext.url}/metrics") as r:
                text = await r.text()
    assert 'kubegpu_extender_request_duration_seconds_count{verb="filter"} 1.0' in text
    assert 'kubegpu_extender_node_rejections_total{reason="gpu-memory"} 1.0' in text
    assert 'kubegpu_extender_decisions_total{outcome="unschedulable",verb="filter"} 1.0' in text


async def test_a_card_turning_unhealthy_is_withdrawn_without_rebuilding_the_engine() -> None:
    async with FakeApiServer() as server:
        seed(server, ("nodes", gpu_node("node-a", cards=2)))
        async with running_extender(server) as ext, http_session() as http:
            pod = whole_pod("w", 2)
            _, before = await post(http, f"{ext.url}/filter", filter_args(pod, ["node-a"]))
            rebuilds = ext.scheduler.rebuilds
            server.store.put("nodes", gpu_node("node-a", cards=2, unhealthy=[1]))

            def withdrawn() -> bool:
                info = ext.view.nodes["node-a"]
                return info.inventory is not None and not info.inventory.gpus[1].healthy

            await wait_until_async(withdrawn, timeout_s=10, what="card 1 of node-a unhealthy")
            _, after = await post(http, f"{ext.url}/filter", filter_args(pod, ["node-a"]))
            _, share = await post(
                http, f"{ext.url}/filter", filter_args(shared_pod("s", 1024, 100), ["node-a"])
            )
            assert ext.scheduler.rebuilds == rebuilds
    assert before["NodeNames"] == ["node-a"]
    assert after["FailedAndUnresolvableNodes"] == {
        "node-a": "node(s) have fewer than 2 healthy GPUs"
    }
    assert share["NodeNames"] == ["node-a"]  # the healthy card still takes shares


@pytest.mark.parametrize("policy", ["fgd", "kubegpu"])
async def test_fragmentation_policies_take_a_configured_target_workload(
    policy: str, tmp_path: Path
) -> None:
    workload = tmp_path / "workload.yaml"
    workload.write_text(
        "pods:\n"
        "  - {cpuMilli: 1000, gpuMilli: 500, gpuCount: 1, weight: 3}\n"
        "  - {cpuMilli: 4000, gpuMilli: 1000, gpuCount: 2, weight: 1}\n"
    )
    async with FakeApiServer() as server:
        seed(
            server,
            ("nodes", gpu_node("node-a", cards=2)),
            ("nodes", gpu_node("node-b", cards=4)),
            ("pods", shared_pod("p", 8192, 500)),
        )
        async with (
            running_extender(server, policy=policy, workload_file=workload) as ext,
            http_session() as http,
        ):
            _, scores = await post(
                http,
                f"{ext.url}/prioritize",
                filter_args(stored_pod(server, "p"), ["node-a", "node-b"]),
            )
            uid = stored_pod(server, "p")["metadata"]["uid"]
            _, bound = await post(
                http,
                f"{ext.url}/bind",
                {"PodName": "p", "PodNamespace": "default", "PodUID": uid, "Node": "node-b"},
            )
    assert {s["Host"] for s in scores} == {"node-a", "node-b"}
    assert bound == {"Error": ""}
    decision = decode_allocation(
        stored_pod(server, "p")["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    )
    assert decision.policy == policy and decision.cards[0].compute_milli == 500


def test_a_bad_workload_file_names_the_entry() -> None:
    import tempfile

    from kubegpu.config.extender import ExtenderConfigError, load_workload

    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as handle:
        handle.write("pods:\n  - {cpuMilli: 1000, gpuMilli: 500}\n")
        handle.flush()
        with pytest.raises(ExtenderConfigError, match=r"pods\[0\]: 'weight'"):
            load_workload(Path(handle.name))


def test_workload_file_models_compare_in_the_label_spelling(tmp_path: Path) -> None:
    from kubegpu.config.extender import load_workload

    path = tmp_path / "workload.yaml"
    path.write_text(
        "pods:\n"
        "  - {cpuMilli: 1000, gpuMilli: 500, weight: 2, models: [Tesla T4]}\n"
        "  - {cpuMilli: 1000, gpuMilli: 500, weight: 1, models: [Tesla-T4]}\n"
    )
    (typical,) = load_workload(path).pods  # one class: both entries name the same model
    assert typical.gpu_models == frozenset({"Tesla-T4"}) and typical.weight == 1.0


async def test_a_pods_request_is_read_again_whenever_its_json_differs() -> None:
    # The extender remembers each pod's parsed request under its JSON bytes (kube-scheduler
    # sends the same bytes to filter and then prioritize): any change must be seen.
    async with FakeApiServer() as server:
        seed(server, ("nodes", gpu_node("node-a", cards=2)))
        async with running_extender(server) as ext, http_session() as http:
            bad = make_pod("p", limits={MEMORY: "1024", COMPUTE: "1500", SLOT: "1"})
            good = make_pod("p", limits={MEMORY: "1024", COMPUTE: "500", SLOT: "1"})
            answers = []
            for pod in (bad, good, bad, good):
                raw = msgspec.json.encode(filter_args(pod, ["node-a"]))
                for verb in ("filter", "prioritize"):
                    async with http.post(
                        f"{ext.url}/{verb}", data=raw, headers={"Content-Type": "application/json"}
                    ) as response:
                        answers.append(await response.json())
    refused, passed, prioritized = answers[0], answers[2], answers[3]
    assert refused["NodeNames"] == [] and answers[1] == []
    assert "must fit on one card" in refused["FailedAndUnresolvableNodes"]["node-a"]
    assert passed["NodeNames"] == ["node-a"] and passed["FailedAndUnresolvableNodes"] == {}
    assert [entry["Host"] for entry in prioritized] == ["node-a"]
    assert answers[4:] == answers[:4]


async def test_a_node_over_its_cpu_is_reported_with_none_free_not_a_negative_amount() -> None:
    async with FakeApiServer() as server:
        # Placed by another scheduler (or allocatable shrank under it): 3 CPUs on a 2-CPU node.
        busy = whole_pod("busy", 0, cpu="3")
        busy["spec"]["nodeName"] = "node-a"
        seed(server, ("nodes", gpu_node("node-a", cpu="2")), ("pods", busy))
        async with running_extender(server) as ext, http_session() as http:
            await eventually_seen(ext, "busy")
            pods = [whole_pod("one", 1, cpu="1"), shared_pod("two", 1024, 100, cpu="1")]
            reasons = []
            for pod in pods:
                _, body = await post(http, f"{ext.url}/filter", filter_args(pod, ["node-a"]))
                reasons.append(body["FailedNodes"]["node-a"])
            # The node's own figures are in the one-node reason (bind's error, kubectl gpu).
            engine = ext.scheduler.engine()
            one_node = [
                engine.explain("node-a", PodRequest(1000, 0, n, m)).reason
                for n, m in ((1, 1000), (1, 100))
            ]
    assert reasons == ["node(s) have less than 1000 milli-CPU free"] * 2
    assert one_node == ["node-a: 0 milli-CPU free, pod needs 1000"] * 2


async def eventually_seen(ext: Any, name: str) -> None:
    """The extender's view is fed by its watch over real HTTP and announces no change."""
    await wait_until_async(
        lambda: ("default", name) in ext.view.pod_json,
        timeout_s=10,
        what=f"the extender's view holding pod {name}",
    )


async def test_each_verb_is_marked_as_served_while_it_runs() -> None:
    """What a workload refresh's build steps aside for (refresh.VerbsInFlight)."""
    async with FakeApiServer() as server:
        seed(server, ("nodes", gpu_node("node-a", cards=1, memory_mib=16384)))
        async with running_extender(server) as ext, http_session() as http:
            idle = ext.scheduler.verbs_idle
            seen: list[bool] = []
            real_filter, real_rows = ext.scheduler.filter, ext.scheduler.prioritize_rows

            def filter_(*args: Any) -> Any:
                seen.append(idle())
                return real_filter(*args)

            def prioritize_rows(*args: Any) -> Any:
                seen.append(idle())
                return real_rows(*args)

            ext.scheduler.filter = filter_  # type: ignore[method-assign]
            ext.scheduler.prioritize_rows = prioritize_rows  # type: ignore[method-assign]
            pod = shared_pod("p", memory_mib=1024, compute_milli=100)
            for verb in ("filter", "prioritize"):
                status, _ = await post(http, f"{ext.url}/{verb}", filter_args(pod, ["node-a"]))
                assert status == 200
            assert idle()
    assert seen == [False, False]


async def test_a_request_is_marked_served_while_its_body_arrives() -> None:
    """A filter's body at 5,000 nodes arrives in several reads: the mark covers them, so a
    refresh's build does not share the GIL with the reading either."""
    async with FakeApiServer() as server:
        seed(server, ("nodes", gpu_node("node-a", cards=1, memory_mib=16384)))
        async with running_extender(server) as ext:
            idle = ext.scheduler.verbs_idle
            body = msgspec.json.encode(filter_args(shared_pod("p", 1024, 100), ["node-a"]))
            host, port = ext.url.removeprefix("http://").rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                b"POST /filter HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body[:10]
            )
            await writer.drain()
            await wait_until_async(
                lambda: not idle(), timeout_s=10, what="the request marked as served"
            )
            writer.write(body[10:])
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            writer.close()
            await writer.wait_closed()
            await wait_until_async(lambda: idle(), timeout_s=10, what="the mark released")
