"""Fuzzed extender payloads over real HTTP (hypothesis: 5,300 cases here, issue 4 asks for at
least 5,000; 800 more on the annotation codec in tests/sharing): whatever arrives, the extender
answers 200 with a well-formed result or a clear 4xx, and never crashes; malformed annotations
on nodes and pods become reasons, not failures. About 13 s on a quiet 2-core machine."""

from __future__ import annotations

import contextlib
import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.config.extender import ExtenderConfig
from kubegpu.kube.list_watch import Backoff
from kubegpu.roles.extender import ExtenderService
from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION, INVENTORY_ANNOTATION
from kubegpu.testing.apiserver import FakeApiServer, ServerThread, make_node
from tests.extender.cluster import COMPUTE, MEMORY, SLOT, WHOLE, gpu_node, whole_pod

# Thousands of examples over real HTTP: the filter and prioritize runs take 40-50 s on a loaded
# two-core machine, too close to the suite's 60 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

KNOWN = ["node-0", "node-1", "node-2", "bad-inventory", "no-inventory"]


def fuzz(examples: int) -> settings:
    # Module-scoped fixture on purpose: one extender serves every example.
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


class Extender:
    def __init__(self, api: ServerThread, service: ExtenderService) -> None:
        self.api = api
        self.service = service
        self.connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)

    def post(self, verb: str, body: bytes) -> tuple[int, Any]:
        self.connection.request(
            "POST", f"/{verb}", body=body, headers={"Content-Type": "application/json"}
        )
        response = self.connection.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw.startswith((b"{", b"[")) else raw


@contextlib.contextmanager
def running_extender() -> Iterator[Extender]:
    with FakeApiServer().run_in_thread() as api:
        for i in range(3):
            api.store.put("nodes", gpu_node(f"node-{i}", cards=2 + i))
        api.store.put(
            "nodes", make_node("bad-inventory", annotations={INVENTORY_ANNOTATION: '{"v":1}'})
        )
        api.store.put("nodes", make_node("no-inventory"))
        odd = whole_pod("odd", 1)
        odd["spec"]["nodeName"] = "node-0"
        odd["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: '{"v":1,"node":"node-0"}'}
        api.store.put("pods", odd)

        async def start() -> ExtenderService:
            service = ExtenderService(
                ExtenderConfig(port=0, max_body_bytes=64 * 1024),
                client=api.server.async_client(),
                backoff=Backoff(0.01, 0.05),
            )
            await service.start()
            await service.wait_synced()
            return service

        service = api.call(start)
        extender = Extender(api, service)
        try:
            yield extender
        finally:
            extender.connection.close()
            api.call(service.stop)
            api.call(service.client.close)


@pytest.fixture(scope="module")
def extender() -> Iterator[Extender]:
    with running_extender() as running:
        yield running


@pytest.fixture
def fresh_extender() -> Iterator[Extender]:
    """An extender no fuzzed example has talked to: a fuzzed prioritize leaves a tentative
    reservation where it expects its pod (kubegpu.extender.inflight), which can fill a card
    a later test counts on."""
    with running_extender() as running:
        yield running


quantity = st.one_of(
    st.integers(-5, 2000).map(str),
    st.sampled_from(["1", "500m", "10Gi", "1e3", "0", "1.5", "abc", "", "-1", "99999999999"]),
    st.integers(0, 5),
    st.none(),
    st.booleans(),
)
resource_name = st.sampled_from(["cpu", "memory", WHOLE, MEMORY, COMPUTE, SLOT, "x.io/y"])
resources = st.dictionaries(resource_name, quantity, max_size=4)
container = st.fixed_dictionaries(
    {"name": st.text(max_size=5)},
    optional={
        "resources": st.one_of(
            st.fixed_dictionaries({}, optional={"requests": resources, "limits": resources}),
            st.none(),
            st.integers(),
        ),
        "restartPolicy": st.sampled_from(["Always", "Never"]),
    },
)
pod = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {"name": st.text(min_size=1, max_size=8), "namespace": st.just("default")},
            optional={
                "uid": st.text(max_size=8),
                "annotations": st.dictionaries(
                    st.sampled_from([ALLOCATION_ANNOTATION, "kubegpu.io/gpu-models", "x"]),
                    st.text(max_size=30),
                    max_size=2,
                ),
            },
        ),
        "spec": st.fixed_dictionaries(
            {"containers": st.lists(container, max_size=3)},
            optional={
                "initContainers": st.lists(container, max_size=2),
                "overhead": resources,
                "nodeName": st.sampled_from(KNOWN),
            },
        ),
    }
)
node_names = st.lists(st.sampled_from([*KNOWN, "ghost"]), max_size=6, unique=True)
extender_args = st.one_of(
    st.fixed_dictionaries({"Pod": pod, "Nodes": st.none(), "NodeNames": node_names}),
    st.fixed_dictionaries(
        {
            "Pod": pod,
            "NodeNames": st.none(),
            "Nodes": st.fixed_dictionaries(
                {
                    "metadata": st.just({}),
                    "items": node_names.map(
                        lambda names: [{"metadata": {"name": n}} for n in names]
                    ),
                }
            ),
        }
    ),
    st.dictionaries(
        st.sampled_from(["Pod", "NodeNames", "Nodes", "pod"]),
        st.none() | st.integers() | st.text(max_size=4) | st.lists(st.integers(), max_size=2),
    ),
)


def check_filter(body: dict[str, Any], status: int, reply: Any) -> None:
    if status == 400:
        assert reply["Error"].startswith("malformed filter request")
        return
    assert status == 200, reply
    assert set(reply) == {
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    }
    sent = body.get("NodeNames")
    if sent is None and isinstance(body.get("Nodes"), dict):
        sent = [n["metadata"]["name"] for n in body["Nodes"]["items"]]
        passed = [n["metadata"]["name"] for n in reply["Nodes"]["items"]]
    else:
        passed = reply["NodeNames"]
    sent = sent or []
    rejected = {**reply["FailedNodes"], **reply["FailedAndUnresolvableNodes"]}
    assert set(passed) <= set(sent) and not set(passed) & set(rejected)
    assert set(passed) | set(rejected) == set(sent)  # every node gets a verdict
    assert all(isinstance(r, str) and r for r in rejected.values())


@fuzz(2500)
@given(body=extender_args)
def test_fuzzed_filter_payloads_get_a_well_formed_answer(extender: Extender, body: Any) -> None:
    status, reply = extender.post("filter", json.dumps(body).encode())
    check_filter(body, status, reply)


@fuzz(1300)
@given(body=extender_args)
def test_fuzzed_prioritize_payloads_get_a_host_priority_list(extender: Extender, body: Any) -> None:
    status, reply = extender.post("prioritize", json.dumps(body).encode())
    if status == 400:
        return
    assert status == 200
    sent = body.get("NodeNames") or []
    assert isinstance(reply, list)
    for entry in reply:
        assert set(entry) == {"Host", "Score"} and 0 <= entry["Score"] <= 10
        assert entry["Host"] in sent or isinstance(body.get("Nodes"), dict)


binding_args = st.fixed_dictionaries(
    {},
    optional={
        "PodName": st.sampled_from(["odd", "missing", ""]) | st.text(max_size=6),
        "PodNamespace": st.sampled_from(["default", "nope"]) | st.integers(),
        "PodUID": st.text(max_size=6),
        "Node": st.sampled_from([*KNOWN, "ghost"]),
    },
)


@fuzz(700)
@given(body=binding_args)
def test_fuzzed_bind_payloads_answer_an_error_field_or_400(extender: Extender, body: Any) -> None:
    status, reply = extender.post("bind", json.dumps(body).encode())
    assert status in (200, 400), reply
    assert isinstance(reply["Error"], str)
    if status == 200:
        assert reply["Error"]  # none of these pods can be bound: odd is bound, the rest absent


@fuzz(800)
@given(raw=st.binary(max_size=200) | st.text(max_size=100).map(str.encode))
def test_garbage_bodies_are_a_clear_400(extender: Extender, raw: bytes) -> None:
    for verb in ("filter", "prioritize", "bind"):
        status, _ = extender.post(verb, raw)
        assert status in (200, 400)


def test_oversized_bodies_are_refused_with_413(extender: Extender) -> None:
    status, _ = extender.post("filter", b'{"Pod": "' + b"x" * (128 * 1024) + b'"}')
    assert status == 413


def test_malformed_annotations_become_reasons(
    fresh_extender: Extender, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"Pod": whole_pod("w", 1), "Nodes": None, "NodeNames": ["bad-inventory", "node-0"]}
    status, reply = fresh_extender.post("filter", json.dumps(body).encode())
    assert status == 200
    assert reply["FailedAndUnresolvableNodes"] == {
        "bad-inventory": "node(s) have an unreadable GPU inventory (annotation "
        "kubegpu.io/gpu-inventory; kubectl gpu inspect and the extender's log name the error)"
    }
    # The reason kube-scheduler counts names no node; the extender's log names node and error.
    assert any(
        record.getMessage().startswith("node bad-inventory: annotation kubegpu.io/gpu-inventory")
        and "gpus is missing" in record.getMessage()
        for record in caplog.get_records("setup")
    )
    # The pod with a malformed decision holds no known card; node-0 still takes a whole GPU.
    assert reply["NodeNames"] == ["node-0"]
