"""Click parameter types shared by the subcommands: bounded numbers and checked paths.

``click.FloatRange`` compares with ``<``/``>``, which NaN always passes, so ``--interval nan``
would get through any range; and an interval or timeout of 0 (or less) makes a loop spin or a
wait return at once. Every such option takes one of these instead of a bare ``float``, and
every number has a maximum as well as a minimum: an unbounded count or size is a way to make a
process allocate until it is killed (``--seed-nodes 10**30``), an unbounded interval a timer
that never fires. ``tests/cli`` walks the command tree and fails on a number without both.

A folder option takes :class:`Folder`: ``click.Path`` accepts a folder under one the user
cannot enter (the ``PermissionError`` surfaces later, as a traceback), an empty string (which
is the current folder) and, without ``exists``, a path under a regular file.
"""

from __future__ import annotations

import errno
import math
import os
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

# The longest interval or timeout any option takes unless it says otherwise: a day.
ONE_DAY_S = 86_400.0
# Seeds are handed to NumPy's and Python's generators, whose legacy seeding takes 32 bits.
MAX_SEED = 2**32 - 1


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that refuses NaN and infinities."""

    name = "float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        converted = super().convert(value, param, ctx)
        if isinstance(converted, float) and not math.isfinite(converted):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return converted


def seconds(minimum: float = 0.0, maximum: float = ONE_DAY_S) -> FiniteFloatRange:
    """A duration in seconds greater than ``minimum`` (0: any positive duration) and at most
    ``maximum`` (a day unless the option says otherwise)."""
    return FiniteFloatRange(min=minimum, max=maximum, min_open=True)


POSITIVE_SECONDS = seconds()


def _default(param: click.Parameter | None, ctx: click.Context | None) -> bool:
    if param is None or ctx is None or param.name is None:
        return False
    return ctx.get_parameter_source(param.name) in (
        ParameterSource.DEFAULT,
        ParameterSource.DEFAULT_MAP,
    )


class Folder(click.Path):
    """A folder the command writes in (``writable``) or reads (``must_exist``), checked when
    the options are read so that a bad one is a usage error (exit 2) naming the option.

    Refused: an empty value, a regular file, a path under one, a folder under one this process
    cannot enter, one it may not write in (``writable``) or read (``must_exist``), and a
    missing one (``must_exist``). ``default_may_be_missing``: the option's default names a
    folder of a Kubernetes node that a developer's machine may lack; only a folder the user
    names must exist.
    """

    def __init__(
        self,
        *,
        writable: bool = True,
        must_exist: bool = False,
        default_may_be_missing: bool = False,
        purpose: str = "write",
    ) -> None:
        super().__init__(path_type=Path, file_okay=False, dir_okay=True)
        self.writable = writable
        self.must_exist = must_exist
        self.default_may_be_missing = default_may_be_missing
        self.purpose = purpose

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Path):
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            self.fail("an empty path is no folder", param, ctx)
        path = Path(value)
        existing = path
        try:
            while not existing.exists() and existing != existing.parent:
                existing = existing.parent
        except OSError as exc:  # EACCES: a folder above it cannot be entered
            self.fail(f"{value}: {_unreachable(exc)}", param, ctx)
        if not existing.is_dir():
            what = "is" if existing == path else f"lies under {existing}, which is"
            self.fail(f"{value} {what} not a folder", param, ctx)
        missing_ok = self.default_may_be_missing and _default(param, ctx)
        if existing != path and self.must_exist and not missing_ok:
            self.fail(f"{value} does not exist", param, ctx)
        if self.writable and not os.access(existing, os.W_OK | os.X_OK):
            self.fail(f"{existing}: no permission to {self.purpose} there", param, ctx)
        if self.must_exist and existing == path and not os.access(path, os.R_OK | os.X_OK):
            self.fail(f"{value}: no permission to read it", param, ctx)
        return path


class NonEmptyPath(click.Path):
    """``click.Path`` that refuses an empty value, which it would take as the current folder
    (``Path("")`` is ``.``): the option would then name something the user never wrote."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path names nothing", param, ctx)
        return super().convert(value, param, ctx)


def input_file(*, exists: bool = True) -> NonEmptyPath:
    """A file the command reads (``exists=False``: one it checks itself, later)."""
    return NonEmptyPath(path_type=Path, exists=exists, dir_okay=False)


class HostFile(NonEmptyPath):
    """A file of the host the command reads if it is there: the default may be missing (the
    command does without it), a path the user gives must be a readable file."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, exists=True, dir_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if _default(param, ctx):
            return Path(value)
        return super().convert(value, param, ctx)


class SocketPath(NonEmptyPath):
    """A unix socket's path: missing is fine (the kubelet, or the command, makes the socket),
    but not a folder, a path under a regular file, where no socket can ever be, nor a file
    that is not a socket (a mistyped path that would be deleted to make the socket)."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, dir_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        try:
            if Path(path).exists() and not Path(path).is_socket():
                self.fail(f"{value} is there and is no socket: refusing to replace it", param, ctx)
        except OSError:
            pass  # unreachable: said below
        folder = Path(path).parent
        try:
            while not folder.exists() and folder != folder.parent:
                folder = folder.parent
        except OSError as exc:
            self.fail(f"{value}: {_unreachable(exc)}", param, ctx)
        if not folder.is_dir():
            self.fail(f"{value} lies under {folder}, which is not a folder", param, ctx)
        if not os.access(folder, os.X_OK):
            self.fail(
                f"{value}: {folder} may not be entered, so no socket there can be reached",
                param,
                ctx,
            )
        return path


class OutputFile(click.Path):
    """A file the command creates or replaces: refused when empty, a folder, under a regular
    file, or in a folder this process cannot enter or write in. A missing folder above it is
    fine where the command makes it (``parents``), else refused too. ``check_default=False``:
    the default names a node's path that is written only in some modes, so it is checked
    when written, not here."""

    def __init__(self, *, parents: bool = False, check_default: bool = True) -> None:
        super().__init__(path_type=Path, dir_okay=False, file_okay=True)
        self.parents = parents
        self.check_default = check_default

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Path):
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            self.fail("an empty path is no file", param, ctx)
        path = Path(value)
        if not self.check_default and _default(param, ctx):
            return path
        try:
            if path.is_dir():
                self.fail(f"{value} is a folder, not a file", param, ctx)
            folder = path.parent
            while not folder.exists() and folder != folder.parent:
                if not self.parents:
                    self.fail(f"{value}: its folder {folder} does not exist", param, ctx)
                folder = folder.parent
        except OSError as exc:
            self.fail(f"{value}: {_unreachable(exc)}", param, ctx)
        if not folder.is_dir():
            self.fail(f"{value} lies under {folder}, which is not a folder", param, ctx)
        if not os.access(folder, os.W_OK | os.X_OK):
            self.fail(f"{folder}: no permission to write there", param, ctx)
        if os.path.lexists(path) and not os.access(path, os.W_OK):
            self.fail(f"{value}: no permission to write it", param, ctx)
        return path


def _unreachable(exc: OSError) -> str:
    reason = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
    if exc.errno == errno.EACCES:
        return f"cannot be reached, a folder above it may not be entered ({reason})"
    return f"cannot be reached ({reason})"
