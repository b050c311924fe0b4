"""The hot-path decoder and encoders give exactly what the generic path gives: the same
ExtenderArgs or the same error for any body, and byte-identical replies."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.extender.wire import (
    ExtenderArgs,
    NodeNamesCache,
    PriorityEncoder,
    WireError,
    encode_filter_result,
    filter_result,
    parse_extender_args,
    parse_extender_body,
    priority_list,
)

names = st.text(min_size=0, max_size=6)  # unicode, quotes, backslashes, the empty string
name_lists = st.lists(names, max_size=6) | st.lists(
    st.sampled_from(["node-0", "node-1", "gpu-a"]), max_size=4
)
pods = st.one_of(
    st.fixed_dictionaries(
        {"metadata": st.just({"name": "p", "uid": "u"}), "spec": st.just({"containers": []})}
    ),
    st.fixed_dictionaries({"metadata": st.integers() | st.none(), "spec": st.just({})}),
    st.dictionaries(st.sampled_from(["metadata", "spec", "x"]), st.just({}), max_size=3),
    st.integers(),
    st.none(),
    st.text(max_size=3),
)
values = st.none() | st.integers() | st.text(max_size=3) | name_lists
node_lists = st.none() | st.fixed_dictionaries(
    {"items": st.lists(st.just({"metadata": {"name": "node-0"}}), max_size=2)}
)
bodies = st.one_of(
    st.fixed_dictionaries(
        {"Pod": pods, "Nodes": node_lists, "NodeNames": st.none() | name_lists | values}
    ),
    st.dictionaries(
        st.sampled_from(["Pod", "Nodes", "NodeNames", "pod", "nodenames", "Extra"]),
        pods | values,
        max_size=4,
    ),
    st.lists(st.integers(), max_size=2),
)


def outcome(parse: Any) -> tuple[str, Any]:
    try:
        args = parse()
    except WireError as exc:
        return "WireError", str(exc)
    except (msgspec.DecodeError, RecursionError) as exc:
        return type(exc).__name__, None
    assert isinstance(args, ExtenderArgs)
    return "args", args


@settings(max_examples=600, deadline=None)
@given(body=bodies, compact=st.booleans())
def test_fast_parse_equals_the_generic_parse_for_any_body(body: Any, compact: bool) -> None:
    raw = msgspec.json.encode(body) if compact else json.dumps(body, ensure_ascii=False).encode()
    cache = NodeNamesCache(size=2)
    generic = outcome(lambda: parse_extender_args(msgspec.json.decode(raw)))
    assert outcome(lambda: parse_extender_body(raw, cache)) == generic
    assert outcome(lambda: parse_extender_body(raw, cache)) == generic  # from the cache now


def test_non_json_is_a_decode_error_as_before() -> None:
    for raw in (b"", b"{", b'{"Pod": {}, "Nodes": null, "NodeNames": [', b"\xff"):
        assert outcome(lambda raw=raw: parse_extender_body(raw, NodeNamesCache()))[0] == (
            "DecodeError"
        )


def test_the_same_node_list_comes_back_as_the_same_tuple_until_evicted() -> None:
    cache = NodeNamesCache(size=2)
    first = parse_extender_body(b'{"Pod":{},"Nodes":null,"NodeNames":["a","b"]}', cache)
    again = parse_extender_body(b'{"Pod":{"spec":{}},"Nodes":null,"NodeNames":["a","b"]}', cache)
    assert first.node_names == ("a", "b") and again.node_names is first.node_names
    parse_extender_body(b'{"Pod":{},"Nodes":null,"NodeNames":["c"]}', cache)
    parse_extender_body(b'{"Pod":{},"Nodes":null,"NodeNames":["d"]}', cache)
    evicted = parse_extender_body(b'{"Pod":{},"Nodes":null,"NodeNames":["a","b"]}', cache)
    assert evicted.node_names == ("a", "b") and evicted.node_names is not first.node_names


def test_a_filter_reply_teaches_the_cache_the_passed_list() -> None:
    cache = NodeNamesCache()
    passed = ("node-0", 'n\u00e9ud-"1"')
    reply = json.loads(encode_filter_result(passed, {}, {}, cache))
    body = msgspec.json.encode({"Pod": {}, "Nodes": None, "NodeNames": reply["NodeNames"]})
    assert parse_extender_body(body, cache).node_names is passed


reasons = st.dictionaries(names, st.text(max_size=20), max_size=5)


@given(passed=st.lists(names, max_size=5).map(tuple), failed=reasons, unresolvable=reasons)
def test_filter_reply_bytes_equal_the_generic_encoding(
    passed: tuple[str, ...], failed: dict[str, str], unresolvable: dict[str, str]
) -> None:
    args = ExtenderArgs({}, passed, None)
    expected = msgspec.json.encode(filter_result(args, passed, failed, unresolvable))
    assert encode_filter_result(passed, failed, unresolvable, NodeNamesCache()) == expected
    assert encode_filter_result(passed, failed, unresolvable) == expected


@given(
    node_names=st.lists(names, min_size=1, max_size=8, unique=True),
    data=st.data(),
)
def test_priority_reply_bytes_equal_the_generic_encoding(node_names: list[str], data: Any) -> None:
    rows = data.draw(st.lists(st.integers(0, len(node_names) - 1), max_size=10))
    scores = data.draw(
        st.lists(st.integers(0, 10), min_size=len(rows), max_size=len(rows))
        | st.lists(st.integers(-3, 120), min_size=len(rows), max_size=len(rows))
    )
    encoder = PriorityEncoder(node_names)
    expected = msgspec.json.encode(
        priority_list([(node_names[r], s) for r, s in zip(rows, scores, strict=True)])
    )
    got = encoder.encode(np.array(rows, dtype=np.int64), np.array(scores, dtype=np.int64))
    assert got == expected
