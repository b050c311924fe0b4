"""Which Kubernetes the suite runs, and the feature gates it may pass to that version.

e2e/components/build.sh builds one version: the one e2e/components/go.mod pins (CI's default)
or the one KUBEGPU_E2E_K8S_VERSION (`e2e/run --k8s-version`) names. The binaries say which
(`kube-apiserver --version`), and that is the version every scenario asks about.

A feature gate means different things across versions: a gate that is GA and locked to its
default refuses any other value (the component exits at start) and only warns on the default,
and a gate a version no longer knows refuses any value. So the suite says which features it
wants on or off, and `effective_gates` turns that into what this version accepts: a locked gate
at the wanted value is left out (it is on anyway), a removed gate is left out when its feature
is on for good, anything else is passed. Wanting a locked or removed feature off is an error:
that version cannot run the scenario.

GATES is copied from each version's `pkg/features/kube_features.go` (k8s.io/kubernetes
v1.35.4, v1.36.3, v1.37.2; docs/e2e.md, "Kubernetes versions").
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

E2E = Path(__file__).resolve().parents[1]
GO_MOD = E2E / "components" / "go.mod"


@dataclass(frozen=True)
class GateSpec:
    """A gate's state from one minor version on, as kube_features.go records it."""

    since: int  # the minor version (1.<since>) this state starts at
    stage: str  # ALPHA, BETA, GA
    default: bool
    locked: bool = False


# The DRA gates (and their neighbours) the suite sets or reports, by minor version. A gate
# absent from a version's file is listed with REMOVED from that minor on.
REMOVED = "REMOVED"
GATES: dict[str, tuple[GateSpec, ...]] = {
    "DynamicResourceAllocation": (
        GateSpec(34, "GA", True),
        GateSpec(35, "GA", True, locked=True),  # "remove completely in 1.38"
    ),
    "DRAAdminAccess": (
        GateSpec(34, "BETA", True),
        GateSpec(36, "GA", True, locked=True),
    ),
    "DRAPrioritizedList": (
        GateSpec(34, "BETA", True),
        GateSpec(36, "GA", True),
        GateSpec(37, "GA", True, locked=True),
    ),
    "DRAResourceClaimDeviceStatus": (
        GateSpec(33, "BETA", True),
        GateSpec(37, "GA", True, locked=True),
    ),
    "DRAConsumableCapacity": (
        GateSpec(34, "ALPHA", False),
        GateSpec(36, "BETA", True),
    ),
    "DRADeviceTaints": (
        GateSpec(33, "ALPHA", False),
        GateSpec(36, "BETA", True),
        GateSpec(37, "GA", True),  # "LockToDefault: true in 1.38"
    ),
    "DRADeviceTaintRules": (
        GateSpec(35, "ALPHA", False),
        GateSpec(36, "BETA", False),  # its API (resource.k8s.io/v1beta2) is off by default
        GateSpec(37, "GA", True),
    ),
    "DRAExtendedResource": (
        GateSpec(34, "ALPHA", False),
        GateSpec(36, "BETA", True),
        GateSpec(37, "GA", True, locked=True),
    ),
    "DRAPartitionableDevices": (
        GateSpec(33, "ALPHA", False),
        GateSpec(36, "BETA", True),
    ),
    "DRADeviceBindingConditions": (
        GateSpec(34, "ALPHA", False),
        GateSpec(36, "BETA", True),
    ),
    "DRASchedulerFilterTimeout": (GateSpec(34, "BETA", True),),
    "ResourceHealthStatus": (
        GateSpec(31, "ALPHA", False),
        GateSpec(36, "BETA", True),
    ),
    "ResourceHealthStatusMessage": (GateSpec(36, "BETA", True),),  # new in 1.36
}
# Minor versions whose kube_features.go GATES was checked against; a newer one is treated as
# the newest of these (its gates may have moved on: check and extend GATES).
CHECKED_MINORS = (35, 36, 37)


def pinned_version() -> str:
    """The version e2e/components/go.mod pins: CI's."""
    for line in GO_MOD.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "k8s.io/kubernetes":
            return parts[1]
    raise RuntimeError(f"k8s.io/kubernetes is not pinned in {GO_MOD}")


@cache
def binary_version(bin_dir: Path) -> str:
    """What the built kube-apiserver says it is ("Kubernetes v1.36.3" -> "v1.36.3")."""
    done = subprocess.run(
        [str(bin_dir / "kube-apiserver"), "--version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    match = re.search(r"v1\.\d+\.\d+", done.stdout)
    if match is None:
        raise RuntimeError(f"{bin_dir}/kube-apiserver --version said {done.stdout!r}")
    return match.group(0)


def suite_version() -> str:
    """The version this run of the suite builds and runs: KUBEGPU_E2E_K8S_VERSION (e2e/run
    exports the one it built), else go.mod's."""
    requested = os.environ.get("KUBEGPU_E2E_K8S_VERSION", "").strip()
    if not requested:
        return pinned_version()
    return requested if requested.startswith("v") else f"v{requested}"


def minor(version: str) -> int:
    match = re.fullmatch(r"v?1\.(\d+)\.\d+", version)
    if match is None:
        raise ValueError(f"not a Kubernetes version: {version!r}")
    return int(match.group(1))


def at_least(version: str, minor_version: int) -> bool:
    return minor(version) >= minor_version


def gate_spec(gate: str, version: str) -> GateSpec | None:
    """The gate's state at that version; None for a gate GATES does not follow."""
    specs = GATES.get(gate)
    if specs is None:
        return None
    m = min(minor(version), max(CHECKED_MINORS))
    current = None
    for spec in specs:
        if spec.since <= m:
            current = spec
    return current


def effective_gates(wanted: dict[str, bool], version: str) -> dict[str, bool]:
    """The --feature-gates (and the kubelet's featureGates) that give the wanted features at
    that version: see the module's docstring."""
    passed: dict[str, bool] = {}
    for gate, on in wanted.items():
        spec = gate_spec(gate, version)
        if spec is None or not (spec.locked or spec.stage == REMOVED):
            passed[gate] = on
        elif on != spec.default:
            raise ValueError(
                f"{gate}={str(on).lower()} cannot be set on Kubernetes {version}: "
                f"{spec.stage} and locked to {str(spec.default).lower()}"
            )
    return passed


def gate_table(gates: dict[str, bool], version: str) -> dict[str, str]:
    """Per followed gate, its stage and default at that version and what the suite passed:
    for the report (report.json's "feature_gates")."""
    passed = effective_gates(gates, version)
    rows: dict[str, str] = {}
    for gate in sorted(GATES):
        spec = gate_spec(gate, version)
        if spec is None:
            continue
        state = f"{spec.stage}{', locked' if spec.locked else ''}, default {spec.default}"
        if gate in passed:
            rows[gate] = f"{state}; passed ={str(passed[gate]).lower()}"
        elif gate in gates:
            rows[gate] = f"{state}; not passed (locked at the wanted value)"
        else:
            rows[gate] = f"{state}; default"
    return rows
