"""Just enough CEL to evaluate the peer webhook's ``matchConditions`` against pod JSON.

No CEL implementation is among the test dependencies, and the expression decides which pods the
API server sends to the webhook at all: a name missing from it lets a pod past the webhook
unrefused, and an expression that errors on an ordinary pod blocks that pod (``failurePolicy:
Fail``). So the tests evaluate the shipped expression itself, with CEL's semantics for what it
uses: field selection and indexing on JSON objects (a missing key is an error), ``has()``, the
``exists`` macro over lists and over a map's keys, ``in``, ``+`` on lists, ``? :``, list
literals, and ``&&``/``||``, which absorb an error when the other side decides (CEL's commutative
logic).
Anything else is a :class:`CelSyntaxError`, so an expression outside this subset fails the tests
instead of being half-understood. The real API server evaluates it in e2e/tests/test_09_peers.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class CelSyntaxError(ValueError):
    """The expression uses CEL this evaluator does not know."""


class CelError(Exception):
    """A runtime error of the expression (no such key, wrong type), as CEL reports one."""


_TOKEN = re.compile(
    r"\s*(?:(?P<string>'[^'\\]*'|\"[^\"\\]*\")|(?P<op>&&|\|\||[()\[\].,?:+])"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*))"
)


@dataclass(frozen=True)
class _Node:
    kind: str
    args: tuple[Any, ...]


def _tokens(text: str) -> list[str]:
    out, at = [], 0
    while at < len(text.rstrip()):
        match = _TOKEN.match(text, at)
        if match is None or match.end() == at:
            raise CelSyntaxError(f"cannot read {text[at : at + 20]!r}")
        out.append(match.group(match.lastgroup or "op"))
        at = match.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.at = 0

    def peek(self) -> str:
        return self.tokens[self.at] if self.at < len(self.tokens) else ""

    def take(self, expected: str = "") -> str:
        token = self.peek()
        if not token or (expected and token != expected):
            raise CelSyntaxError(f"expected {expected or 'more'}, got {token!r}")
        self.at += 1
        return token

    def parse(self) -> _Node:
        node = self.conditional()
        if self.peek():
            raise CelSyntaxError(f"unexpected {self.peek()!r}")
        return node

    def conditional(self) -> _Node:
        node = self.binary(0)
        if self.peek() == "?":
            self.take("?")
            then = self.conditional()
            self.take(":")
            return _Node("?:", (node, then, self.conditional()))
        return node

    _LEVELS = (("||",), ("&&",), ("in",), ("+",))

    def binary(self, level: int) -> _Node:
        if level == len(self._LEVELS):
            return self.member()
        node = self.binary(level + 1)
        while self.peek() in self._LEVELS[level]:
            op = self.take()
            node = _Node(op, (node, self.binary(level + 1)))
        return node

    def member(self) -> _Node:
        node = self.primary()
        while self.peek() in (".", "["):
            if self.take() == "[":
                node = _Node("index", (node, self.conditional()))
                self.take("]")
                continue
            name = self.take()
            if self.peek() != "(":
                node = _Node("select", (node, name))
                continue
            if name != "exists":
                raise CelSyntaxError(f"unknown method {name}()")
            self.take("(")
            variable = self.take()
            self.take(",")
            predicate = self.conditional()
            self.take(")")
            node = _Node(name, (node, variable, predicate))
        return node

    def primary(self) -> _Node:
        token = self.take()
        if token == "(":
            node = self.conditional()
            self.take(")")
            return node
        if token == "[":
            items = self.items("]")
            return _Node("list", tuple(items))
        if token[0] in "'\"":
            return _Node("const", (token[1:-1],))
        if token in ("true", "false"):
            return _Node("const", (token == "true",))
        if token == "has":
            self.take("(")
            field = self.member()
            self.take(")")
            if field.kind != "select":
                raise CelSyntaxError("has() takes a field selection")
            return _Node("has", field.args)
        if re.fullmatch(r"[A-Za-z_]\w*", token):
            if self.peek() == "(":
                raise CelSyntaxError(f"unknown function {token}()")
            return _Node("var", (token,))
        raise CelSyntaxError(f"unexpected {token!r}")

    def items(self, close: str) -> list[_Node]:
        items: list[_Node] = []
        while self.peek() != close:
            items.append(self.conditional())
            if self.peek() != close:
                self.take(",")
        self.take(close)
        return items


def _fields(value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise CelError(f"no field selection on {type(value).__name__}")
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise CelError(f"no matching overload: {type(value).__name__} is not a bool")
    return value


def _evaluate(node: _Node, env: Mapping[str, Any]) -> Any:
    kind, args = node.kind, node.args
    if kind == "const":
        return args[0]
    if kind == "var":
        if args[0] not in env:
            raise CelError(f"undeclared reference to {args[0]!r}")
        return env[args[0]]
    if kind in ("select", "index"):
        target = _fields(_evaluate(args[0], env))
        key = args[1] if kind == "select" else _evaluate(args[1], env)
        if key not in target:
            raise CelError(f"no such key: {key}")
        return target[key]
    if kind == "has":
        return args[1] in _fields(_evaluate(args[0], env))
    if kind == "list":
        return [_evaluate(a, env) for a in args]
    if kind in ("&&", "||"):
        decided = kind == "||"  # the value that decides alone: true for ||, false for &&
        error: CelError | None = None
        for side in args:
            try:
                if _bool(_evaluate(side, env)) == decided:
                    return decided
            except CelError as exc:
                error = error or exc
        if error is not None:
            raise error
        return not decided
    if kind == "?:":
        chosen = args[1] if _bool(_evaluate(args[0], env)) else args[2]
        return _evaluate(chosen, env)
    if kind == "in":
        element, container = _evaluate(args[0], env), _evaluate(args[1], env)
        if not isinstance(container, list | Mapping):
            raise CelError(f"no matching overload for 'in' on {type(container).__name__}")
        return element in container
    if kind == "+":
        left, right = _evaluate(args[0], env), _evaluate(args[1], env)
        if not (isinstance(left, list) and isinstance(right, list)):
            raise CelError("+ is only known here for two lists")
        return left + right
    if kind == "exists":
        target, variable, predicate = args
        items = _evaluate(target, env)
        if not isinstance(items, list | Mapping):
            raise CelError(f"exists() on {type(items).__name__}")
        # Over a map CEL's macros range over its keys; errors are absorbed as by ||.
        node = _Node("const", (False,))
        for item in items:
            node = _Node("||", (node, _Node("bound", (variable, item, predicate))))
        return _evaluate(node, env)
    if kind == "bound":
        variable, item, predicate = args
        return _evaluate(predicate, {**env, variable: item})
    raise CelSyntaxError(f"unknown node {kind}")


def evaluate(expression: str, **variables: Any) -> Any:
    """The value of ``expression`` with ``variables`` bound; raises :class:`CelError` where CEL
    would report an evaluation error."""
    return _evaluate(_Parser(expression).parse(), variables)
