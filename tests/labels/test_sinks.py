"""Writing labels: the NFD feature file, and the Node object through lightkube against the
fake API server (real HTTP, real merge patches, resourceVersion preconditions)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightkube
import pytest
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from kubegpu.kube.node_labels import LightkubeNodeLabels
from kubegpu.labels.sinks import (
    NfdFeatureFileSink,
    NodeLabelSink,
    StdoutSink,
    node_label_patch,
    parse_feature_file,
)
from kubegpu.testing.apiserver import ServerThread, make_node

FOREIGN = {"kubernetes.io/hostname": "gpu-a", "nvidia.com/mig.config": "all-1g.10gb", "team": "ml"}
# Set by an admin under our prefix (docs/install.md: how to move a node between device plugins).
ADMIN = {"kubegpu.io/device-plugin": "nvidia"}
MIXED = "kubegpu.io/gpu.mixed"
T4_COUNT = "kubegpu.io/gpu.product.Tesla-T4"


def test_feature_file_holds_exactly_the_current_labels(tmp_path: Path) -> None:
    path = tmp_path / "features.d" / "kubegpu"
    sink = NfdFeatureFileSink(path)
    sink.apply({"nvidia.com/gpu.count": "8", "kubegpu.io/gpu.nvlink": "true"})
    sink.apply({"nvidia.com/gpu.count": "7"})
    assert parse_feature_file(path.read_text()) == {"nvidia.com/gpu.count": "7"}
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    # Written through a temp file and a rename: nothing else is left in the directory.
    assert os.listdir(path.parent) == ["kubegpu"]
    sink.remove()
    assert not path.exists()


def test_stdout_sink_prints_sorted_key_value_lines() -> None:
    out = io.StringIO()
    StdoutSink(out).apply({"b/x": "1", "a/y": "2"})
    assert out.getvalue() == "a/y=2\nb/x=1\n"


@pytest.mark.parametrize(
    ("current", "desired", "patch"),
    [
        pytest.param({}, {MIXED: "true"}, {MIXED: "true"}, id="add"),
        pytest.param({MIXED: "true"}, {MIXED: "true"}, {}, id="unchanged"),
        pytest.param({MIXED: "true"}, {MIXED: "false"}, {MIXED: "false"}, id="change"),
        pytest.param(
            {MIXED: "true", "nvidia.com/gpu.product": "T4", T4_COUNT: "2"},
            {},
            {MIXED: None, "nvidia.com/gpu.product": None, T4_COUNT: None},
            id="remove-ours",
        ),
        pytest.param(FOREIGN, {}, {}, id="foreign-untouched"),
        pytest.param(ADMIN, {MIXED: "false"}, {MIXED: "false"}, id="admin-kubegpu-untouched"),
    ],
)
def test_patch_touches_only_owned_labels(
    current: dict[str, str], desired: dict[str, str], patch: dict[str, str | None]
) -> None:
    assert node_label_patch(current, desired) == patch


def test_patch_refuses_to_write_a_label_we_do_not_own() -> None:
    with pytest.raises(ValueError, match="team"):
        node_label_patch({}, {"team": "ml"})
    with pytest.raises(ValueError, match=r"kubegpu\.io/device-plugin"):
        node_label_patch({}, {"kubegpu.io/device-plugin": "kubegpu"})


@pytest.fixture
def client(fake_api_server: ServerThread) -> Iterator[lightkube.Client]:
    with fake_api_server.client() as c:
        c.create(Node.from_dict(make_node("gpu-a", labels=dict(FOREIGN))))
        yield c


def node_labels(client: lightkube.Client) -> dict[str, str]:
    return dict(client.get(Node, "gpu-a").metadata.labels or {})


def test_node_sink_sets_changes_and_removes_our_labels_only(client: lightkube.Client) -> None:
    before = node_labels(client)
    assert set(FOREIGN.items()) <= set(before.items())
    sink = NodeLabelSink(LightkubeNodeLabels(client), "gpu-a")
    sink.apply({"kubegpu.io/gpu.nvlink": "true", "nvidia.com/gpu.count": "8"})
    assert node_labels(client) == {
        **before,
        "kubegpu.io/gpu.nvlink": "true",
        "nvidia.com/gpu.count": "8",
    }
    sink.apply({"nvidia.com/gpu.count": "7"})
    assert node_labels(client) == {**before, "nvidia.com/gpu.count": "7"}


def test_node_sink_does_not_write_when_nothing_changed(
    client: lightkube.Client, fake_api_server: ServerThread
) -> None:
    sink = NodeLabelSink(LightkubeNodeLabels(client), "gpu-a")
    sink.apply({"nvidia.com/gpu.count": "8"})
    patches = fake_api_server.count("patch", "nodes")
    sink.apply({"nvidia.com/gpu.count": "8"})
    assert fake_api_server.count("patch", "nodes") == patches


class RacingClient:
    """Lets another writer change the Node between our read and our patch, once."""

    def __init__(self, client: lightkube.Client) -> None:
        self.client = client
        self.raced = False

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return self.client.get(*args, **kwargs)

    def patch(self, *args: Any, **kwargs: Any) -> Any:
        if not self.raced:
            self.raced = True
            self.client.patch(
                Node,
                "gpu-a",
                {"metadata": {"labels": {"team": "infra"}}},
                patch_type=PatchType.MERGE,
            )
        return self.client.patch(*args, **kwargs)


def test_node_sink_recomputes_after_a_conflicting_write(client: lightkube.Client) -> None:
    racing = RacingClient(client)
    NodeLabelSink(LightkubeNodeLabels(racing), "gpu-a").apply({"nvidia.com/gpu.count": "8"})  # type: ignore[arg-type]
    assert racing.raced
    labels = node_labels(client)
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["team"] == "infra"  # the other writer's change survived


def test_node_sink_gives_up_after_repeated_conflicts(
    client: lightkube.Client, fake_api_server: ServerThread
) -> None:
    fake_api_server.inject_failures("nodes", "gpu-a", count=5, code=409)
    with pytest.raises(lightkube.ApiError):
        NodeLabelSink(LightkubeNodeLabels(client), "gpu-a", max_attempts=3).apply(
            {"nvidia.com/gpu.count": "8"}
        )
