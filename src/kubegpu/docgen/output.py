"""What every generated document's ``main`` does with its text: write it, check the committed
copy is current, or print it."""

from __future__ import annotations

import sys
from pathlib import Path


def emit(text: str, output: Path, *, write: bool, check: bool, regenerate: str) -> int:
    """Write ``text`` to ``output`` (``write``), or exit status 1 with the command that
    regenerates it when ``output`` differs (``check``), or print it; 0 otherwise."""
    if write:
        output.write_text(text, encoding="utf-8")
    elif check:
        current = output.read_text(encoding="utf-8") if output.exists() else ""
        if current != text:
            print(f"{output} is stale; run: {regenerate}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0
