"""Plain text tables for the inspect report: kubectl's look, GiB for people.

Shared by the card tables (:mod:`kubegpu.inspect.render`) and the MIG tables
(:mod:`kubegpu.inspect.mig_render`). Pure: strings out.
"""

from __future__ import annotations

from collections.abc import Iterator

UNKNOWN = "?"


def gib(mib: int | None) -> str:
    """MiB as GiB for people: ``81920`` -> ``80Gi``, ``1536`` -> ``1.5Gi``, ``300`` -> ``300Mi``."""
    if mib is None:
        return UNKNOWN
    if mib == 0:
        return "0"
    if mib < 1024:
        return f"{mib}Mi"
    value = f"{mib / 1024:.1f}".removesuffix(".0")
    return f"{value}Gi"


def percent(part: int, whole: int) -> str:
    return f"{round(100 * part / whole)}%" if whole else "-"


class Grid:
    """Left-aligned columns, widths from the widest cell: kubectl's plain table look, at a
    cost per row that stays small for thousands of cards (rich's layout engine did not)."""

    def __init__(self, headers: list[str]) -> None:
        self.headers = headers
        # None: a section break; a string: a note, printed as it is and not measured
        self.rows: list[list[str] | str | None] = []

    def add(self, cells: list[str]) -> None:
        self.rows.append(cells)

    def section(self) -> None:
        self.rows.append(None)

    def note(self, text: str) -> None:
        self.rows.append(text)

    def lines(self, indent: str = "") -> Iterator[str]:
        widths = [len(h) for h in self.headers]
        for row in self.rows:
            for i, cell in enumerate(row if isinstance(row, list) else ()):
                widths[i] = max(widths[i], len(cell))
        last = len(self.headers) - 1

        def line(cells: list[str]) -> str:
            padded = [c if i == last else c.ljust(widths[i]) for i, c in enumerate(cells)]
            return (indent + "   ".join(padded)).rstrip()

        yield line(self.headers)
        for row in self.rows:
            if row is None:
                # Under the fixed columns only: the pod lists can be very long.
                yield indent + "-" * (sum(widths[:last]) + 3 * last + len(self.headers[last]))
            elif isinstance(row, str):
                yield indent + row
            else:
                yield line(row)
