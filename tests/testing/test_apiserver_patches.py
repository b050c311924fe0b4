"""The patch formats the fake API server applies, as tables of (document, patch, result)."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.testing.apiserver.errors import StatusError
from kubegpu.testing.apiserver.patches import json_patch, merge_patch, strategic_merge_patch

POD_SPEC = {
    "containers": [
        {"name": "a", "image": "i:1", "env": [{"name": "X", "value": "1"}]},
        {"name": "b", "image": "j:1"},
    ],
}


@pytest.mark.parametrize(
    ("doc", "patch", "expected"),
    [
        ({"a": 1, "b": {"c": 2}}, {"b": {"d": 3}}, {"a": 1, "b": {"c": 2, "d": 3}}),
        ({"a": 1, "b": 2}, {"a": None}, {"b": 2}),
        ({"l": [1, 2, 3]}, {"l": [4]}, {"l": [4]}),
        ({"a": {"b": 1}}, {"a": "scalar"}, {"a": "scalar"}),
        ({"a": 1}, {"new": {"x": None, "y": 1}}, {"a": 1, "new": {"y": 1}}),
    ],
    ids=["nested-merge", "null-deletes", "list-replaced", "object-to-scalar", "nulls-in-new"],
)
def test_merge_patch_follows_rfc_7386(doc: Any, patch: Any, expected: Any) -> None:
    assert merge_patch(doc, patch) == expected


@pytest.mark.parametrize(
    ("doc", "patch", "expected"),
    [
        (
            POD_SPEC,
            {"containers": [{"name": "b", "image": "j:2"}]},
            {"containers": [POD_SPEC["containers"][0], {"name": "b", "image": "j:2"}]},
        ),
        (
            POD_SPEC,
            {"containers": [{"name": "c", "image": "k:1"}]},
            {"containers": [*POD_SPEC["containers"], {"name": "c", "image": "k:1"}]},
        ),
        (
            POD_SPEC,
            {"containers": [{"name": "a", "$patch": "delete"}]},
            {"containers": [POD_SPEC["containers"][1]]},
        ),
        (
            POD_SPEC,
            {"containers": [{"name": "a", "env": [{"name": "Y", "value": "2"}]}]},
            {
                "containers": [
                    {
                        "name": "a",
                        "image": "i:1",
                        "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}],
                    },
                    POD_SPEC["containers"][1],
                ]
            },
        ),
        (
            POD_SPEC,
            {"containers": [{"name": "z", "image": "z:1"}, {"$patch": "replace"}]},
            {"containers": [{"name": "z", "image": "z:1"}]},
        ),
        (
            {"metadata": {"finalizers": ["a"]}},
            {"metadata": {"finalizers": ["b", "a"]}},
            {"metadata": {"finalizers": ["a", "b"]}},
        ),
        (
            {"metadata": {"finalizers": ["a", "b"]}},
            {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}},
            {"metadata": {"finalizers": ["b"]}},
        ),
        (
            {"spec": {"taints": [{"key": "x"}]}},
            {"spec": {"taints": [{"key": "y"}]}},
            {"spec": {"taints": [{"key": "y"}]}},
        ),
        (
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
            {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
            {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
        ),
        ({"a": {"b": 1, "c": 2}}, {"a": {"$patch": "replace", "d": 3}}, {"a": {"d": 3}}),
        ({"a": {"b": 1}, "k": 1}, {"a": {"$patch": "delete"}}, {"k": 1}),
        ({"a": 1}, {"a": None}, {}),
    ],
    ids=[
        "merge-by-name",
        "append-by-name",
        "delete-directive",
        "nested-keyed-list",
        "replace-directive-on-list",
        "finalizers-as-set",
        "delete-from-primitive-list",
        "unkeyed-list-replaced",
        "conditions-by-type",
        "replace-directive-on-map",
        "delete-directive-on-map",
        "null-deletes",
    ],
)
def test_strategic_merge_patch_merges_keyed_lists_and_honours_directives(
    doc: Any, patch: Any, expected: Any
) -> None:
    assert strategic_merge_patch(doc, patch) == expected


def test_strategic_merge_patch_leaves_its_input_untouched() -> None:
    doc = {"containers": [{"name": "a", "image": "i:1"}]}
    strategic_merge_patch(doc, {"containers": [{"name": "a", "image": "i:2"}]})
    assert doc == {"containers": [{"name": "a", "image": "i:1"}]}


@pytest.mark.parametrize(
    ("doc", "ops", "expected"),
    [
        ({"a": 1}, [{"op": "add", "path": "/b", "value": 2}], {"a": 1, "b": 2}),
        ({"l": [1, 3]}, [{"op": "add", "path": "/l/1", "value": 2}], {"l": [1, 2, 3]}),
        ({"l": [1]}, [{"op": "add", "path": "/l/-", "value": 2}], {"l": [1, 2]}),
        ({"a": 1, "b": 2}, [{"op": "remove", "path": "/a"}], {"b": 2}),
        ({"a": 1}, [{"op": "replace", "path": "/a", "value": 5}], {"a": 5}),
        ({"a": {"x": 1}}, [{"op": "move", "from": "/a/x", "path": "/y"}], {"a": {}, "y": 1}),
        ({"a": [1]}, [{"op": "copy", "from": "/a", "path": "/b"}], {"a": [1], "b": [1]}),
        (
            {"a/b": {"c~d": 1}},
            [{"op": "replace", "path": "/a~1b/c~0d", "value": 2}],
            {"a/b": {"c~d": 2}},
        ),
        (
            {"a": 1},
            [{"op": "test", "path": "/a", "value": 1}, {"op": "replace", "path": "/a", "value": 2}],
            {"a": 2},
        ),
    ],
    ids=[
        "add",
        "insert",
        "append",
        "remove",
        "replace",
        "move",
        "copy",
        "escaped-pointer",
        "test-then-replace",
    ],
)
def test_json_patch_follows_rfc_6902(doc: Any, ops: Any, expected: Any) -> None:
    assert json_patch(doc, ops) == expected


@pytest.mark.parametrize(
    ("ops", "code"),
    [
        ([{"op": "test", "path": "/a", "value": 2}], 422),
        ([{"op": "remove", "path": "/missing"}], 422),
        ([{"op": "replace", "path": "/missing", "value": 1}], 422),
        ([{"op": "add", "path": "/l/5", "value": 1}], 422),
        ([{"op": "frobnicate", "path": "/a"}], 400),
        ([{"op": "add", "path": "/a"}], 400),
        ({"op": "add"}, 400),
    ],
    ids=[
        "failed-test",
        "remove-missing",
        "replace-missing",
        "index-out-of-range",
        "unknown-op",
        "add-without-value",
        "not-a-list",
    ],
)
def test_json_patch_errors_carry_the_real_servers_codes(ops: Any, code: int) -> None:
    doc = {"a": 1, "l": [1]}
    with pytest.raises(StatusError) as excinfo:
        json_patch(doc, ops)
    assert excinfo.value.code == code
    assert doc == {"a": 1, "l": [1]}
