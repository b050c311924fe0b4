"""Whether a folder can hold the node agent's unix sockets, decided before any is made."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubegpu.kubelet.socketdir import MAX_SOCKET_PATH_BYTES, SocketDirError, check_socket_dir

NAMES = ["kubelet.sock", "kubegpu-nvidia.com_gpu.sock"]


def test_an_existing_folder_or_one_that_can_be_made_is_accepted(tmp_path: Path) -> None:
    check_socket_dir(tmp_path, NAMES)
    check_socket_dir(tmp_path / "not" / "yet", NAMES)


def test_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(SocketDirError, match=r"/f is not a folder"):
        check_socket_dir(tmp_path / "f", NAMES)


def test_a_folder_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(SocketDirError, match=r"lies under .*/f, which is not a folder"):
        check_socket_dir(tmp_path / "f" / "below", NAMES)


def test_a_folder_too_deep_for_the_longest_socket_is_refused(tmp_path: Path) -> None:
    room = MAX_SOCKET_PATH_BYTES - len(os.fsencode(tmp_path)) - 1 - len(NAMES[1]) - 1
    fits = tmp_path / ("d" * room)
    check_socket_dir(fits, NAMES)  # exactly 107 bytes
    with pytest.raises(SocketDirError, match=r"would be 108 bytes, more than the 107"):
        check_socket_dir(tmp_path / ("d" * (room + 1)), NAMES)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_folder_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with pytest.raises(SocketDirError, match="no permission to create sockets there"):
        check_socket_dir(locked, NAMES)
