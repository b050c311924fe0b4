"""What the documents name in the code, and whether each name resolves.

A document drifts from the code silently: a module is renamed, a class moves, a flag is dropped,
and the prose keeps naming the old one. This module finds, in a Markdown file, every reference
of four kinds and says whether it resolves:

- **python**: a backticked dotted name whose first part is ``kubegpu``, a top-level package or
  module of ``src/kubegpu`` (``kubelet.board.DeviceBoard``, resolved as
  ``kubegpu.kubelet.board.DeviceBoard``) or a class defined in ``src/kubegpu``
  (``GpuScheduler.decide``), alone or called (``sharing.claim.read_claim(pod, names)``); also
  such a name in a fenced block (the diagrams). It resolves when the longest importable prefix
  imports and the rest is found by ``getattr`` (a class's annotated attribute, named last,
  counts). A config key (``sharing.gpuShare.enabled``) is left to
  ``test_config_keys_in_docs.py``, a Helm value (``extender.policy``) and a file name
  (``dra.md``, ``kubelet.sock``) are not Python names.
- **path**: a backticked word that starts with ``src/``, ``deploy/``, ``e2e/``, ``tests/``,
  ``bench/`` or ``docs/`` must exist in the repository; one whose first part is a package of
  ``src/kubegpu`` and that ends in ``.py`` (``kubelet/shares.py``) is read from
  ``src/kubegpu``. ``<placeholders>`` and ``*`` match any name, ``{a,b}`` is expanded;
  ``tests/x.py::test_y`` also needs ``test_y`` in the file. A ``.py`` path followed by a
  backticked name (``kubelet/shares.py`` ``Ledger``) must define that name.
- **flag**: a ``--flag`` in a backticked ``kubegpu ...`` command (or such a line of a fenced
  block) must be an option of that command (or of a command above it); a backticked ``--flag``
  alone must be an option of some command of ``kubegpu.cli.main.cli``, walked with click, or of
  one of our argparse scripts (``bench/``, ``python -m kubegpu.docgen.configuration``).
- **resource**: a ``kubegpu.io/``, ``nvidia.com/``, ``volcano.sh/`` or ``aliyun.com/`` name
  (with any subdomain, ``gpu.kubegpu.io/claim``; ``requests.`` of a quota dropped) anywhere in
  the text must appear, whole, in ``src/kubegpu`` or ``deploy/``; the DRA driver's own names
  (``gpu.kubegpu.io/<name>``) are built from its name, so ``<name>`` must be a string of
  ``src/kubegpu/dra``.

What is legitimately not ours (upstream flags, NVIDIA's names, placeholders) is in the
allow-lists below, each with the reason.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import click
import yaml

from kubegpu.cli.main import cli
from tests.docs.test_config_keys_in_docs import is_config_key

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "kubegpu"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# ---------------------------------------------------------------------------------------------
# Allow-lists: names the documents rightly use that are not defined by kubegpu's code.

# Options of other programs, named in prose without their command.
UPSTREAM_FLAGS = frozenset(
    {
        # helm install/upgrade
        "--set",
        "--wait",
        "--create-namespace",
        # kube-scheduler's leader election (install.md: the scheduler's own Lease)
        "--leader-elect-resource-name",
        "--leader-elect-resource-namespace",
        # klog's per-file verbosity (e2e.md: kube-scheduler's score lines of schedule_one.go)
        "--vmodule",
        # valgrind (benchmarks.md: how a figure was measured)
        "--tool",
        "--cache-sim",
        # the kubelet's (e2e.md: how the suite runs the real kubelet)
        "--root-dir",
        "--node-ip",
        # the peers' own (migrate-*.md, sharing.md): gpushare's scheduler extender and Volcano's
        # device plugin, named to say which of ours replaces them
        "--memory-unit",
        "--gpu-memory-factor",
    }
)

# Resource, label and annotation names that belong to others and that kubegpu's source need not
# spell: NVIDIA's GPU feature discovery labels and the peers' names, named to compare.
UPSTREAM_RESOURCES = frozenset(
    {
        # NVIDIA GPU feature discovery's labels that kubegpu labels builds from a resource name
        # and a suffix rather than spells (MIG's, kubegpu.labels.mig) or does not write (vGPU's
        # and IMEX's) (labels.md)
        "nvidia.com/gpu.multiprocessors",
        "nvidia.com/gpu.engines.*",
        "nvidia.com/gpu.slices.*",
        "nvidia.com/mig-<profile>.*",
        "nvidia.com/vgpu.present",
        "nvidia.com/vgpu.host-driver-version",
        "nvidia.com/vgpu.host-driver-branch",
        "nvidia.com/gpu.clique",
        # the peers' resources and annotations that kubegpu neither serves nor reads, named to
        # say so (sharing.md, migrate-volcano.md): Volcano's and HAMi's
        "volcano.sh/gpu-index",
        "volcano.sh/gpu-unhealthy-ids",
        "nvidia.com/gpumem",
        # an example of a resource name of the user's own choosing (quotas.md: resources.gpus)
        "nvidia.com/gpu-a100",
    }
)

# Families of names the code builds from a prefix and a value; examples of them in the documents
# resolve when the prefix does (the test checks each prefix is in the source).
BUILT_FAMILIES = (
    "kubegpu.io/gpu.product.",  # one label per GPU model, the model sanitised into the key
)

# Paths a run writes; they do not exist in a fresh clone.
WRITTEN_PATHS = frozenset({"e2e/out"})

# ---------------------------------------------------------------------------------------------

_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?")
_FILE_SUFFIXES = frozenset(
    {"md", "py", "pyi", "yaml", "yml", "json", "toml", "sock", "lock", "csv", "txt", "log", "io"}
)
_PATH_ROOTS = ("src/", "deploy/", "e2e/", "tests/", "bench/", "docs/")
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_RESOURCE = re.compile(
    r"(?<![\w/.-])((?:[a-z0-9-]+\.)*(?:kubegpu\.io|nvidia\.com|volcano\.sh|aliyun\.com))"
    r"/([\w.*<>-]*[\w*>]|)"
)
_QUOTA_PREFIXES = ("requests.", "limits.")
_COMMAND = re.compile(r"^(?:\S*/)?(?:kubegpu|kubectl gpu)(?=\s|$)|^python3? -m kubegpu(?=\s|$)")


@dataclass(frozen=True)
class Reference:
    document: Path
    line: int
    kind: str  # python, path, flag, resource
    text: str
    context: str = ""  # for a flag: the command words; for a path's name: the file

    def __str__(self) -> str:
        where = (
            self.document.relative_to(ROOT) if self.document.is_relative_to(ROOT) else self.document
        )
        extra = f" (in `{self.context}`)" if self.context else ""
        return f"{where}:{self.line}: {self.kind} `{self.text}`{extra}"


# ---------------------------------------------------------------------------------------------
# What the code defines.


@cache
def top_level_names() -> frozenset[str]:
    """The packages and modules directly under src/kubegpu."""
    return frozenset(
        p.name.removesuffix(".py")
        for p in PACKAGE.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"
    ) - {"__init__", "__main__"}


@cache
def class_homes() -> dict[str, tuple[str, ...]]:
    """Every top-level class of src/kubegpu: its name -> the modules that define it."""
    homes: dict[str, list[str]] = {}
    for file in PACKAGE.rglob("*.py"):
        if "api" in file.relative_to(PACKAGE).parts[:-1]:
            continue  # generated protobuf modules
        module = ".".join(("kubegpu", *file.relative_to(PACKAGE).with_suffix("").parts))
        module = module.removesuffix(".__init__")
        for node in ast.parse(file.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                homes.setdefault(node.name, []).append(module)
    return {name: tuple(modules) for name, modules in homes.items()}


@cache
def dra_source() -> str:
    return "\n".join(p.read_text("utf-8") for p in sorted((PACKAGE / "dra").glob("*.py")))


@cache
def helm_values() -> frozenset[str]:
    """Every key path of the chart's values.yaml (``extender.policy``): not Python names."""

    def walk(node: object, prefix: str) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                yield f"{prefix}{key}"
                yield from walk(value, f"{prefix}{key}.")

    values = yaml.safe_load((ROOT / "deploy/helm/kubegpu/values.yaml").read_text("utf-8"))
    return frozenset(walk(values, ""))


@cache
def source_text() -> str:
    """The package's source and the manifests and chart it ships."""
    files = [*PACKAGE.rglob("*"), *(ROOT / "deploy").rglob("*")]
    return "\n".join(
        p.read_text(encoding="utf-8")
        for p in sorted(files)
        if p.suffix in {".py", ".yaml", ".json", ".tpl"} and "__pycache__" not in p.parts
    )


def _commands(
    command: click.Command, path: tuple[str, ...], ctx: click.Context
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None
            yield from _commands(sub, (*path, name), click.Context(sub, parent=ctx))


@cache
def command_tree() -> dict[tuple[str, ...], frozenset[str]]:
    """Every command of ``kubegpu`` (by its words after ``kubegpu``) -> its option names."""
    tree = {}
    for path, command in _commands(cli, (), click.Context(cli)):
        names = set()
        for param in command.get_params(click.Context(command)):  # --help included
            if isinstance(param, click.Option):
                names.update(param.opts, param.secondary_opts)
        tree[path] = frozenset(names)
    return tree


# ---------------------------------------------------------------------------------------------
# Resolving.


def _getattr_path(obj: object, names: list[str]) -> bool:
    for at, name in enumerate(names):
        if hasattr(obj, name):
            obj = getattr(obj, name)
            continue
        # An annotated attribute of instances (a dataclass field, a Protocol's), named last.
        annotated = isinstance(obj, type) and any(
            name in getattr(k, "__annotations__", {}) for k in obj.__mro__
        )
        return annotated and at == len(names) - 1
    return True


def python_resolves(dotted: str) -> bool:
    parts = dotted.removesuffix("()").split(".")
    if parts[0] in class_homes() and parts[0] not in top_level_names():
        return any(
            _getattr_path(getattr(importlib.import_module(m), parts[0]), parts[1:])
            for m in class_homes()[parts[0]]
        )
    if parts[0] != "kubegpu":
        parts = ["kubegpu", *parts]
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not module.startswith(exc.name):
                raise  # the module exists but imports something missing: a real failure
            continue
        return _getattr_path(found, parts[cut:])
    return False


def _as_glob(text: str) -> str:
    return re.sub(r"<[^>]*>", "*", text)


def path_resolves(text: str, base: Path = ROOT) -> bool:
    file, _, test = text.partition("::")
    file = file.rstrip("/")
    if any(file == w or file.startswith(f"{w}/") for w in WRITTEN_PATHS):
        return True
    pattern = _as_glob(file)
    matches = list(base.glob(pattern)) if "*" in pattern else [base / pattern]
    matches = [m for m in matches if m.exists()]
    if not matches:
        return False
    if test:
        name = test.split("[")[0].split("::")[-1]
        return any(re.search(rf"\b{re.escape(name)}\b", m.read_text("utf-8")) for m in matches)
    return True


def defines(file: Path, name: str) -> bool:
    """Whether ``file`` defines ``name`` (a class, function, method or assignment) anywhere."""
    if not file.is_file():
        return False
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            defined = node.name
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined = node.id
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            defined = node.attr
        else:
            continue
        if defined == name:
            return True
    return False


@cache
def script_flags() -> frozenset[str]:
    """The options of our argparse scripts: the benchmarks (benchmarks.md names them alone) and
    the generators (``python -m kubegpu.docgen.configuration --write``)."""
    files = [*(ROOT / "bench").glob("*.py"), *PACKAGE.rglob("*.py")]
    text = "\n".join(p.read_text("utf-8") for p in sorted(files))
    return frozenset(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", text))


def flag_resolves(flag: str, command: tuple[str, ...] | None) -> bool:
    tree = command_tree()
    if command is None:
        return (
            flag in UPSTREAM_FLAGS
            or flag in script_flags()
            or any(flag in names for names in tree.values())
        )
    return any(flag in tree.get(command[:cut], frozenset()) for cut in range(len(command) + 1))


@cache
def driver_domains() -> frozenset[str]:
    """The DRA driver's names (one per naming), in whose domain its attributes, taints and
    CDI kind are."""
    from kubegpu.core.dra import DRA_NAMINGS

    return frozenset(naming.driver for naming in DRA_NAMINGS.values())


def _spelt(name: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)", source_text()) is not None


def resource_resolves(name: str) -> bool:
    if name in UPSTREAM_RESOURCES:
        return True
    domain, _, rest = name.partition("/")
    if not rest:
        return _spelt(domain)
    if "<" in rest or rest.endswith("*"):
        prefix = name.split("<")[0].rstrip("*")
        return prefix in source_text()
    if any(name.startswith(f) and len(name) > len(f) for f in BUILT_FAMILIES):
        return True
    if domain in driver_domains():
        # The DRA driver qualifies its names with its own: f"{driver}/claim", f"{driver}/{SUFFIX}"
        # with SUFFIX = "unhealthy", and device attribute keys ("uuid": ...) in its domain.
        return re.search(rf"[\"/]{re.escape(rest)}\"", dra_source()) is not None
    return _spelt(name)


def resolves(ref: Reference) -> bool:
    if ref.kind == "python":
        return python_resolves(ref.text)
    if ref.kind == "path":
        return path_resolves(ref.text, PACKAGE if ref.context == "src/kubegpu" else ROOT)
    if ref.kind == "defined":
        return defines(ROOT / ref.context, ref.text)
    if ref.kind == "flag":
        return flag_resolves(ref.text, tuple(ref.context.split()[1:]) if ref.context else None)
    return resource_resolves(ref.text)


# ---------------------------------------------------------------------------------------------
# Finding references.


def _command_words(text: str) -> tuple[str, ...] | None:
    """The subcommand path a ``kubegpu ...`` command line names, or None if it is not one."""
    text = re.sub(r"^(\$ |\w+=\S+ )+", "", text.strip())
    match = _COMMAND.match(text)
    if match is None:
        return None
    words: list[str] = []
    tree = command_tree()
    for word in text[match.end() :].split():
        word = word.rstrip(":")
        if (*words, word) in tree:
            words.append(word)
        elif not word.startswith("-") or words:
            break
    return tuple(words)


def _flags(
    document: Path, number: int, text: str, command: tuple[str, ...] | None
) -> Iterator[Reference]:
    context = " ".join(("kubegpu", *command)) if command is not None else ""
    for flag in _FLAG.findall(text):
        yield Reference(document, number, "flag", flag, context)


def _python(dotted: str) -> bool:
    parts = dotted.removesuffix("()").split(".")
    if parts[-1] in _FILE_SUFFIXES or is_config_key(dotted) or dotted in helm_values():
        return False
    first = parts[0]
    return first == "kubegpu" or first in top_level_names() or first in class_homes()


def _in_span(document: Path, number: int, span: str) -> Iterator[Reference]:
    call = re.fullmatch(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)\(.*\)", span)  # `x.f(a, b)`
    name = call.group(1) if call else span
    if _DOTTED.fullmatch(name) and _python(name):
        yield Reference(document, number, "python", name)
    for module in re.findall(r"(?:^|\s)-m (kubegpu(?:\.\w+)*)", span):  # python -m kubegpu.x
        yield Reference(document, number, "python", module)
    command = _command_words(span)
    if command is not None:
        yield from _flags(document, number, span, command)
    elif re.fullmatch(r"--[a-z][a-z0-9-]*(?:[= ]\S+)?", span):
        yield from _flags(document, number, span.split("=")[0].split()[0], None)
    if span.startswith("kubectl ") and command is None:
        return  # deploy/x there is a Deployment
    words = (
        w for chunk in span.split() for x in _expand(chunk).split() for w in re.split(r"[=,()]+", x)
    )
    for word in words:
        word = word.rstrip(".:;")
        if word.startswith(_PATH_ROOTS):
            yield Reference(document, number, "path", word)
        elif (
            "/" in word
            and word.split("/")[0] in top_level_names()
            and (word.endswith(".py") or (PACKAGE / word).is_dir())
        ):
            yield Reference(document, number, "path", word, "src/kubegpu")


def _expand(word: str) -> str:
    """A shell brace expansion, as words joined by spaces: ``a/{b,c}/`` -> ``a/b/ a/c/``."""
    match = re.search(r"\{([^{}]*,[^{}]*)\}", word)
    if match is None:
        return word
    return " ".join(
        _expand(word[: match.start()] + choice + word[match.end() :])
        for choice in match.group(1).split(",")
    )


def _defined_names(document: Path, number: int, line: str) -> Iterator[Reference]:
    """``path.py`` ``Name`` side by side: the file must define the name."""
    for path, name in re.findall(r"`([\w/]+\.py)`\s+`([A-Za-z_]\w*)`", line):
        base = "src/kubegpu/" if path.split("/")[0] in top_level_names() else ""
        yield Reference(document, number, "defined", name, base + path)


def references(document: Path) -> Iterator[Reference]:
    fence: str | None = None
    pending = ""
    for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), 1):
        for domain, rest in _RESOURCE.findall(line):
            for prefix in _QUOTA_PREFIXES:  # requests.nvidia.com/gpu: a quota on the resource
                domain = domain.removeprefix(prefix)
            yield Reference(document, number, "resource", f"{domain}/{rest}".rstrip("/"))
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1) == fence:
                fence = None
                continue
            # A command line in a fenced block, its continuations joined.
            pending += line.rstrip("\\")
            if line.endswith("\\"):
                continue
            command = _command_words(pending)
            if command is not None:
                yield from _flags(document, number, pending, command)
            for dotted in _DOTTED.findall(pending):  # diagrams, `python -m kubegpu.x`
                if _python(dotted) and not re.search(rf"[\w/-]{re.escape(dotted)}", pending):
                    yield Reference(document, number, "python", dotted)
            pending = ""
            continue
        if opened:
            fence = opened.group(1)
            continue
        for span in _SPAN.findall(line):
            yield from _in_span(document, number, span)
        yield from _defined_names(document, number, line)


def broken(documents: list[Path]) -> list[Reference]:
    return [ref for doc in documents for ref in references(doc) if not resolves(ref)]
