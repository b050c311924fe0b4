"""The pure health policy: which events take a GPU out of the pool, and NVIDIA's env knobs."""

from __future__ import annotations

import pytest

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.health import (
    CATALOG_IGNORED_XIDS,
    NODE_REBOOT_XIDS,
    NVIDIA_DEVICE_PLUGIN_XIDS,
    HealthCheckPolicy,
    HealthEvent,
    HealthEventKind,
    describe_event,
    describe_xid,
)
from kubegpu.core.xid_catalog import XidClass, xids_of

UUID = GpuUuid("GPU-00000000-0000-4000-8000-000000000000")


def xid(code: int | None) -> HealthEvent:
    return HealthEvent(HealthEventKind.XID, UUID, xid=code)


LOST = HealthEvent(HealthEventKind.LOST, UUID)
RECOVERED = HealthEvent(HealthEventKind.RECOVERED, UUID)

# (env, event, critical?)
ENV_CASES = [
    pytest.param({}, xid(79), True, id="default: hardware Xid 79 is critical"),
    pytest.param({}, xid(48), True, id="default: double-bit ECC is critical"),
    pytest.param({}, xid(94), False, id="default: contained ECC error, application only"),
    pytest.param({}, xid(109), True, id="default: context switch timeout needs a GPU reset"),
    pytest.param({}, xid(45), False, id="default: preemptive cleanup follows another Xid"),
    pytest.param({}, xid(63), False, id="default: row remapping event needs nothing"),
    pytest.param({}, xid(4242), True, id="default: an Xid the catalog lacks is critical"),
    pytest.param({}, xid(None), True, id="default: an Xid without a code is critical"),
    pytest.param({}, LOST, True, id="default: a lost GPU is critical"),
    pytest.param({}, RECOVERED, False, id="default: recovery is not critical"),
    pytest.param({"DP_DISABLE_HEALTHCHECKS": "all"}, xid(79), False, id="disable=all: nothing"),
    pytest.param({"DP_DISABLE_HEALTHCHECKS": "all"}, LOST, False, id="disable=all: not even lost"),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "xids"}, xid(79), False, id="disable=xids: same as all"
    ),
    pytest.param({"DP_DISABLE_HEALTHCHECKS": "ALL"}, xid(79), False, id="disable=ALL: any case"),
    pytest.param({"DP_DISABLE_HEALTHCHECKS": "79,48"}, xid(79), False, id="disable list: 79 off"),
    pytest.param({"DP_DISABLE_HEALTHCHECKS": "79, 48"}, xid(48), False, id="disable list: spaces"),
    pytest.param({"DP_DISABLE_HEALTHCHECKS": "79"}, xid(95), True, id="disable list: others on"),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "79"}, xid(13), False, id="disable list: adds to defaults"
    ),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "79"}, LOST, True, id="disable list: lost still critical"
    ),
    pytest.param(
        {"DP_ENABLE_HEALTHCHECKS": "13"}, xid(13), True, id="enable: overrides default ignore"
    ),
    pytest.param(
        {"DP_ENABLE_HEALTHCHECKS": "13"}, xid(31), False, id="enable: only the listed one"
    ),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "79", "DP_ENABLE_HEALTHCHECKS": "79"},
        xid(79),
        True,
        id="enable beats disable for the same Xid",
    ),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"},
        xid(79),
        True,
        id="disable=all + enable list: allow-list includes 79",
    ),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"},
        xid(48),
        False,
        id="disable=all + enable list: 48 not on the allow-list",
    ),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"},
        LOST,
        True,
        id="disable=all + enable list: checks run, so lost is critical",
    ),
    pytest.param({"DP_ENABLE_HEALTHCHECKS": "all"}, xid(13), True, id="enable=all: even Xid 13"),
    pytest.param({"DP_DISABLE_HEALTHCHECKS": ""}, xid(79), True, id="empty disable: defaults"),
]


@pytest.mark.parametrize(("env", "event", "critical"), ENV_CASES)
def test_nvidia_env_knobs_decide_which_events_are_critical(
    env: dict[str, str], event: HealthEvent, critical: bool
) -> None:
    assert HealthCheckPolicy.from_nvidia_env(env).is_critical(event) is critical


@pytest.mark.parametrize(
    ("env", "disabled"),
    [
        pytest.param({}, False, id="nothing set"),
        pytest.param({"DP_DISABLE_HEALTHCHECKS": "all"}, True, id="all"),
        pytest.param({"DP_DISABLE_HEALTHCHECKS": "13,xids"}, True, id="xids in a list"),
        pytest.param(
            {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "48"},
            False,
            id="allow-list",
        ),
        pytest.param({"DP_DISABLE_HEALTHCHECKS": "48"}, False, id="a list"),
    ],
)
def test_disabling_all_health_checks_needs_an_empty_enable_list(
    env: dict[str, str], disabled: bool
) -> None:
    assert HealthCheckPolicy.from_nvidia_env(env).disabled is disabled


@pytest.mark.parametrize(
    ("env", "bad"),
    [
        pytest.param({"DP_DISABLE_HEALTHCHECKS": "79,fourty"}, "fourty", id="word in disable"),
        pytest.param({"DP_ENABLE_HEALTHCHECKS": "7 9"}, "7 9", id="space inside a number"),
        pytest.param({"DP_ENABLE_HEALTHCHECKS": "-3"}, "-3", id="negative"),
    ],
)
def test_a_bad_xid_token_is_rejected_with_the_variable_and_token(
    env: dict[str, str], bad: str
) -> None:
    with pytest.raises(ValueError) as info:
        HealthCheckPolicy.from_nvidia_env(env)
    message = str(info.value)
    assert next(iter(env)) in message
    assert bad in message


def passed(policy: HealthCheckPolicy) -> set[int]:
    return {code for code in range(1, 400) if not policy.is_xid_critical(code)}


def test_default_policy_passes_exactly_the_catalogs_application_and_no_action_xids() -> None:
    assert passed(HealthCheckPolicy()) == passed(HealthCheckPolicy.from_nvidia_env({}))
    assert passed(HealthCheckPolicy()) == set(xids_of(XidClass.APPLICATION, XidClass.NO_ACTION))
    assert {13, 31, 43, 45, 68, 94} <= CATALOG_IGNORED_XIDS
    assert 109 not in CATALOG_IGNORED_XIDS


def test_nvidia_device_plugin_policy_is_that_plugins_rule() -> None:
    policy = HealthCheckPolicy.from_nvidia_env({}, xid_policy="nvidia-device-plugin")
    assert passed(policy) == set(NVIDIA_DEVICE_PLUGIN_XIDS) == {13, 31, 43, 45, 68, 109}
    # No Xid waits for a node reboot there: NVIDIA's plugin treats every critical Xid alike.
    assert not policy.needs_node_reboot(xid(79))


def test_an_unknown_xid_policy_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"'mine'.*catalog, nvidia-device-plugin"):
        HealthCheckPolicy.from_nvidia_env({}, xid_policy="mine")


# (env, event, needs a node reboot?)
REBOOT_CASES = [
    pytest.param({}, xid(79), True, id="79: restart bare metal"),
    pytest.param({}, xid(151), True, id="151: restart the VM"),
    pytest.param({}, xid(54), True, id="54: check mechanicals"),
    pytest.param({}, xid(95), False, id="95: a GPU reset is enough"),
    pytest.param({}, xid(4242), False, id="unknown Xid: critical, recovers as before"),
    pytest.param({}, xid(94), False, id="94: not critical at all"),
    pytest.param({}, LOST, False, id="lost: RECOVERED brings it back"),
    pytest.param({"DP_DISABLE_HEALTHCHECKS": "79"}, xid(79), False, id="79 ignored by env"),
    pytest.param({"DP_DISABLE_HEALTHCHECKS": "all"}, xid(79), False, id="checks disabled"),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"},
        xid(79),
        True,
        id="79 on an allow-list",
    ),
]


@pytest.mark.parametrize(("env", "event", "reboot"), REBOOT_CASES)
def test_which_critical_xids_wait_for_a_node_reboot(
    env: dict[str, str], event: HealthEvent, reboot: bool
) -> None:
    assert HealthCheckPolicy.from_nvidia_env(env).needs_node_reboot(event) is reboot
    assert {54, 79, 151} == NODE_REBOOT_XIDS


def test_policy_never_auto_recovers_by_default() -> None:
    assert HealthCheckPolicy().recover_after_healthy_checks is None
    assert (
        HealthCheckPolicy.from_nvidia_env(
            {}, recover_after_healthy_checks=3
        ).recover_after_healthy_checks
        == 3
    )


@pytest.mark.parametrize("checks", [0, -1])
def test_recovery_after_zero_checks_is_rejected(checks: int) -> None:
    with pytest.raises(ValueError, match="recover_after_healthy_checks"):
        HealthCheckPolicy(recover_after_healthy_checks=checks)


@pytest.mark.parametrize(
    ("event", "text"),
    [
        pytest.param(xid(79), "Xid 79 (GPU has fallen off the bus)", id="known xid"),
        pytest.param(xid(4242), "Xid 4242", id="unknown xid"),
        pytest.param(xid(2), "Xid 2", id="an xid the catalog marks unused"),
        pytest.param(xid(95), "Xid 95 (uncontained ECC error)", id="kubegpu's own words first"),
        pytest.param(xid(136), "Xid 136 (link training failed)", id="else the catalog's"),
        pytest.param(
            HealthEvent(HealthEventKind.XID, UUID, xid=48, detail="DBE"),
            "Xid 48 (double-bit ECC error): DBE",
            id="with detail",
        ),
        pytest.param(LOST, "GPU lost (not answering; fallen off the bus?)", id="lost"),
    ],
)
def test_events_are_described_for_admins(event: HealthEvent, text: str) -> None:
    assert describe_event(event) == text


def test_an_xid_without_code_is_described_as_unknown() -> None:
    assert describe_xid(None) == "Xid (code unknown)"
