"""The node's pods from the fake API server: UID directory and share lookup, with a share
parser standing in for the sharing feature's annotation parser."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

import lightkube
import pytest
from lightkube.resources.core_v1 import Namespace, Pod

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.metrics import PodGpuShare, PodKey
from kubegpu.exporter.pods import KubeNodePods
from kubegpu.kube.node_pods import LightkubeNodePods
from kubegpu.testing.apiserver import ServerThread, make_namespace, make_pod

SHARE = "example.test/share"


def parse(annotations: Mapping[str, str]) -> list[PodGpuShare]:
    raw = annotations.get(SHARE)
    if raw is None:
        return []
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(str(exc)) from exc
    return [PodGpuShare(GpuUuid(doc["uuid"]), memory_bytes=doc["bytes"])]


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client(fake_api_server: ServerThread) -> Iterator[lightkube.Client]:
    with fake_api_server.client() as c:
        c.create(Namespace.from_dict(make_namespace("web")))
        for name, node, annotations in [
            ("a", "gpu-a", {SHARE: json.dumps({"uuid": "GPU-1", "bytes": 1024})}),
            ("b", "gpu-a", {SHARE: "{not json"}),
            ("c", "gpu-a", {}),
            ("d", "gpu-b", {SHARE: json.dumps({"uuid": "GPU-9", "bytes": 1})}),
        ]:
            c.create(Pod.from_dict(make_pod(name, "web", node_name=node, annotations=annotations)))
        yield c


def test_lists_only_this_nodes_pods_and_parses_their_shares(
    client: lightkube.Client, fake_api_server: ServerThread
) -> None:
    clock = Clock()
    pods = KubeNodePods(LightkubeNodePods(client), "gpu-a", parse, clock=clock)
    by_uid = pods.pods_by_uid()
    assert sorted(by_uid.values()) == [PodKey("web", n) for n in "abc"]
    uid_a = client.get(Pod, "a", namespace="web").metadata.uid
    assert by_uid[uid_a] == PodKey("web", "a")
    # Pod b's annotation does not parse: no share, no failure.
    assert pods.shares() == {PodKey("web", "a"): (PodGpuShare(GpuUuid("GPU-1"), 1024),)}
    # One list serves both lookups until it is max_age_s old.
    lists = fake_api_server.count("list", "pods")
    assert lists == 1
    pods.pods_by_uid()
    assert fake_api_server.count("list", "pods") == lists
    clock.now += 10
    pods.shares()
    assert fake_api_server.count("list", "pods") == lists + 1


def test_without_a_parser_there_are_no_shares(client: lightkube.Client) -> None:
    assert KubeNodePods(LightkubeNodePods(client), "gpu-a").shares() == {}
