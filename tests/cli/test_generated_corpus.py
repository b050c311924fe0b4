"""Hostile input for every option of every ``kubegpu`` subcommand, made from the command tree.

The cases are not written here: each option's click type says which to make, so an option
added tomorrow is covered without a new test.

* numbers (``IntRange``/``FloatRange``): 1e30, a forty-digit integer, -1, NaN, infinities, a
  word, one past the documented maximum and one below the minimum;
* choices: a value that is not one;
* paths: missing, empty, a folder where a file is expected, a file where a folder is, a path
  under a regular file, non-UTF-8 content, and unreadable (``chmod 000``; as nobody when the
  suite runs as root, through ``setpriv``).

Every case must be refused: exit status 2 (or 1 for a runtime failure), a short message that
names the option or the value, no traceback, within seconds. :data:`ACCEPTED` lists the cases
that are not bad input for that option (a missing output file is made, not an error), each with
the reason; they are checked to be accepted indeed, so the list cannot go stale.

Most cases are answered by click's parsing and the option types, so they run in this process
(``make_context`` reads and checks every option without running the command); a case that
parsing accepts runs as a real process with a deadline, and a sample of the others too, to show
the process answers as the parse did.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import pytest

from kubegpu.cli.types import FiniteFloatRange
from tests.cli.corpus import make_files, run_kubegpu, setpriv
from tests.cli.option_cases import (
    ACCEPTED,
    BASE,
    DEADLINE_S,
    Case,
    Parsed,
    cases,
    leaf_commands,
    names_the_culprit,
    parse,
    prepare,
    problems_of,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scratch_root() -> Iterator[Path]:
    # Not under pytest's temporary root, which only its owner may enter: the unreadable cases
    # run as nobody, who must reach the case's folder and meet only the bad value's refusal.
    root = Path(tempfile.mkdtemp(prefix="kubegpu-corpus-"))
    root.chmod(0o755)
    yield root
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            path.chmod(0o755)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def files(scratch_root: Path) -> Path:
    folder = scratch_root / "files"
    folder.mkdir()
    return make_files(folder)


@pytest.fixture(autouse=True)
def _no_kubegpu_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("KUBEGPU_", "KUBERNETES_")) or name == "KUBECONFIG":
            monkeypatch.delenv(name)


def test_every_number_has_a_documented_minimum_and_maximum() -> None:
    numbers = (click.types.IntParamType, click.types.FloatParamType)
    ranges = (click.IntRange, click.FloatRange)
    unbounded = []
    for path, command in leaf_commands():
        for param in command.params:
            kind = param.type
            label = f"kubegpu {path} {param.opts[0] if param.opts else param.name}"
            if isinstance(kind, numbers) and not isinstance(kind, ranges):
                unbounded.append(f"{label}: a bare {kind.name}, without a range")
            if not isinstance(kind, ranges):
                continue
            if kind.min is None or kind.max is None:
                unbounded.append(f"{label}: {kind!r} lacks a bound")
            if isinstance(kind, click.FloatRange) and not isinstance(kind, FiniteFloatRange):
                unbounded.append(f"{label}: a FloatRange lets NaN through")
            # click shows the range in --help: the documentation of the bounds.
            record = param.get_help_record(click.Context(command))
            if isinstance(param, click.Option) and record and f"{kind.max}" not in record[1]:
                unbounded.append(f"{label}: --help does not show the maximum")
    assert not unbounded, "\n".join(unbounded)


def test_every_subcommand_has_a_base_invocation_that_parses(
    files: Path, scratch_root: Path
) -> None:
    commands = dict(leaf_commands())
    assert set(BASE) == set(commands), "BASE must name exactly the subcommands"
    for name in commands:
        scratch = scratch_root / f"base-{name.replace(' ', '-')}"
        prepare(scratch)
        # The option is spoiled by each case; the rest of the line must be fine as it is.
        parsed = parse(Case(name, "", "base", ""), files, scratch)
        assert not parsed.refused, f"kubegpu {name} {BASE[name]}: {parsed.message}{parsed.crashed}"


def test_accepted_cases_are_still_accepted_and_still_exist() -> None:
    keys = {case.key for case in cases()}
    assert not set(ACCEPTED) - keys, f"ACCEPTED names cases no option makes: {set(ACCEPTED) - keys}"


# The refused cases also run as processes, one of each of these kinds (each from another
# subcommand): the process must answer as the parse did, exit 2 with the one message.
SAMPLE_KINDS = ("huge", "unknown-choice", "empty", "under-a-file")


def _sample(refused: list[tuple[Case, Path]]) -> list[tuple[Case, Path]]:
    chosen: list[tuple[Case, Path]] = []
    for kind in SAMPLE_KINDS:
        taken = {case.command for case, _ in chosen}
        found = next(
            (cs for cs in refused if cs[0].kind == kind and cs[0].command not in taken), None
        )
        if found is not None:
            chosen.append(found)
    return chosen


def _run_all(
    runs: list[tuple[Case, Path]], files: Path, prefix: list[str] | None = None
) -> list[str]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(
            pool.map(
                lambda cs: run_kubegpu(
                    cs[0].argv(files, cs[1]), cs[1], timeout_s=DEADLINE_S, prefix=prefix
                ),
                runs,
            )
        )
    problems = []
    for (case, scratch), outcome in zip(runs, outcomes, strict=True):
        wrong = problems_of(outcome, case, files, scratch)
        if wrong:
            tail = "\n      ".join(outcome.output.strip().splitlines()[-3:])
            problems.append(
                f"kubegpu {case.key} ({case.value!r}): {', '.join(wrong)}\n      {tail}"
            )
    return problems


def _judge(
    all_cases: list[Case], answers: list[Parsed], scratches: list[Path], files: Path
) -> tuple[list[str], list[tuple[Case, Path]], list[tuple[Case, Path]]]:
    """Problems with what parsing said; the cases it let through (to run); those it refused."""
    problems: list[str] = []
    let_through: list[tuple[Case, Path]] = []
    refused: list[tuple[Case, Path]] = []
    for case, parsed, scratch in zip(all_cases, answers, scratches, strict=True):
        label = f"kubegpu {case.key} ({case.value!r})"
        if parsed.crashed:
            problems.append(f"{label}: reading the options raised {parsed.crashed}")
        elif case.key in ACCEPTED:
            if parsed.refused:
                problems.append(f"{label}: listed as accepted, refused: {parsed.message}")
        elif parsed.refused:
            if not names_the_culprit(case, parsed.message, files, scratch):
                problems.append(f"{label}: the refusal does not name it: {parsed.message}")
            refused.append((case, scratch))
        else:
            let_through.append((case, scratch))
    return problems, let_through, refused


def test_every_bad_value_is_refused_cleanly(files: Path, scratch_root: Path) -> None:
    all_cases = cases()
    assert len(all_cases) > 300  # the tree was walked
    scratches = [scratch_root / f"c{i}" for i in range(len(all_cases))]
    for scratch in scratches:
        prepare(scratch)
    answers = [parse(c, files, s) for c, s in zip(all_cases, scratches, strict=True)]
    problems, let_through, refused = _judge(all_cases, answers, scratches, files)
    # What parsing let through must be refused by the command itself.
    problems += _run_all([*_sample(refused), *let_through], files)
    assert not problems, f"{len(problems)} of {len(all_cases)} cases:\n" + "\n".join(problems)


def test_unreadable_paths_are_refused_cleanly(files: Path, scratch_root: Path) -> None:
    """As a user who may not read the file or enter the folder: as nobody through setpriv
    when the suite runs as root (root reads everything), else as the user running it."""
    prefix = setpriv()
    if os.geteuid() == 0 and prefix is None:
        pytest.skip("root without setpriv: root can read any file, so nothing is unreadable")
    all_cases = cases(unreadable=True)
    scratches = [scratch_root / f"u{i}" for i in range(len(all_cases))]
    for scratch in scratches:
        prepare(scratch)
    if prefix is None:  # not root: chmod 000 is enough, in this process
        answers = [parse(c, files, s) for c, s in zip(all_cases, scratches, strict=True)]
    else:  # every case's options read in one process, as nobody
        job = json.dumps([[i, str(s)] for i, s in enumerate(scratches)])
        answer = subprocess.run(
            [*prefix, sys.executable, "-m", "tests.cli.option_cases", str(files)],
            input=job,
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
            timeout=120,
        )
        assert answer.returncode == 0, answer.stderr
        answers = [Parsed(**a) for a in json.loads(answer.stdout)]
    problems, let_through, refused = _judge(all_cases, answers, scratches, files)
    problems += _run_all([*refused[:1], *let_through], files, prefix)
    assert not problems, f"{len(problems)} of {len(all_cases)} cases:\n" + "\n".join(problems)
