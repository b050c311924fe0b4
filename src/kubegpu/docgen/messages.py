"""User-facing error message templates, found in the source by reading its syntax tree.

``docs/troubleshooting.md`` is written by hand, but which messages it must explain is not a
matter of memory: :func:`find_messages` lists every ``raise SomeError("...")`` (for the
exception names asked for), every ``(message, hint)`` table entry and every
``log.error/warning("...")`` format string in the given files, each reduced to a *stable
fragment*: the longest literal run of the template, so an f-string's placeholders and a log
call's ``%s`` never make the match flaky. ``tests/docs`` checks each fragment appears in the
troubleshooting guide, so a new error cannot land undocumented.

Run ``python -m kubegpu.docgen.messages FILE...`` to print what would be checked.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Shorter literal runs ("got ", ": ") say nothing about which message it is.
MIN_FRAGMENT = 8
_EDGE = " \t\n:;,.()[]{}'\"-—=<>"
_PERCENT = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrifgx%]")


@dataclass(frozen=True)
class Message:
    file: str
    line: int
    kind: str  # the exception raised, "hint", "log.warning" ...
    fragment: str


def _literal_runs(node: ast.expr) -> list[str]:
    """Literal text of a string expression, split wherever a value is substituted."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        runs: list[str] = []
        current = ""
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                current += part.value
            else:
                runs.append(current)
                current = ""
        runs.append(current)
        return runs
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal_runs(node.left) + _literal_runs(node.right)
    return []


def stable_fragment(node: ast.expr, *, percent_style: bool = False) -> str | None:
    """The longest literal run, trimmed; None when there is none worth matching."""
    runs = _literal_runs(node)
    if percent_style:
        runs = [piece for run in runs for piece in _PERCENT.split(run)]
    best = max((run.strip(_EDGE) for run in runs), key=len, default="")
    return best if len(best) >= MIN_FRAGMENT else None


def _call_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _string_args(call: ast.Call) -> list[ast.expr]:
    args = [a for a in call.args if _literal_runs(a)]
    args += [k.value for k in call.keywords if k.arg in ("hint", "message") and k.value]
    return args


def find_messages(
    files: Iterable[Path],
    exceptions: Sequence[str],
    *,
    logs: bool = False,
    hint_tables: bool = False,
) -> list[Message]:
    """Every message template in ``files`` raised as one of ``exceptions`` (all string
    arguments, so an error's hint counts too), plus log warnings/errors and ``(message,
    hint)`` table entries when asked."""
    found: list[Message] = []
    for path in sorted(files):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                name = _call_name(node.exc)
                if name in exceptions:
                    for arg in _string_args(node.exc):
                        fragment = stable_fragment(arg)
                        if fragment:
                            found.append(Message(str(path), node.lineno, name, fragment))
            elif logs and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                level = node.func.attr
                owner = node.func.value
                if (
                    level in ("error", "warning", "exception", "critical")
                    and isinstance(owner, ast.Name)
                    and owner.id in ("log", "logger")
                    and node.args
                ):
                    fragment = stable_fragment(node.args[0], percent_style=True)
                    if fragment:
                        found.append(Message(str(path), node.lineno, f"log.{level}", fragment))
            elif hint_tables and isinstance(node, ast.Dict):
                for value in node.values:
                    if isinstance(value, ast.Tuple) and len(value.elts) == 2:
                        for elt in value.elts:
                            fragment = stable_fragment(elt)
                            if fragment:
                                found.append(Message(str(path), elt.lineno, "hint", fragment))
    return found


def normalise(text: str) -> str:
    """Whitespace-insensitive, so a wrapped line in the guide still matches."""
    return " ".join(text.split())


def main(argv: Sequence[str] | None = None) -> int:
    paths = [Path(a) for a in (argv if argv is not None else sys.argv[1:])]
    names = (
        "ConfigError",
        "ExtenderConfigError",
        "InventoryError",
        "AllocationError",
        "AllocationRefused",
        "PlanError",
    )
    for message in find_messages(paths, names, logs=True, hint_tables=True):
        print(f"{message.file}:{message.line}: {message.kind}: {message.fragment}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
