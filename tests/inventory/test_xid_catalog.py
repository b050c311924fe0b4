"""NVIDIA's Xid catalog as encoded: its coverage, its actions as the source gives them, and the
class each action puts an Xid in."""

from __future__ import annotations

import pytest

from kubegpu.core.xid_catalog import (
    XID_CATALOG,
    XidAction,
    XidClass,
    xid_action,
    xid_class,
    xid_meaning,
    xids_of,
)


def test_the_table_covers_every_xid_of_nvidias_catalog_once() -> None:
    assert sorted(XID_CATALOG) == list(range(1, 173))


# (Xid, immediate action, class): rows read off NVIDIA's table, one or more per bucket.
ROWS = [
    pytest.param(13, XidAction.RESTART_APP, XidClass.APPLICATION, id="13 graphics exception"),
    pytest.param(31, XidAction.RESTART_APP, XidClass.APPLICATION, id="31 page fault"),
    pytest.param(94, XidAction.RESTART_APP, XidClass.APPLICATION, id="94 contained ECC"),
    pytest.param(68, XidAction.RESTART_APP, XidClass.APPLICATION, id="68 NVDEC0"),
    pytest.param(43, XidAction.IGNORE, XidClass.NO_ACTION, id="43 application fault"),
    pytest.param(63, XidAction.IGNORE, XidClass.NO_ACTION, id="63 row remapping event"),
    pytest.param(92, XidAction.IGNORE, XidClass.NO_ACTION, id="92 single-bit ECC rate"),
    pytest.param(45, XidAction.WORKFLOW_XID_45, XidClass.NO_ACTION, id="45 preemptive cleanup"),
    pytest.param(109, XidAction.RESET_GPU, XidClass.GPU_RESET, id="109 ctxsw timeout"),
    pytest.param(95, XidAction.RESET_GPU, XidClass.GPU_RESET, id="95 uncontained ECC"),
    pytest.param(64, XidAction.RESET_GPU, XidClass.GPU_RESET, id="64 remapping failure"),
    pytest.param(119, XidAction.RESET_GPU, XidClass.GPU_RESET, id="119 GSP timeout"),
    pytest.param(48, XidAction.WORKFLOW_XID_48, XidClass.GPU_RESET, id="48 double-bit ECC"),
    pytest.param(74, XidAction.WORKFLOW_NVLINK_ERR, XidClass.GPU_RESET, id="74 NVLink"),
    pytest.param(79, XidAction.RESTART_BM, XidClass.NODE_REBOOT, id="79 off the bus"),
    pytest.param(151, XidAction.RESTART_VM, XidClass.NODE_REBOOT, id="151 key rotation"),
    pytest.param(54, XidAction.CHECK_MECHANICALS, XidClass.NODE_REBOOT, id="54 aux power"),
    pytest.param(1, XidAction.CONTACT_SUPPORT, XidClass.UNCLASSIFIED, id="1 unused"),
    pytest.param(142, XidAction.CONTACT_SUPPORT, XidClass.UNCLASSIFIED, id="142 NVENC3"),
    pytest.param(78, XidAction.UPDATE_SWFW, XidClass.UNCLASSIFIED, id="78 vGPU start"),
    pytest.param(
        149, XidAction.WORKFLOW_NVLINK5_ERR, XidClass.UNCLASSIFIED, id="149 needs a decode"
    ),
    pytest.param(154, XidAction.XID_154, XidClass.UNCLASSIFIED, id="154 follows another"),
    pytest.param(159, XidAction.CHECK_UVM, XidClass.UNCLASSIFIED, id="159 depends on UVM"),
    pytest.param(163, XidAction.NOT_GIVEN, XidClass.UNCLASSIFIED, id="163 advice in prose"),
]


@pytest.mark.parametrize(("xid", "action", "cls"), ROWS)
def test_each_xid_has_nvidias_action_and_the_class_that_action_gives(
    xid: int, action: XidAction, cls: XidClass
) -> None:
    assert xid_action(xid) is action
    assert xid_class(xid) is cls


def test_an_xid_the_catalog_does_not_list_is_unclassified() -> None:
    assert xid_action(173) is None
    assert xid_class(173) is XidClass.UNCLASSIFIED
    assert xid_meaning(173) == ""


def test_every_catalog_xid_is_in_exactly_one_class() -> None:
    classes = [xids_of(cls) for cls in XidClass]
    assert sum(len(xids) for xids in classes) == len(XID_CATALOG)
    assert frozenset().union(*classes) == frozenset(XID_CATALOG)


def test_a_class_follows_from_the_action_alone_except_for_nvidias_workflows() -> None:
    # One class per plain bucket: the per-Xid reading is only ever a workflow's.
    by_action: dict[XidAction, set[XidClass]] = {}
    for xid in XID_CATALOG:
        by_action.setdefault(xid_action(xid) or XidAction.NOT_GIVEN, set()).add(xid_class(xid))
    assert all(len(classes) == 1 for classes in by_action.values()), by_action


def test_unused_xids_have_no_meaning_and_used_ones_do() -> None:
    assert xid_meaning(2) == ""
    assert xid_meaning(79) == "GPU has fallen off the bus"
    assert all(
        xid_meaning(xid)
        for xid in XID_CATALOG
        if xid_class(xid)
        in {
            XidClass.APPLICATION,
            XidClass.NO_ACTION,
            XidClass.GPU_RESET,
            XidClass.NODE_REBOOT,
        }
    )
