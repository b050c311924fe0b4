"""NVIDIA's Xid catalog as data: what NVIDIA says recovers from each Xid, and kubegpu's class.

The source is NVIDIA's "Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (also offered as the
spreadsheet https://docs.nvidia.com/Xid-Catalog.xlsx): its table for Ampere and newer GPUs
("Applies to" A100, H100, B100, GB200), column "Resolution Bucket (Immediate Action)", Xids 1 to
172. The page has no version number; the newest driver it names is R575 (CUDA 12.9). Only that
column is encoded, as NVIDIA names its buckets; where a bucket needs more than the Xid number
(a workflow, a decode of the message), the class below says how kubegpu reads it and why.

The health policy (:mod:`kubegpu.core.health`) takes its defaults from here, the documentation
(docs/xid-policy.md) shows the same table, and a test holds the two equal. Kept apart from the
policy because it is NVIDIA's data, updated when NVIDIA's catalog is, not kubegpu's rules.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType


class XidAction(enum.Enum):
    """NVIDIA's immediate action for an Xid (the catalog's "Resolution Bucket"), by its name."""

    RESTART_APP = "RESTART_APP"
    IGNORE = "IGNORE"
    RESET_GPU = "RESET_GPU"
    RESTART_BM = "RESTART_BM"
    RESTART_VM = "RESTART_VM"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"
    UPDATE_SWFW = "UPDATE_SWFW"
    CHECK_UVM = "CHECK_UVM"
    XID_154 = "XID_154"
    WORKFLOW_XID_45 = "WORKFLOW_XID_45"
    WORKFLOW_XID_48 = "WORKFLOW_XID_48"
    WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"
    WORKFLOW_NVLINK5_ERR = "WORKFLOW_NVLINK5_ERR"
    # Xids 162 to 172: the column is empty or holds a sentence of advice instead of a bucket.
    NOT_GIVEN = "(none)"


class XidClass(enum.Enum):
    """What an Xid does to a GPU's verdict under the catalog policy."""

    # Only the application that hit it must restart; the GPU stays Healthy.
    APPLICATION = "application"
    # Nothing to do; the GPU stays Healthy.
    NO_ACTION = "no-action"
    # Unhealthy until the GPU is reset; it may come back without restarting the node.
    GPU_RESET = "gpu-reset"
    # Unhealthy until the node restarts (so the agent with it); nothing seen meanwhile clears it.
    NODE_REBOOT = "node-reboot"
    # The catalog gives no action kubegpu can apply from the Xid number alone, or does not list
    # the Xid: critical, as every Xid outside the ignore list has always been.
    UNCLASSIFIED = "unclassified"


# The GPU keeps its Healthy verdict after an Xid of these classes.
HEALTHY_CLASSES: frozenset[XidClass] = frozenset({XidClass.APPLICATION, XidClass.NO_ACTION})

_CLASS_OF_ACTION: Mapping[XidAction, XidClass] = MappingProxyType(
    {
        XidAction.RESTART_APP: XidClass.APPLICATION,
        XidAction.IGNORE: XidClass.NO_ACTION,
        XidAction.RESET_GPU: XidClass.GPU_RESET,
        XidAction.RESTART_BM: XidClass.NODE_REBOOT,
        # The node a Kubernetes agent runs on is the VM that owns the GPU.
        XidAction.RESTART_VM: XidClass.NODE_REBOOT,
        # Re-seating a card or its power cable means powering the node off: it cannot come
        # back on its own.
        XidAction.CHECK_MECHANICALS: XidClass.NODE_REBOOT,
        # Xid 45 follows another Xid or an application's end (Ctrl-C, a kill, a reset); the
        # catalog says to ignore it when it comes with another Xid and follow that one, whose own
        # verdict then applies. Alone, its action (restart the Fabric Manager) is no verdict on
        # the GPU. NVIDIA's device plugin and kubegpu before this table ignored it too.
        XidAction.WORKFLOW_XID_45: XidClass.NO_ACTION,
        # Both branches of the Xid 48 workflow reset the GPU (alone: RESET_GPU; with 63 or 64:
        # drain, then reset), and its trigger text says a GPU reset or node reboot clears it.
        XidAction.WORKFLOW_XID_48: XidClass.GPU_RESET,
        # Xid 74's trigger text: "a GPU reset or node reboot is needed to clear this error".
        XidAction.WORKFLOW_NVLINK_ERR: XidClass.GPU_RESET,
        # The rest need what an NVML event does not carry: the message's registers (144-150),
        # the Xid it accompanies (154), whether UVM or vGPU is in use (159), a person (support,
        # a software update), or advice in prose (162-172). They stay critical.
    }
)

# Listed as "Unused" on every GPU the table covers, all with CONTACT_SUPPORT; kept so that the
# table covers 1..172 as NVIDIA's does.
_UNUSED: tuple[int, ...] = (
    *range(1, 8),
    9,
    10,
    12,
    *range(15, 25),
    *range(26, 31),
    *range(33, 37),
    42,
    47,
    *range(49, 54),
    *range(55, 60),
    61,
    65,
    73,
    81,
    87,
    90,
    91,
    *range(111, 119),
    *range(122, 126),
    138,
)

_A = XidAction
# (Xid, NVIDIA's immediate action, what the catalog says the Xid is), in the catalog's order.
_ROWS: tuple[tuple[int, XidAction, str], ...] = (
    (8, _A.RESTART_APP, "GPU stopped processing"),
    (11, _A.RESTART_APP, "invalid or corrupted push buffer stream"),
    (13, _A.RESTART_APP, "graphics engine exception"),
    (14, _A.IGNORE, "fake or injected error from userspace"),
    (25, _A.RESTART_APP, "invalid or illegal push buffer stream"),
    (31, _A.RESTART_APP, "GPU memory page fault"),
    (32, _A.RESTART_APP, "invalid or corrupted push buffer stream (PBDMA)"),
    (37, _A.IGNORE, "driver firmware error"),
    (38, _A.IGNORE, "driver firmware error (watchdog timeout)"),
    (39, _A.RESTART_APP, "copy engine exception (CE0)"),
    (40, _A.RESTART_APP, "copy engine exception (CE1)"),
    (41, _A.RESTART_APP, "copy engine exception (CE2)"),
    (43, _A.IGNORE, "GPU stopped processing (the application faulted)"),
    (44, _A.IGNORE, "graphics engine fault during context switch"),
    (45, _A.WORKFLOW_XID_45, "preemptive cleanup, due to previous errors"),
    (46, _A.RESET_GPU, "GPU stopped processing (timeout)"),
    (48, _A.WORKFLOW_XID_48, "double-bit ECC error"),
    (54, _A.CHECK_MECHANICALS, "auxiliary power is not connected to the GPU board"),
    (60, _A.RESTART_APP, "video processor exception"),
    (62, _A.RESET_GPU, "internal micro-controller halt"),
    (63, _A.IGNORE, "GPU memory remapping event"),
    (64, _A.RESET_GPU, "GPU memory remapping failure"),
    (66, _A.IGNORE, "illegal access by driver"),
    (67, _A.IGNORE, "illegal access by driver (verification)"),
    (68, _A.RESTART_APP, "NVDEC0 exception"),
    (69, _A.RESTART_APP, "graphics engine class error"),
    (70, _A.RESTART_APP, "copy engine error (CE3)"),
    (71, _A.RESTART_APP, "copy engine error (CE4)"),
    (72, _A.RESTART_APP, "copy engine error (CE5)"),
    (74, _A.WORKFLOW_NVLINK_ERR, "NVLink error"),
    (75, _A.RESTART_APP, "copy engine error (CE6)"),
    (76, _A.RESTART_APP, "copy engine error (CE7)"),
    (77, _A.RESTART_APP, "copy engine error (CE8)"),
    (78, _A.UPDATE_SWFW, "vGPU start error"),
    (79, _A.RESTART_BM, "GPU has fallen off the bus"),
    (80, _A.RESTART_APP, "corrupted data sent to GPU"),
    (82, _A.RESTART_APP, "NVJPG0 error"),
    (83, _A.RESTART_APP, "NVDEC1 error"),
    (84, _A.RESTART_APP, "NVDEC2 error"),
    (85, _A.RESTART_APP, "copy engine error (CE9)"),
    (86, _A.RESTART_APP, "OFA exception"),
    (88, _A.RESTART_APP, "NVDEC3 error"),
    (89, _A.RESTART_APP, "NVDEC4 error"),
    (92, _A.IGNORE, "high single-bit ECC error rate"),
    (93, _A.IGNORE, "non-fatal violation of the provisioned InfoROM wear limit"),
    (94, _A.RESTART_APP, "contained memory error"),
    (95, _A.RESET_GPU, "uncontained memory error"),
    (96, _A.RESTART_APP, "NVDEC5 error"),
    (97, _A.RESTART_APP, "NVDEC6 error"),
    (98, _A.RESTART_APP, "NVDEC7 error"),
    (99, _A.RESTART_APP, "NVJPG1 error"),
    (100, _A.RESTART_APP, "NVJPG2 error"),
    (101, _A.RESTART_APP, "NVJPG3 error"),
    (102, _A.RESTART_APP, "NVJPG4 error"),
    (103, _A.RESTART_APP, "NVJPG5 error"),
    (104, _A.RESTART_APP, "NVJPG6 error"),
    (105, _A.RESTART_APP, "NVJPG7 error"),
    (106, _A.IGNORE, "SMBPBI test message"),
    (107, _A.IGNORE, "SMBPBI test message (silent)"),
    (108, _A.IGNORE, "NVLink remote translation error"),
    (109, _A.RESET_GPU, "context switch timeout"),
    (110, _A.RESET_GPU, "security fault error"),
    (119, _A.RESET_GPU, "GSP RPC timeout"),
    (120, _A.RESET_GPU, "GSP error"),
    (121, _A.IGNORE, "C2C error (corrected)"),
    (126, _A.RESTART_APP, "copy engine error (CE10)"),
    (127, _A.RESTART_APP, "copy engine error (CE11)"),
    (128, _A.RESTART_APP, "copy engine error (CE12)"),
    (129, _A.RESTART_APP, "copy engine error (CE13)"),
    (130, _A.RESTART_APP, "copy engine error (CE14)"),
    (131, _A.RESTART_APP, "copy engine error (CE15)"),
    (132, _A.RESTART_APP, "copy engine error (CE16)"),
    (133, _A.RESTART_APP, "copy engine error (CE17)"),
    (134, _A.RESTART_APP, "copy engine error (CE18)"),
    (135, _A.RESTART_APP, "copy engine error (CE19)"),
    (136, _A.RESET_GPU, "link training failed"),
    (137, _A.IGNORE, "NVLink privilege error"),
    (139, _A.RESTART_APP, "OFA1 error"),
    (140, _A.RESET_GPU, "ECC unrecovered error"),
    (141, _A.IGNORE, "CUDA fast path error"),
    (142, _A.CONTACT_SUPPORT, "NVENC3 error"),
    (143, _A.RESET_GPU, "GPU initialization error"),
    (144, _A.WORKFLOW_NVLINK5_ERR, "NVLink SAW error"),
    (145, _A.WORKFLOW_NVLINK5_ERR, "NVLink RLW error"),
    (146, _A.WORKFLOW_NVLINK5_ERR, "NVLink TLW error"),
    (147, _A.WORKFLOW_NVLINK5_ERR, "NVLink TREX error"),
    (148, _A.WORKFLOW_NVLINK5_ERR, "NVLink NVLPW_CTRL error"),
    (149, _A.WORKFLOW_NVLINK5_ERR, "NVLink NETIR error"),
    (150, _A.WORKFLOW_NVLINK5_ERR, "NVLink MSE error"),
    (151, _A.RESTART_VM, "key rotation error"),
    (152, _A.IGNORE, "DLA SMMU error"),
    (153, _A.IGNORE, "DLA timeout error"),
    (154, _A.XID_154, "GPU recovery action changed"),
    (155, _A.RESET_GPU, "NVLink SW defined error"),
    (156, _A.RESET_GPU, "resource retirement event"),
    (157, _A.IGNORE, "resource retirement failure"),
    (158, _A.RESET_GPU, "GPU fatal timeout"),
    (159, _A.CHECK_UVM, "CHI non-data error"),
    (160, _A.IGNORE, "channel retirement event"),
    (161, _A.IGNORE, "channel retirement failure"),
    (162, _A.NOT_GIVEN, "power smoothing circuitry re-engaged"),
    (163, _A.NOT_GIVEN, "power smoothing circuitry disengaged"),
    (164, _A.NOT_GIVEN, "power smoothing circuitry low lifetime reached"),
    (165, _A.NOT_GIVEN, "power smoothing circuitry lifetime exhausted"),
    (166, _A.NOT_GIVEN, "confidential-computing traffic before the link was set up for it"),
    (167, _A.NOT_GIVEN, "PCIe fatal timeout"),
    (168, _A.NOT_GIVEN, "errors found in the write-protected region"),
    (169, _A.NOT_GIVEN, "internal micro-controller halt (SEC2)"),
    (170, _A.NOT_GIVEN, "interrupt seen in confidential-computing mode"),
    (171, _A.NOT_GIVEN, "uncorrectable DRAM error (details of an Xid 48)"),
    (172, _A.NOT_GIVEN, "uncorrectable SRAM error (details of an Xid 48)"),
)

# Every Xid of the catalog: its immediate action and what it is ("" for an unused one).
XID_CATALOG: Mapping[int, tuple[XidAction, str]] = MappingProxyType(
    dict(
        sorted(
            [(xid, (XidAction.CONTACT_SUPPORT, "")) for xid in _UNUSED]
            + [(xid, (action, meaning)) for xid, action, meaning in _ROWS]
        )
    )
)


def xid_action(xid: int) -> XidAction | None:
    """NVIDIA's immediate action for ``xid``; None when the catalog does not list it."""
    entry = XID_CATALOG.get(xid)
    return entry[0] if entry else None


def xid_meaning(xid: int) -> str:
    """What the catalog says ``xid`` is; "" when it does not list it or marks it unused."""
    entry = XID_CATALOG.get(xid)
    return entry[1] if entry else ""


def xid_class(xid: int) -> XidClass:
    """kubegpu's class of ``xid``: from its catalog action, UNCLASSIFIED when it has none."""
    action = xid_action(xid)
    if action is None:
        return XidClass.UNCLASSIFIED
    return _CLASS_OF_ACTION.get(action, XidClass.UNCLASSIFIED)


def xids_of(*classes: XidClass) -> frozenset[int]:
    """Every catalog Xid whose class is one of ``classes``."""
    return frozenset(xid for xid in XID_CATALOG if xid_class(xid) in classes)
