"""The labeller keeps labels true: a label changes or disappears when its fact does, foreign
labels stay, and writes happen on change, on notify, and on the periodic resync only."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import lightkube
import pytest
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from kubegpu.core.gpu import GpuUuid, NodeInventory
from kubegpu.core.health_feed import HealthFeed
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.kube.node_labels import LightkubeNodeLabels
from kubegpu.labels.catalogue import TIMESTAMP
from kubegpu.labels.labeller import Labeller
from kubegpu.labels.sinks import (
    LabelSink,
    NfdFeatureFileSink,
    NodeLabelSink,
    parse_feature_file,
)
from kubegpu.testing.apiserver import ServerThread, make_node


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_767_225_600.0

    def __call__(self) -> float:
        return self.now


class Inventory:
    def __init__(self, preset: str) -> None:
        self.current = resolve_fake_spec(preset).inventory

    def __call__(self) -> NodeInventory:
        return self.current


@pytest.fixture
def client(fake_api_server: ServerThread) -> Iterator[lightkube.Client]:
    with fake_api_server.client() as c:
        c.create(Node.from_dict(make_node("gpu-a", labels={"team": "ml"})))
        yield c


def labels_of(client: lightkube.Client) -> dict[str, str]:
    return dict(client.get(Node, "gpu-a").metadata.labels or {})


def test_nvlink_label_is_removed_from_the_node_when_nvlink_is_gone(
    client: lightkube.Client,
) -> None:
    inventory = Inventory("2xV100-2xT4")
    labeller = Labeller(
        inventory=inventory,
        sink=NodeLabelSink(LightkubeNodeLabels(client), "gpu-a"),
        clock=FakeClock(),
    )
    assert labeller.refresh_once()
    assert labels_of(client)["kubegpu.io/gpu.nvlink"] == "true"

    pcie_only = {
        pair: dataclasses.replace(link, nvlinks=0) for pair, link in inventory.current.links.items()
    }
    inventory.current = dataclasses.replace(inventory.current, links=pcie_only)
    assert labeller.refresh_once()
    labels = labels_of(client)
    assert "kubegpu.io/gpu.nvlink" not in labels
    assert labels["team"] == "ml"  # never ours, never touched
    assert labels["nvidia.com/gpu.count"] == "4"


def test_model_labels_follow_a_node_that_stops_being_mixed(client: lightkube.Client) -> None:
    inventory = Inventory("2xV100-2xT4")
    labeller = Labeller(
        inventory=inventory,
        sink=NodeLabelSink(LightkubeNodeLabels(client), "gpu-a"),
        clock=FakeClock(),
    )
    labeller.refresh_once()
    assert "nvidia.com/gpu.product" not in labels_of(client)
    t4s = tuple(g for g in inventory.current.gpus if g.product_name == "Tesla T4")
    inventory.current = NodeInventory(gpus=t4s, driver_version=None)
    labeller.refresh_once()
    labels = labels_of(client)
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels["kubegpu.io/gpu.mixed"] == "false"
    assert "kubegpu.io/gpu.product.Tesla-V100-SXM2-16GB" not in labels
    assert not [k for k in labels if k.startswith("nvidia.com/cuda.")]  # driver unknown now


ADMIN_LABEL = ("kubegpu.io/device-plugin", "nvidia")  # docs/install.md: moving a node's plugin


def test_an_admin_label_under_our_prefix_survives_every_refresh_of_the_node(
    client: lightkube.Client,
) -> None:
    key, value = ADMIN_LABEL
    client.patch(Node, "gpu-a", {"metadata": {"labels": {key: value}}}, patch_type=PatchType.MERGE)
    clock = FakeClock()
    inventory = Inventory("2xV100-2xT4")
    health: dict[GpuUuid, bool] = {}
    labeller = Labeller(
        inventory=inventory,
        sink=NodeLabelSink(LightkubeNodeLabels(client), "gpu-a"),
        health=lambda: health,
        clock=clock,
        resync_s=60,
    )
    assert labeller.refresh_once()
    assert labels_of(client)[key] == value
    # Facts change (a label of ours goes away, another changes), then a forced rewrite and a
    # periodic resync: none of these may take the admin's label with them.
    health[inventory.current.gpus[0].uuid] = False
    t4s = tuple(g for g in inventory.current.gpus if g.product_name == "Tesla T4")
    inventory.current = dataclasses.replace(inventory.current, gpus=t4s, links={})
    assert labeller.refresh_once()
    assert labeller.refresh_once(force=True)
    clock.now += 61
    labeller.refresh_once()
    labels = labels_of(client)
    assert labels[key] == value
    assert labels["team"] == "ml"
    assert "kubegpu.io/gpu.product.Tesla-V100-SXM2-16GB" not in labels  # ours did go


def test_an_admin_feature_file_beside_ours_survives_every_refresh(tmp_path: Path) -> None:
    # An admin may set kubegpu.io/ labels through NFD too, with a feature file of their own in
    # the same features.d directory: the labeller writes only its own file.
    features = tmp_path / "features.d"
    features.mkdir()
    admin_file = features / "site"
    admin_file.write_text("kubegpu.io/device-plugin=kubegpu\n")
    clock = FakeClock()
    inventory = Inventory("2xV100-2xT4")
    ours = features / "kubegpu"
    labeller = Labeller(inventory=inventory, sink=NfdFeatureFileSink(ours), clock=clock)
    assert labeller.refresh_once()
    inventory.current = dataclasses.replace(inventory.current, links={})
    assert labeller.refresh_once()
    clock.now += 61
    labeller.refresh_once(force=True)
    assert admin_file.read_text() == "kubegpu.io/device-plugin=kubegpu\n"
    assert sorted(p.name for p in features.iterdir()) == ["kubegpu", "site"]
    written = parse_feature_file(ours.read_text())
    assert "kubegpu.io/device-plugin" not in written
    assert "kubegpu.io/gpu.nvlink" not in written


def test_writes_on_change_and_on_resync_but_not_in_between(tmp_path: Path) -> None:
    clock = FakeClock()
    start = clock.now
    health: dict[GpuUuid, bool] = {}
    inventory = Inventory("4xT4")
    path = tmp_path / "kubegpu"
    labeller = Labeller(
        inventory=inventory,
        sink=NfdFeatureFileSink(path),
        health=lambda: health,
        clock=clock,
        resync_s=60,
    )
    assert labeller.refresh_once()
    assert parse_feature_file(path.read_text())[TIMESTAMP] == str(int(start))
    clock.now += 10
    assert not labeller.refresh_once()  # nothing changed
    health[inventory.current.gpus[1].uuid] = False
    assert labeller.refresh_once()
    changed_at = clock.now
    labels = parse_feature_file(path.read_text())
    assert labels["kubegpu.io/gpu.healthy-count"] == "3"
    assert labels[TIMESTAMP] == str(int(changed_at))  # stamped because a label changed
    clock.now += 30
    assert not labeller.refresh_once()
    clock.now += 30
    written = path.stat()
    assert labeller.refresh_once()  # periodic resync re-asserts the labels...
    # ...and finds them in place: the file is not rewritten, the timestamp stays the change's.
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    assert parse_feature_file(path.read_text())[TIMESTAMP] == str(int(changed_at))
    path.unlink()  # someone deleted the file: the resync puts it back as it was
    clock.now += 60
    assert labeller.refresh_once()
    assert parse_feature_file(path.read_text())[TIMESTAMP] == str(int(changed_at))


def test_a_resync_with_nothing_changed_sends_no_patch_to_the_node(
    client: lightkube.Client, fake_api_server: ServerThread
) -> None:
    clock = FakeClock()
    labeller = Labeller(
        inventory=Inventory("4xT4"),
        sink=NodeLabelSink(LightkubeNodeLabels(client), "gpu-a"),
        clock=clock,
        resync_s=60,
    )
    labeller.refresh_once()
    patches = fake_api_server.count("patch", "nodes")
    for _ in range(5):
        clock.now += 61
        assert labeller.refresh_once()  # due, re-asserted...
    assert fake_api_server.count("patch", "nodes") == patches  # ...and nothing to write
    assert labels_of(client)[TIMESTAMP] == str(int(FakeClock().now))


def test_a_restart_with_nothing_changed_keeps_the_timestamp_and_writes_nothing(
    client: lightkube.Client, fake_api_server: ServerThread
) -> None:
    clock = FakeClock()
    first = Labeller(
        inventory=Inventory("4xT4"),
        sink=NodeLabelSink(LightkubeNodeLabels(client), "gpu-a"),
        clock=clock,
    )
    first.refresh_once()
    stamp = labels_of(client)[TIMESTAMP]
    patches = fake_api_server.count("patch", "nodes")
    clock.now += 3600
    again = Labeller(
        inventory=Inventory("4xT4"),
        sink=NodeLabelSink(LightkubeNodeLabels(client), "gpu-a"),
        clock=clock,
    )
    assert again.refresh_once(force=True)
    assert fake_api_server.count("patch", "nodes") == patches
    assert labels_of(client)[TIMESTAMP] == stamp
    # A restart onto different facts stamps the change.
    third = Labeller(
        inventory=Inventory("2xV100-2xT4"),
        sink=NodeLabelSink(LightkubeNodeLabels(client), "gpu-a"),
        clock=clock,
    )
    third.refresh_once()
    assert labels_of(client)[TIMESTAMP] == str(int(clock.now))


def test_an_upgrade_removes_the_old_timestamp_label_and_no_timestamp_removes_ours(
    client: lightkube.Client,
) -> None:
    old = {"kubegpu.io/labels.timestamp": "1700000000"}  # written by earlier releases
    client.patch(Node, "gpu-a", {"metadata": {"labels": old}}, patch_type=PatchType.MERGE)
    Labeller(
        inventory=Inventory("4xT4"),
        sink=NodeLabelSink(LightkubeNodeLabels(client), "gpu-a"),
        clock=FakeClock(),
    ).refresh_once()
    labels = labels_of(client)
    assert "kubegpu.io/labels.timestamp" not in labels
    assert TIMESTAMP in labels
    Labeller(
        inventory=Inventory("4xT4"),
        sink=NodeLabelSink(LightkubeNodeLabels(client), "gpu-a"),
        timestamp=False,
    ).refresh_once()
    labels = labels_of(client)
    assert TIMESTAMP not in labels
    assert labels["nvidia.com/gpu.count"] == "4"


def test_running_labeller_relabels_at_once_when_a_gpu_turns_unhealthy(tmp_path: Path) -> None:
    inventory = Inventory("4xT4")
    uuids = [g.uuid for g in inventory.current.gpus]
    feed = HealthFeed(uuids)
    path = tmp_path / "kubegpu"
    # Poll and resync far beyond the test's length: only notify() can cause the second write.
    sink = AnnouncingSink(NfdFeatureFileSink(path))
    labeller = Labeller(
        inventory=inventory,
        sink=sink,
        health=feed.healthy_map,
        poll_s=3600,
        resync_s=3600,
    )
    feed.add_listener(labeller.notify)
    thread = threading.Thread(target=labeller.run, daemon=True)
    thread.start()
    try:
        sink.wait_for(applied=1)
        assert parse_feature_file(path.read_text())["kubegpu.io/gpu.healthy-count"] == "4"
        feed.set_healthy(uuids[0], False)
        sink.wait_for(applied=2)
        assert parse_feature_file(path.read_text())["kubegpu.io/gpu.healthy-count"] == "3"
    finally:
        labeller.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_a_failed_write_is_retried_on_the_next_tick(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    # The parent is a file: the write fails.
    sink = AnnouncingSink(NfdFeatureFileSink(blocker / "kubegpu"))
    labeller = Labeller(inventory=Inventory("4xT4"), sink=sink, poll_s=0.01)
    thread = threading.Thread(target=labeller.run, daemon=True)
    thread.start()
    try:
        sink.wait_for(attempts=3)  # the first write and two ticks' retries, all failed
        assert labeller.writes == 0
        blocker.unlink()
        sink.wait_for(applied=1)
    finally:
        labeller.stop()
        thread.join(10)
    assert (blocker / "kubegpu").exists()


class AnnouncingSink:
    """The sink under test, announcing each time the labeller hands it labels (a failed write
    too), so that a test waits for the labeller's thread to get there, not for time."""

    def __init__(self, sink: LabelSink) -> None:
        self.sink = sink
        self.attempts = 0
        self.applied = 0
        self._changed = threading.Condition()

    def apply(self, labels: Mapping[str, str]) -> None:
        done = False
        try:
            self.sink.apply(labels)
            done = True
        finally:
            with self._changed:
                self.attempts += 1
                self.applied += done
                self._changed.notify_all()

    def current(self) -> Mapping[str, str] | None:
        return self.sink.current()

    def wait_for(self, *, attempts: int = 0, applied: int = 0, timeout_s: float = 20.0) -> None:
        with self._changed:
            reached = self._changed.wait_for(
                lambda: self.attempts >= attempts and self.applied >= applied, timeout_s
            )
        assert reached, (
            f"sink never reached {attempts=} {applied=}: {self.attempts=} {self.applied=}"
        )
