"""Which pod a process belongs to, read from ``/proc/<pid>/cgroup`` under an injectable root.

The kubelet puts every container in a cgroup whose path names the pod UID. The shapes differ by
cgroup driver and version, and all of these are recognised:

* cgroupfs (v1 or v2): ``/kubepods/burstable/pod<uid>/<container-id>`` and, for Guaranteed
  pods, ``/kubepods/pod<uid>/<container-id>``;
* systemd: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
  cri-containerd-<id>.scope`` where the UID's dashes are written as underscores, and
  ``kubepods-pod<uid>.slice`` for Guaranteed pods (kind nests them as ``kubelet-kubepods-…``).

A reader in a private cgroup namespace (the default for containers on cgroup v2) sees other
processes' paths relative to its own cgroup, so the ``kubepods`` part may be gone: an exporter
in ``/kubepods/burstable/pod<a>/<c>`` reads ``/../../pod<b>/<id>`` for a neighbour of the same
QoS class and ``/../../../besteffort/pod<b>/<id>`` for another. A cgroupfs pod directory is
therefore accepted after ``kubepods``, a QoS class (``burstable``, ``besteffort``) or ``..``,
and a systemd pod slice wherever it is (its name says ``kubepods``); a ``pod<uid>`` directory
anywhere else (``/docker/pod<uid>``) is not a Kubernetes pod.

Static pods have a 32-hex-digit UID (a hash) instead of a dashed UUID; both are accepted.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

_UID = (
    r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
    r"|[0-9a-fA-F]{32}"
)
# cgroupfs: the pod's directory right under kubepods, a QoS class, or ".." (a relative path
# from a private cgroup namespace), followed by a container directory or the end.
_CGROUPFS_POD = re.compile(
    r"(?:^|/)(?:[^/]*kubepods[^/]*|burstable|besteffort|\.\.)/pod(" + _UID + r")(?=/|$)"
)
# systemd: the pod's slice names the QoS path itself, so it stands on its own.
_SYSTEMD_POD = re.compile(r"(?:^|/)[^/]*kubepods[^/]*-pod(" + _UID + r")\.slice(?=/|$)")


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in a ``/proc/<pid>/cgroup`` file's text, or ``None`` for a process outside
    any pod. Lines look like ``hierarchy-id:controllers:path`` (v2 has one ``0::path`` line)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        match = _SYSTEMD_POD.search(path) or _CGROUPFS_POD.search(path)
        if match:
            return match.group(1).replace("_", "-").lower()
    return None


class ProcPodResolver:
    """Maps host PIDs to pod UIDs by reading ``<proc>/<pid>/cgroup``."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc

    def pod_uids(self, pids: Iterable[int]) -> dict[int, str]:
        found: dict[int, str] = {}
        for pid in pids:
            try:
                text = (self.proc / str(pid) / "cgroup").read_text(encoding="utf-8")
            except OSError:
                # Gone already, or not in our PID namespace (the exporter needs hostPID).
                log.debug("pid %d: no cgroup file under %s", pid, self.proc)
                continue
            uid = pod_uid_from_cgroup(text)
            if uid is not None:
                found[pid] = uid
        return found
