"""docs/xid-policy.md shows the Xid table the code applies: each Xid, its action, its class."""

from __future__ import annotations

import re
from pathlib import Path

from kubegpu.core.health import CATALOG_IGNORED_XIDS, NODE_REBOOT_XIDS
from kubegpu.core.xid_catalog import XID_CATALOG, xid_class

PAGE = Path(__file__).resolve().parents[2] / "docs" / "xid-policy.md"
_ROW = re.compile(r"^\| (\d+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", re.M)
_UNUSED = re.compile(r"^Listed as unused on every GPU[^:]*: ([\d, ]+)\.$", re.M)


def test_the_page_lists_every_xid_with_the_codes_action_and_class() -> None:
    text = PAGE.read_text(encoding="utf-8")
    rows = {int(xid): (meaning, action, cls) for xid, meaning, action, cls in _ROW.findall(text)}
    expected = {
        xid: (meaning, action.value, xid_class(xid).value)
        for xid, (action, meaning) in XID_CATALOG.items()
        if meaning
    }
    assert rows == expected
    (unused,) = _UNUSED.findall(text)
    assert [int(x) for x in unused.split(", ")] == [
        xid for xid, (_, meaning) in XID_CATALOG.items() if not meaning
    ]


def test_the_page_names_the_xids_that_wait_for_a_reboot_and_what_changed() -> None:
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    *others, last = sorted(NODE_REBOOT_XIDS)
    assert f"**{', '.join(map(str, others))} and {last}**" in text
    assert f"Xids {sorted(NODE_REBOOT_XIDS)} wait for a node reboot" in text
    assert "**109** (context switch timeout) is critical now" in text
    assert 109 not in CATALOG_IGNORED_XIDS
    assert "**94** (contained ECC error) passes now" in text
    assert 94 in CATALOG_IGNORED_XIDS
