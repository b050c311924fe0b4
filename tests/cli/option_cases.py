"""The generated corpus's cases: made from the click command tree, option by option, by type.

See ``test_generated_corpus`` for what is made and expected. Run as a module, it reads the
options of a list of cases (JSON on stdin: ``[[case index, scratch folder], ...]`` of
:func:`cases` with ``unreadable``) and prints what parsing said of each, as JSON: the test runs it
as nobody when the suite runs as root, who can read any file.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from kubegpu.cli.main import cli
from tests.cli.corpus import Outcome

# A refusal after parsing comes within seconds; a case still running at this deadline is a
# command that went on to serve with the bad value.
DEADLINE_S = 20.0
# Short enough to read as one message: click's usage lines and the error, or one log line.
MAX_LINES = 6

# Subcommand -> an invocation that is fine as it stands, so that the option each case sets
# (given last, it wins) is what the command meets. {files}: the shared good files; {scratch}:
# the case's own folder.
BASE: dict[str, list[str]] = {
    "demo": ["--work-dir", "{scratch}", "--timeout", "1"],
    "device-plugin": ["--backend", "fake", "--fake-gpus", "4xT4", "--kubelet-dir", "{scratch}/kd"],
    "discover": ["--backend", "fake", "--fake-gpus", "4xT4"],
    "dra-driver": [
        *("--backend", "fake", "--fake-gpus", "4xT4", "--node-name", "n0"),
        *("--config", "{files}/dra.yaml", "--kubeconfig", "{files}/kubeconfig.yaml"),
        *("--kubelet-dir", "{scratch}/kd", "--cdi-dir", "{scratch}/cdi"),
        *("--state-dir", "{scratch}/state"),
    ],
    "emulate-node": ["--fake-gpus", "4xT4", "--once", "--kubelet-dir", "{scratch}/kd"],
    "exporter": ["--backend", "fake", "--fake-gpus", "4xT4", "--listen", "127.0.0.1:0"],
    "extender": [
        *("--leader-lease", "none", "--kubeconfig", "{files}/kubeconfig.yaml"),
        *("--port", "0"),
    ],
    "fake-apiserver": ["--port", "0", "--kubeconfig", "{scratch}/kubeconfig"],
    "fake-gpu": ["status", "--control", "{scratch}/none.sock"],
    "inspect": ["--kubeconfig", "{files}/kubeconfig.yaml", "--request-timeout", "1"],
    "labels": ["--backend", "fake", "--fake-gpus", "4xT4", "--once"],
    "peer-webhook": ["--peer-compat", "volcano", "--port", "0"],
    "claim-budget-webhook": ["--kubeconfig", "{files}/kubeconfig.yaml", "--port", "0"],
    "simulate": [
        *("--nodes", "{files}/nodes.csv", "--pods", "{files}/pods.csv"),
        *("--out", "{scratch}/out", "--seeds", "1", "--no-plot"),
    ],
    "trace arrivals": [
        *("--nodes", "{files}/nodes.csv", "--pods", "{files}/pods.csv"),
        *("--seeds", "1", "--out", "{scratch}/arrivals"),
    ],
    "trace constrain": [
        *("--nodes", "{files}/nodes.csv", "--pods", "{files}/pods.csv"),
        *("--fraction", "0.5", "--seed", "1", "--out", "{scratch}/constrained.csv"),
    ],
}

# "subcommand option kind" -> why that value is fine for that option. A case listed here must
# be accepted by parsing (the test checks), and is not run: it is valid input.
_MADE = "a missing file or folder there is made by the command"
_SOCKET = "a socket path: the kubelet (or the fake GPU backend) makes it, maybe later"
_REPLACED = "an output the command replaces: what was in it does not matter"
ACCEPTED: dict[str, str] = {
    "demo --summary-json missing": _MADE,
    "demo --summary-json non-utf8": _REPLACED,
    "demo --pid-file missing": _MADE,
    "demo --pid-file non-utf8": "appended to, as text lines; never read",
    "demo --trace missing": "read only after the built-in scenario check (see the curated "
    "corpus's --trace case); 'openb' is a name, not a path",
    "device-plugin --kubelet-dir missing": _MADE,
    "device-plugin --fake-control missing": _SOCKET,
    "dra-driver --kubelet-dir missing": _MADE,
    "dra-driver --cdi-dir missing": _MADE,
    "dra-driver --state-dir missing": _MADE,
    "dra-driver --fake-control missing": _SOCKET,
    "emulate-node --kubelet-dir missing": _MADE,
    "emulate-node --pod-resources-socket missing": _SOCKET,
    "exporter --fake-control missing": _SOCKET,
    "exporter --pod-resources-socket missing": _SOCKET,
    "fake-apiserver --kubeconfig missing": _MADE,
    "fake-apiserver --kubeconfig non-utf8": _REPLACED,
    "labels --fake-control missing": _SOCKET,
    "labels --machine-type-file non-utf8": "DMI strings are bytes: what GFD would drop from the "
    "name (all but [A-Za-z0-9-_. ]) is dropped, the rest labels the machine",
    "labels --nfd-file missing": _MADE,
    "labels --nfd-file non-utf8": _REPLACED,
    "simulate --out missing": _MADE,
    "trace arrivals --out missing": _MADE,
    "trace constrain --out missing": _MADE,
    "trace constrain --out non-utf8": _REPLACED,
}

NUMBERS = {
    "huge": "1e30",
    "huge-int": "1" + "0" * 40,
    "negative": "-1",
    "nan": "nan",
    "inf": "inf",
    "minus-inf": "-inf",
    "word": "twelve",
}


@dataclass(frozen=True)
class Case:
    command: str  # "trace arrivals"
    param: str  # "--seeds", or an argument's name
    kind: str
    value: str  # "{scratch}", "{files}": filled in per case
    argument: bool = False

    @property
    def key(self) -> str:
        return f"{self.command} {self.param} {self.kind}"

    def args(self, files: Path, scratch: Path) -> list[str]:
        base = list(BASE[self.command])
        if self.kind == "base":  # the base invocation as it stands
            pass
        elif self.argument:  # the command's one argument leads its base invocation
            base = [self.value, *base[1:]]
        else:
            base += [self.param, self.value]
        return [a.replace("{files}", str(files)).replace("{scratch}", str(scratch)) for a in base]

    def argv(self, files: Path, scratch: Path) -> list[str]:
        """The whole command line after ``kubegpu``."""
        return [*self.command.split(), *self.args(files, scratch)]


def leaf_commands() -> Iterator[tuple[str, click.Command]]:
    def walk(group: click.Group, prefix: str) -> Iterator[tuple[str, click.Command]]:
        context = click.Context(group)
        for name in group.list_commands(context):
            command = group.get_command(context, name)
            assert command is not None, name
            path = f"{prefix} {name}".strip()
            if isinstance(command, click.Group):
                yield from walk(command, path)
            else:
                yield path, command

    return walk(cli, "")


def _numbers(kind: click.IntRange | click.FloatRange) -> dict[str, str]:
    values = dict(NUMBERS)
    integer = isinstance(kind, click.IntRange)
    if kind.max is not None:
        step = 1 if integer else max(abs(float(kind.max)), 1.0)
        values["above-max"] = str(kind.max if kind.max_open else kind.max + step)
    if kind.min is not None:
        values["below-min"] = str(kind.min if kind.min_open else kind.min - 1)
        if kind.min <= -1:
            del values["negative"]
    return values


def _paths(kind: click.Path) -> dict[str, str]:
    values = {"missing": "{scratch}/no-such-thing", "empty": ""}
    if kind.dir_okay and not kind.file_okay:
        values["a-file"] = "{scratch}/a-file"
    if kind.file_okay and not kind.dir_okay:
        values["a-folder"] = "{scratch}/a-folder"
        values["non-utf8"] = "{scratch}/latin1.bin"
    values["under-a-file"] = "{scratch}/a-file/below"
    return values


def _unreadable(kind: click.Path) -> dict[str, str]:
    if kind.dir_okay and not kind.file_okay:
        return {"unreadable": "{scratch}/locked", "under-unreadable": "{scratch}/locked/below"}
    return {"unreadable": "{scratch}/unreadable", "under-unreadable": "{scratch}/locked/below"}


def cases(*, unreadable: bool = False) -> list[Case]:
    found: list[Case] = []
    for path, command in leaf_commands():
        for param in command.params:
            if isinstance(param, click.Option) and (param.is_flag or param.hidden):
                continue
            name = param.opts[0] if isinstance(param, click.Option) else str(param.name).upper()
            argument = isinstance(param, click.Argument)
            kind = param.type
            if unreadable:
                values = _unreadable(kind) if isinstance(kind, click.Path) else {}
            elif isinstance(kind, click.Choice):
                values = {"unknown-choice": "no-such-choice"}
            elif isinstance(kind, click.IntRange | click.FloatRange):
                values = _numbers(kind)
            elif isinstance(kind, click.Path):
                values = _paths(kind)
            else:
                values = {}
            found += [Case(path, name, k, v, argument) for k, v in values.items()]
    return found


def prepare(scratch: Path) -> None:
    """The files a case's value may name, in its own folder: a case may write to its value.
    Anyone may write in the folder itself (the unreadable cases run as nobody)."""
    scratch.mkdir(parents=True)
    scratch.chmod(0o777)
    (scratch / "a-file").write_text("a regular file\n")
    (scratch / "a-folder").mkdir()
    (scratch / "latin1.bin").write_bytes("caf\xe9: \xff\xfe\n".encode("latin-1"))
    (scratch / "unreadable").write_text("version: v1\n")
    (scratch / "unreadable").chmod(0)
    (scratch / "locked").mkdir()
    (scratch / "locked").chmod(0)


@dataclass(frozen=True)
class Parsed:
    refused: bool
    message: str
    crashed: str = ""  # an exception other than click's: a traceback in a real run


def parse(case: Case, files: Path, scratch: Path) -> Parsed:
    """What reading the options does with the case, in this process: click's answer or the
    exception that would be a traceback."""
    command = dict(leaf_commands())[case.command]
    try:
        with command.make_context(f"kubegpu {case.command}", case.args(files, scratch)):
            pass
    except click.ClickException as exc:
        return Parsed(True, exc.format_message())
    except Exception as exc:
        return Parsed(True, "", crashed=f"{type(exc).__name__}: {exc}")
    return Parsed(False, "")


def names_the_culprit(case: Case, text: str, files: Path, scratch: Path) -> bool:
    value = case.args(files, scratch)[-1] if not case.argument else case.value
    shown = {case.param, case.param.strip("-")}
    if value:
        shown |= {value, Path(value).name}
    return any(s and s in text for s in shown)


def problems_of(outcome: Outcome, case: Case, files: Path, scratch: Path) -> list[str]:
    wrong = []
    if outcome.returncode is None:
        wrong.append(f"still running after {DEADLINE_S:.0f} s")
    elif outcome.returncode not in (1, 2):
        wrong.append(f"exit {outcome.returncode}")
    if "Traceback" in outcome.output:
        wrong.append("traceback")
    lines = [line for line in outcome.output.splitlines() if line.strip()]
    if len(lines) > MAX_LINES:
        wrong.append(f"{len(lines)} lines of output")
    if not names_the_culprit(case, outcome.output, files, scratch):
        wrong.append("does not name the option or the value")
    if outcome.leftover_processes:
        wrong.append("left processes behind")
    if outcome.leftover_temp:
        wrong.append(f"left {outcome.leftover_temp} in its temporary folder")
    return wrong


def main() -> int:
    files = Path(sys.argv[1])
    chosen = json.loads(sys.stdin.read())
    all_cases = cases(unreadable=True)
    answers = [asdict(parse(all_cases[index], files, Path(scratch))) for index, scratch in chosen]
    json.dump(answers, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
