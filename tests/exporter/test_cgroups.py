"""Mapping processes to pods through ``/proc/<pid>/cgroup``, against a hand-made proc tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubegpu.exporter.cgroups import ProcPodResolver, pod_uid_from_cgroup
from tests.exporter.conftest import write_cgroup

UID = "0f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
UID_ = UID.replace("-", "_")
STATIC = "6e4b0b7e9a1d4c2b8f3e5a7c9d1b3f5a"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(f"4:memory:/kubepods/burstable/pod{UID}/abc123\n", UID, id="v1-cgroupfs"),
        pytest.param(f"4:memory:/kubepods/pod{UID}/abc123\n", UID, id="v1-cgroupfs-guaranteed"),
        pytest.param(
            "4:memory:/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{UID_}.slice/docker-abc.scope\n",
            UID,
            id="v1-systemd",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-abc.scope\n",
            UID,
            id="v2-systemd-guaranteed",
        ),
        pytest.param(
            "0::/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{UID_}.slice/crio-abc.scope\n",
            UID,
            id="v2-systemd-besteffort",
        ),
        pytest.param(f"0::/kubepods/besteffort/pod{UID}/abc\n", UID, id="v2-cgroupfs"),
        pytest.param(
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
            f"kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-abc.scope\n",
            UID,
            id="v2-systemd-kind-nested",
        ),
        pytest.param(f"0::/kubepods/burstable/pod{STATIC}/abc\n", STATIC, id="static-pod-uid"),
        pytest.param(
            f"4:memory:/kubepods/burstable/pod{UID.upper()}/abc\n", UID, id="uppercase-uid"
        ),
        # Read from a private cgroup namespace: paths relative to the reader's own cgroup.
        pytest.param(
            f"0::/../../burstable/pod{UID}/abc\n", UID, id="v2-cgroupfs-relative-other-qos"
        ),
        pytest.param(f"0::/../../pod{UID}/abc\n", UID, id="v2-cgroupfs-relative-same-qos"),
        pytest.param(
            f"0::/../../../besteffort/pod{UID}/abc\n", UID, id="v2-cgroupfs-relative-deeper"
        ),
        pytest.param(f"0::/../pod{STATIC}\n", STATIC, id="v2-cgroupfs-relative-pod-level"),
        pytest.param(
            f"12:memory:/../../burstable/pod{UID}/abc\n"
            "1:name=systemd:/../../system.slice/containerd.service\n",
            UID,
            id="v1-cgroupfs-relative",
        ),
        pytest.param(
            f"0::/../../kubepods-burstable-pod{UID_}.slice/cri-containerd-abc.scope\n",
            UID,
            id="v2-systemd-relative",
        ),
        pytest.param(
            f"0::/../kubepods-pod{UID_}.slice/cri-containerd-abc.scope\n",
            UID,
            id="v2-systemd-relative-guaranteed",
        ),
        pytest.param("0::/system.slice/sshd.service\n", None, id="host-process"),
        pytest.param("0::/../../../system.slice/sshd.service\n", None, id="host-relative"),
        pytest.param("0::/../abc123\n", None, id="same-pod-sibling-container"),
        pytest.param(f"0::/../../docker/pod{UID}/abc\n", None, id="relative-not-a-pod-dir"),
        pytest.param(f"0::/../../burstable/pod{UID}.service\n", None, id="pod-named-unit"),
        pytest.param(
            f"0::/machine.slice/libpod-pod{UID_}.slice/libpod-abc.scope\n",
            None,
            id="podman-pod-slice",
        ),
        pytest.param("0::/user.slice/user-1000.slice/session-3.scope\n", None, id="user-session"),
        pytest.param(f"0::/docker/pod{UID}/abc\n", None, id="not-under-kubepods"),
        pytest.param("", None, id="empty"),
    ],
)
def test_finds_the_pod_uid_in_every_cgroup_shape(text: str, expected: str | None) -> None:
    assert pod_uid_from_cgroup(text) == expected


def test_resolver_reads_each_pid_and_skips_processes_that_are_gone(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_cgroup(proc, 10, f"0::/kubepods/burstable/pod{UID}/abc\n")
    write_cgroup(proc, 11, "0::/system.slice/cron.service\n")
    write_cgroup(proc, 13, f"0::/../../pod{STATIC}/def\n")  # seen from a private namespace
    resolver = ProcPodResolver(proc)
    assert resolver.pod_uids([10, 11, 12, 13]) == {10: UID, 13: STATIC}
