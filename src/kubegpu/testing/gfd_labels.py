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
  ``cmd/gpu-feature-discovery/main_test.go`` requires every line GFD writes to match one;
  ``tests/expected-output-mig-mixed.txt`` and ``-mig-single.txt``: the same under the MIG
  strategies.

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

# The MIG strategies' golden files: the lines of expected-output.txt but its gpu.mode line
# (single writes "[compute]"), then each strategy's own (NVIDIA, unchanged).
_MIG_COMMON = tuple(line for line in EXPECTED_OUTPUT if "gpu\\.mode" not in line)
EXPECTED_OUTPUT_MIG: Mapping[str, tuple[str, ...]] = {
    "mixed": (
        *_MIG_COMMON,
        r"nvidia\.com\/gpu\.mode=[unknown|compute|graphics]",
        r"nvidia\.com\/mig\.strategy=[a-z_-]+",
        r"nvidia\.com\/mig-[0-9]+g\.[0-9]+gb\.product=[A-Za-z_-]+",
        r"nvidia\.com\/mig-[0-9]+g\.[0-9]+gb\.count=[0-9]+",
        r"nvidia\.com\/mig-[0-9]+g\.[0-9]+gb\.replicas=[0-9]+",
        r"nvidia\.com\/mig-[0-9]+g\.[0-9]+gb\.sharing-strategy=[none|mps|time-slicing]",
        r"nvidia\.com\/mig-[0-9]+g\.[0-9]+gb\.memory=[0-9]+",
        r"nvidia\.com\/mig-[0-9]+g\.[0-9]+gb\.multiprocessors=[0-9]+",
        r"nvidia\.com\/mig-[0-9]+g\.[0-9]+gb\.engines\.copy=[0-9]+",
        r"nvidia\.com\/mig-[0-9]+g\.[0-9]+gb\.engines\.decoder=[0-9]+",
        r"nvidia\.com\/mig-[0-9]+g\.[0-9]+gb\.engines\.encoder=[0-9]+",
        r"nvidia\.com\/mig-[0-9]+g\.[0-9]+gb\.engines\.jpeg=[0-9]+",
        r"nvidia\.com\/mig-[0-9]+g\.[0-9]+gb\.engines\.ofa=[0-9]+",
        r"nvidia\.com\/mig-[0-9]+g\.[0-9]+gb\.slices\.gi=[0-9]+",
        r"nvidia\.com\/mig-[0-9]+g\.[0-9]+gb\.slices\.ci=[0-9]+",
    ),
    "single": (
        *_MIG_COMMON,
        r"nvidia\.com\/mig\.strategy=[a-z_-]+",
        r"nvidia\.com\/gpu\.multiprocessors=[0-9]+",
        r"nvidia\.com\/gpu\.engines\.copy=[0-9]+",
        r"nvidia\.com\/gpu\.engines\.decoder=[0-9]+",
        r"nvidia\.com\/gpu\.engines\.encoder=[0-9]+",
        r"nvidia\.com\/gpu\.engines\.jpeg=[0-9]+",
        r"nvidia\.com\/gpu\.engines\.ofa=[0-9]+",
        r"nvidia\.com\/gpu\.slices\.gi=[0-9]+",
        r"nvidia\.com\/gpu\.slices\.ci=[0-9]+",
        r"nvidia\.com\/gpu\.mode=[compute]",
    ),
}

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
    # Under the MIG strategies (internal/lm/mig-strategy.go).
    "nvidia.com/mig.strategy": "single|mixed",
    **{
        f"nvidia.com/gpu.{suffix}": _NUMBER
        for suffix in (
            "multiprocessors",
            "slices.gi",
            "slices.ci",
            "engines.copy",
            "engines.decoder",
            "engines.encoder",
            "engines.jpeg",
            "engines.ofa",
        )
    },
}
# Ours too: a mixed profile's labels, by the key's suffix.
_MIG_KEY = re.compile(r"^nvidia\.com/mig-[0-9]+g\.[0-9]+gb(\.me)?\.(?P<suffix>.+)$")
MIG_EXACT_FORMS: Mapping[str, str] = {
    "count": _NUMBER,
    "replicas": _NUMBER,
    "sharing-strategy": "none|mps|time-slicing",
    "product": r"[A-Za-z0-9_.-]+-MIG-[0-9]+g\.[0-9]+gb(\.me)?(-SHARED)?",
    **dict.fromkeys(
        (
            "memory",
            "multiprocessors",
            "slices.gi",
            "slices.ci",
            "engines.copy",
            "engines.decoder",
            "engines.encoder",
            "engines.jpeg",
            "engines.ofa",
        ),
        _NUMBER,
    ),
}

_GFD_PREFIX = "nvidia.com/"


def _key_of(line: str) -> str:
    """The label a golden line is about: its key pattern with the escapes taken out."""
    return re.sub(r"\\(.)", r"\1", line.partition("=")[0])


def _value_gap(labels: Mapping[str, str], key: str, pattern: str) -> str:
    if key not in labels:
        return "missing"
    return f"{labels[key]!r} does not match {pattern!r}"


def gfd_label_gaps(labels: Mapping[str, str], mig_strategy: str = "none") -> dict[str, str]:
    """Every way ``labels`` falls short of NVIDIA's expectations of GFD, by label key: missing,
    a value that does not match, or an ``nvidia.com/`` label GFD does not write. Empty when
    none. ``labels`` are the labeller's own (on a Node, only those it owns: other components
    put ``nvidia.com/`` labels there too). ``mig_strategy`` ``single`` or ``mixed`` holds them
    to that strategy's golden file (of a node whose MIG devices are valid for it)."""
    golden = EXPECTED_OUTPUT_MIG.get(mig_strategy, EXPECTED_OUTPUT)
    gaps: dict[str, str] = {}
    for key, pattern in E2E_LABEL_PATTERNS.items():
        if key not in labels or not re.search(pattern, labels[key]):
            gaps[key] = _value_gap(labels, key, pattern)
    lines = [f"{key}={value}" for key, value in labels.items()]
    for line in golden:
        if not any(re.search(line, written) for written in lines):
            key = _key_of(line)
            gaps.setdefault(key, _value_gap(labels, key, line))
    for key, value in labels.items():
        if key.startswith(_GFD_PREFIX) and not any(
            re.search(line, f"{key}={value}") for line in golden
        ):
            where = "on a GPU without MIG" if golden is EXPECTED_OUTPUT else f"for {mig_strategy}"
            gaps.setdefault(key, f"not a label GFD writes {where}")
    for key, value in labels.items():
        mig = _MIG_KEY.match(key)
        form = MIG_EXACT_FORMS.get(mig["suffix"], "") if mig else EXACT_FORMS.get(key)
        if form is not None and not re.fullmatch(form, value):
            gaps.setdefault(key, f"{value!r} is not GFD's form {form!r}")
    return gaps
