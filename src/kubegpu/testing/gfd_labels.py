"""What NVIDIA's own tests expect of GPU Feature Discovery's labels, as a check of a label set.

``kubegpu labels`` writes GFD's label names so that node selectors written for GFD keep
working; NVIDIA's tests say what those labels look like. One check, used by the unit tests on
the labeller's output and by the end-to-end suite on the real Node, so both hold the labels to
the same expectations.

The patterns are NVIDIA's, copied unchanged from NVIDIA/k8s-device-plugin at commit
1b826acc6af3079d8923bac395c3124b8861a9a6 (Copyright NVIDIA CORPORATION & AFFILIATES,
Apache-2.0):

* ``tests/e2e/gpu-feature-discovery_test.go``, ``expectedLabelPatterns``: the labels its e2e
  suite requires on a GPU node, a regular expression per value;
* ``tests/expected-output.txt``: its golden file, a regular expression per ``key=value`` line;
  ``cmd/gpu-feature-discovery/main_test.go`` requires every line GFD writes to match one.

NVIDIA's matchers are looser than they look, and this check is stricter in three ways. Go's
``MatchString`` is unanchored and the bracketed alternatives are character classes
(``[true|false]`` accepts any value holding one of those letters), so :data:`EXACT_FORMS`
adds the values GFD's source (``internal/lm`` at the same commit) can write, matched whole.
NVIDIA's e2e matcher lists a missing label and then passes; here a missing label is a gap. And
the golden file is also read the other way: every one of its lines must match a label, as GFD
run against NVIDIA's mock NVML writes them all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# tests/e2e/gpu-feature-discovery_test.go, expectedLabelPatterns (NVIDIA, unchanged).
E2E_LABEL_PATTERNS: Mapping[str, str] = {
    "nvidia.com/gfd.timestamp": "[0-9]{10}",
    "nvidia.com/cuda.driver.major": "[0-9]+",
    "nvidia.com/cuda.driver.minor": "[0-9]+",
    "nvidia.com/cuda.driver.rev": "[0-9]*",
    "nvidia.com/cuda.runtime.major": "[0-9]+",
    "nvidia.com/cuda.runtime.minor": "[0-9]+",
    "nvidia.com/gpu.machine": ".*",
    "nvidia.com/gpu.count": "[0-9]+",
    "nvidia.com/gpu.replicas": "[0-9]+",
    "nvidia.com/gpu.sharing-strategy": "[none|mps|time-slicing]",
    "nvidia.com/gpu.product": "[A-Za-z_-]+",
    "nvidia.com/gpu.memory": "[0-9]+",
    "nvidia.com/gpu.family": "[a-z]+",
    "nvidia.com/mig.capable": "[true|false]",
    "nvidia.com/gpu.compute.major": "[0-9]+",
    "nvidia.com/gpu.compute.minor": "[0-9]+",
    "nvidia.com/mps.capable": "[true|false]",
}

# tests/expected-output.txt (NVIDIA, unchanged): GFD's labels on a GPU without MIG.
EXPECTED_OUTPUT: tuple[str, ...] = (
    r"nvidia\.com\/gfd\.timestamp=[0-9]{10}",
    r"nvidia\.com\/cuda\.driver\.major=[0-9]+",
    r"nvidia\.com\/cuda\.driver\.minor=[0-9]+",
    r"nvidia\.com\/cuda\.driver\.rev=[0-9]*",
    r"nvidia\.com\/cuda\.runtime\.major=[0-9]+",
    r"nvidia\.com\/cuda\.runtime\.minor=[0-9]+",
    r"nvidia\.com\/cuda\.driver-version\.major=[0-9]+",
    r"nvidia\.com\/cuda\.driver-version\.minor=[0-9]+",
    r"nvidia\.com\/cuda\.driver-version\.revision=[0-9]*",
    r"nvidia\.com\/cuda\.driver-version\.full=([0-9]+)(.[0-9]+)(.[0-9]+)",
    r"nvidia\.com\/cuda\.runtime-version\.major=[0-9]+",
    r"nvidia\.com\/cuda\.runtime-version\.minor=[0-9]+",
    r"nvidia\.com\/cuda\.runtime-version\.full=([0-9]+)(.[0-9]+)",
    r"nvidia\.com\/gpu\.machine=.*",
    r"nvidia\.com\/gpu\.count=[0-9]+",
    r"nvidia\.com\/gpu\.replicas=[0-9]+",
    r"nvidia\.com\/gpu\.sharing-strategy=[none|mps|time-slicing]",
    r"nvidia\.com\/gpu\.product=[A-Za-z_-]+",
    r"nvidia\.com\/gpu\.memory=[0-9]+",
    r"nvidia\.com\/gpu\.family=[a-z]+",
    r"nvidia\.com\/gpu\.mode=[unknown|compute|graphics]",
    r"nvidia\.com\/mig\.capable=[true|false]",
    r"nvidia\.com\/gpu\.compute\.major=[0-9]+",
    r"nvidia\.com\/gpu\.compute\.minor=[0-9]+",
    r"nvidia\.com\/mps\.capable=[true|false]",
)

_NUMBER = "[0-9]+"

# Ours, not NVIDIA's: each value as GFD's source writes it, matched whole (fmt "%d" numbers,
# strconv.FormatBool, its family table, its sanitised names, its three sharing strategies).
EXACT_FORMS: Mapping[str, str] = {
    "nvidia.com/gfd.timestamp": "[0-9]{10}",
    "nvidia.com/cuda.driver.major": _NUMBER,
    "nvidia.com/cuda.driver.minor": _NUMBER,
    "nvidia.com/cuda.driver.rev": "[0-9]*",
    "nvidia.com/cuda.runtime.major": _NUMBER,
    "nvidia.com/cuda.runtime.minor": _NUMBER,
    "nvidia.com/cuda.driver-version.major": _NUMBER,
    "nvidia.com/cuda.driver-version.minor": _NUMBER,
    "nvidia.com/cuda.driver-version.revision": "[0-9]*",
    "nvidia.com/cuda.driver-version.full": r"[0-9]+\.[0-9]+(\.[0-9]+)?",
    "nvidia.com/cuda.runtime-version.major": _NUMBER,
    "nvidia.com/cuda.runtime-version.minor": _NUMBER,
    "nvidia.com/cuda.runtime-version.full": r"[0-9]+\.[0-9]+",
    "nvidia.com/gpu.machine": "[A-Za-z0-9_.-]*",
    "nvidia.com/gpu.count": _NUMBER,
    "nvidia.com/gpu.replicas": _NUMBER,
    "nvidia.com/gpu.sharing-strategy": "none|mps|time-slicing",
    "nvidia.com/gpu.product": "[A-Za-z0-9_.-]+",
    "nvidia.com/gpu.memory": _NUMBER,
    "nvidia.com/gpu.family": "tesla|fermi|kepler|maxwell|pascal|volta|turing|ampere"
    "|ada-lovelace|hopper|blackwell|rubin|undefined",
    "nvidia.com/gpu.mode": "unknown|compute|graphics",
    "nvidia.com/mig.capable": "true|false",
    "nvidia.com/gpu.compute.major": _NUMBER,
    "nvidia.com/gpu.compute.minor": _NUMBER,
    "nvidia.com/mps.capable": "true|false",
}

_GFD_PREFIX = "nvidia.com/"


def _key_of(line: str) -> str:
    """The label a golden line is about: its key pattern with the escapes taken out."""
    return re.sub(r"\\(.)", r"\1", line.partition("=")[0])


def _value_gap(labels: Mapping[str, str], key: str, pattern: str) -> str:
    if key not in labels:
        return "missing"
    return f"{labels[key]!r} does not match {pattern!r}"


def gfd_label_gaps(labels: Mapping[str, str]) -> dict[str, str]:
    """Every way ``labels`` falls short of NVIDIA's expectations of GFD, by label key: missing,
    a value that does not match, or an ``nvidia.com/`` label GFD does not write. Empty when
    none. ``labels`` are the labeller's own (on a Node, only those it owns: other components
    put ``nvidia.com/`` labels there too)."""
    gaps: dict[str, str] = {}
    for key, pattern in E2E_LABEL_PATTERNS.items():
        if key not in labels or not re.search(pattern, labels[key]):
            gaps[key] = _value_gap(labels, key, pattern)
    lines = [f"{key}={value}" for key, value in labels.items()]
    for line in EXPECTED_OUTPUT:
        if not any(re.search(line, written) for written in lines):
            key = _key_of(line)
            gaps.setdefault(key, _value_gap(labels, key, line))
    for key, value in labels.items():
        if key.startswith(_GFD_PREFIX) and not any(
            re.search(line, f"{key}={value}") for line in EXPECTED_OUTPUT
        ):
            gaps.setdefault(key, "not a label GFD writes on a GPU without MIG")
    for key, form in EXACT_FORMS.items():
        if key in labels and not re.fullmatch(form, labels[key]):
            gaps.setdefault(key, f"{labels[key]!r} is not GFD's form {form!r}")
    return gaps
