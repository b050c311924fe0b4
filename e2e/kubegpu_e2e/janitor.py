"""Last line of cleanup, run by e2e/run after pytest whatever happened to it (even SIGKILL):
every process that names a run folder, every mount under it and under the kubelet's root, its
cgroups, the folder and the suite's network namespace go."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from kubegpu_e2e.cluster import (
    KUBELET_ROOT,
    _cgroup_hierarchies,
    cgroup_pids,
    mounts_under,
    remove_cgroups,
    remove_created_host_paths,
    unmount_all,
)
from kubegpu_e2e.processes import kill_all, pids_mentioning

RUN_PREFIX = "kgpu-e2e-"


def sweep() -> list[str]:
    found: list[str] = []
    for run_dir in sorted(Path("/tmp").glob(RUN_PREFIX + "*")):
        for _ in range(20):
            pids = pids_mentioning(str(run_dir)) + cgroup_pids(run_dir.name)
            if not pids:
                break
            found.append(f"{run_dir}: killed {len(pids)} processes")
            kill_all(pids)
            time.sleep(0.25)
        found += unmount_all(run_dir)
        found += unmount_all(KUBELET_ROOT)
        found += remove_cgroups(run_dir.name)
        found += remove_created_host_paths(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        found.append(f"removed {run_dir}")
    for namespace in network_namespaces():
        subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
        found.append(f"deleted network namespace {namespace}")
    return found


def network_namespaces() -> list[str]:
    """The suite's network namespaces (e2e/run names them kgpu-e2e-<pid>)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(RUN_PREFIX)]


def remaining() -> list[str]:
    """What a run could leave behind and still does after the sweep."""
    left = [f"process {pid}" for pid in pids_mentioning("/tmp/" + RUN_PREFIX)]
    left += [f"mount {m}" for m in mounts_under(Path("/tmp")) if RUN_PREFIX in m]
    left += [f"mount {m}" for m in mounts_under(KUBELET_ROOT)]
    left += [f"folder {d}" for d in Path("/tmp").glob(RUN_PREFIX + "*")]
    left += [f"network namespace {n}" for n in network_namespaces()]
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
