"""Last line of cleanup, run by e2e/run after pytest whatever happened to it (even SIGKILL):
every process that names a run folder, every mount under it, its cgroups and the folder go."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from kubegpu_e2e.cluster import _cgroup_hierarchies, mounts_under, remove_created_host_paths
from kubegpu_e2e.processes import kill_all, pids_mentioning

RUN_PREFIX = "kgpu-e2e-"


def sweep() -> list[str]:
    found: list[str] = []
    for run_dir in sorted(Path("/tmp").glob(RUN_PREFIX + "*")):
        for _ in range(20):
            pids = pids_mentioning(str(run_dir)) + _cgroup_pids(run_dir.name)
            if not pids:
                break
            found.append(f"{run_dir}: killed {len(pids)} processes")
            kill_all(pids)
            time.sleep(0.25)
        for point in mounts_under(run_dir):
            import subprocess

            if subprocess.run(["umount", point], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True)
            found.append(f"unmounted {point}")
        for hierarchy in _cgroup_hierarchies():
            for root in hierarchy.rglob(run_dir.name):
                for directory in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                    if directory.is_dir():
                        directory.rmdir()
                root.rmdir()
                found.append(f"removed cgroup {root}")
        found += remove_created_host_paths(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        found.append(f"removed {run_dir}")
    return found


def _cgroup_pids(name: str) -> list[int]:
    pids: set[int] = set()
    for hierarchy in _cgroup_hierarchies():
        for root in hierarchy.rglob(name):
            for procs in root.rglob("cgroup.procs"):
                try:
                    pids.update(int(p) for p in procs.read_text().split())
                except OSError:
                    continue
    return sorted(pids)


def remaining() -> list[str]:
    """What a run could leave behind and still does after the sweep."""
    left = [f"process {pid}" for pid in pids_mentioning("/tmp/" + RUN_PREFIX)]
    left += [f"mount {m}" for m in mounts_under(Path("/tmp")) if RUN_PREFIX in m]
    left += [f"folder {d}" for d in Path("/tmp").glob(RUN_PREFIX + "*")]
    for hierarchy in _cgroup_hierarchies():
        left += [f"cgroup {c}" for c in hierarchy.rglob(RUN_PREFIX + "*")]
    return left


if __name__ == "__main__":
    for line in sweep():
        print(f"e2e janitor: {line}", file=sys.stderr)
    left = remaining()
    for line in left:
        print(f"e2e janitor: LEFT BEHIND: {line}", file=sys.stderr)
    sys.exit(1 if left else 0)
