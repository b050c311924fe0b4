"""The pure health policy: which events take a GPU out of the pool, and NVIDIA's env knobs."""

from __future__ import annotations

import pytest

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.health import (
    APPLICATION_XIDS,
    HealthCheckPolicy,
    HealthEvent,
    HealthEventKind,
    describe_event,
    describe_xid,
)

UUID = GpuUuid("GPU-00000000-0000-4000-8000-000000000000")


def xid(code: int | None) -> HealthEvent:
    return HealthEvent(HealthEventKind.XID, UUID, xid=code)


LOST = HealthEvent(HealthEventKind.LOST, UUID)
RECOVERED = HealthEvent(HealthEventKind.RECOVERED, UUID)

# (env, event, critical?)
ENV_CASES = [
    pytest.param({}, xid(79), True, id="default: hardware Xid 79 is critical"),
    pytest.param({}, xid(48), True, id="default: double-bit ECC is critical"),
    *(
        pytest.param({}, xid(code), False, id=f"default: application Xid {code} is ignored")
        for code in sorted(APPLICATION_XIDS)
    ),
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
    pytest.param({"DP_DISABLE_HEALTHCHECKS": "79"}, xid(94), True, id="disable list: others on"),
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


def test_default_policy_ignores_exactly_the_application_xids() -> None:
    policy = HealthCheckPolicy()
    assert {code for code in range(1, 200) if not policy.is_xid_critical(code)} == set(
        APPLICATION_XIDS
    )


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
