"""The kubeconfig the fake API server writes: owner-only, complete whenever it exists, and
readable by lightkube."""

from __future__ import annotations

import stat
from pathlib import Path
from unittest import mock

import pytest
import yaml
from lightkube.config.kubeconfig import KubeConfig

from kubegpu.testing.kubeconfig import write_kubeconfig


def test_the_file_is_owner_only_and_lightkube_reads_it(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "sub" / "kubeconfig", "http://127.0.0.1:6443")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config = KubeConfig.from_dict(yaml.safe_load(path.read_text()))
    assert config.get().cluster.server == "http://127.0.0.1:6443"
    assert list(tmp_path.joinpath("sub").iterdir()) == [path]


def test_a_failed_write_leaves_the_previous_file_whole_and_no_partial_file(
    tmp_path: Path,
) -> None:
    path = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1")
    before = path.read_text()
    with (
        mock.patch("os.replace", side_effect=OSError("disk full")),
        pytest.raises(OSError, match="disk full"),
    ):
        write_kubeconfig(path, "http://127.0.0.1:2")
    assert path.read_text() == before
    assert list(tmp_path.iterdir()) == [path]
