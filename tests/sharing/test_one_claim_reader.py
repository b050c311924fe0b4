"""Only ``sharing/`` reads a pod's resources and decision below :func:`read_claim`.

``sharing.claim.read_claim`` is the one reader of a pod's GPU claim; the lower-level readers it
is built from (the pod's resource totals, its servable request, its recorded decision) stay
inside the sharing package, so a consumer cannot judge a pod by rules of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kubegpu

# The readers read_claim is built from: a module outside sharing/ uses the claim instead.
LOWER_LEVEL_READERS = frozenset(
    {"gpu_request", "pod_totals", "request_from_totals", "read_decision"}
)

PACKAGE = Path(kubegpu.__file__).parent


def lower_level_imports(source: str) -> list[str]:
    """``module.name`` of every lower-level reader ``source`` imports from kubegpu.sharing."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kubegpu.sharing"):
            found += [
                f"{node.module}.{a.name}" for a in node.names if a.name in LOWER_LEVEL_READERS
            ]
        elif isinstance(node, ast.Attribute) and node.attr in LOWER_LEVEL_READERS:
            # ``resources.gpu_request(...)`` after ``from kubegpu.sharing import resources``
            found.append(f"{ast.unparse(node.value)}.{node.attr}")
    return found


def test_no_module_outside_sharing_uses_a_lower_level_reader() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): names
        for path in sorted(PACKAGE.rglob("*.py"))
        if "sharing" not in path.relative_to(PACKAGE).parts[:1]
        and (names := lower_level_imports(path.read_text()))
    }
    assert offenders == {}, f"use kubegpu.sharing.claim.read_claim instead: {offenders}"


def test_the_check_sees_both_forms_of_use() -> None:
    # The guard must be able to fail: both spellings of a lower-level read are caught.
    assert lower_level_imports(
        "from kubegpu.sharing.resources import RequestKind, gpu_request"
    ) == ["kubegpu.sharing.resources.gpu_request"]
    assert lower_level_imports("from kubegpu.sharing import claim\nclaim.read_decision(pod)") == [
        "claim.read_decision"
    ]
    assert lower_level_imports("from kubegpu.sharing.claim import read_claim") == []
