"""Which pod a process belongs to, read from ``/proc/<pid>/cgroup`` under an injectable root.

The kubelet puts every container in a cgroup whose path names the pod UID. The shapes differ by
cgroup driver and version, and all of these are recognised:

* cgroupfs (v1 or v2): ``/kubepods/burstable/pod<uid>/<container-id>`` and, for Guaranteed
  pods, ``/kubepods/pod<uid>/<container-id>``;
* systemd: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
  cri-containerd-<id>.scope`` where the UID's dashes are written as underscores, and
  ``kubepods-pod<uid>.slice`` for Guaranteed pods.

Static pods have a 32-hex-digit UID (a hash) instead of a dashed UUID; both are accepted.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

_POD_SEGMENT = re.compile(
    r"(?:^|[/-])pod("
    r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
    r"|[0-9a-fA-F]{32}"
    r")(?:\.slice)?(?=/|$)"
)


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in a ``/proc/<pid>/cgroup`` file's text, or ``None`` for a process outside
    any pod. Lines look like ``hierarchy-id:controllers:path`` (v2 has one ``0::path`` line)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" not in path:
            continue
        match = _POD_SEGMENT.search(path)
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
