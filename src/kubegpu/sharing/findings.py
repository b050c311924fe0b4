"""The node agent's two finding annotations on a pod, and their one codec.

* ``kubegpu.io/gpu-drift``: what reconciliation against the kubelet's PodResources had to
  repair in the pod's records, and when.
* ``kubegpu.io/gpu-share-mismatch``: a container got (or will get) a share of another size than
  it asked for; the text says what to do about it.

Both are for people (``kubectl describe``, docs/troubleshooting.md) and for ``kubegpu inspect``:
an RFC 3339 time, a space, then the findings joined by ``"; "``. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DRIFT_ANNOTATION = "kubegpu.io/gpu-drift"
MISMATCH_ANNOTATION = "kubegpu.io/gpu-share-mismatch"


@dataclass(frozen=True)
class Findings:
    """Findings written at ``at`` (RFC 3339; empty when the text carried no time)."""

    at: str
    lines: tuple[str, ...]


def encode_findings(findings: Findings) -> str:
    return f"{findings.at} " + "; ".join(findings.lines)


def decode_findings(text: object) -> Findings | None:
    """``None`` for anything but a string; a text without a leading time keeps it all."""
    if not isinstance(text, str) or not text:
        return None
    at, _, rest = text.partition(" ")
    if not at[:4].isdigit() or "T" not in at:
        return Findings("", tuple(text.split("; ")))
    return Findings(at, tuple(rest.split("; ")) if rest else ())


def findings(at: str, lines: Sequence[str]) -> Findings | None:
    return Findings(at, tuple(lines)) if lines else None
