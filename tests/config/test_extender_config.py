"""The extender's settings are a model of the one config system (pydantic, in kubegpu.config)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from kubegpu.config.extender import ExtenderConfig, ExtenderConfigError
from kubegpu.placement.policies import POLICIES, extender_accepts, extender_policy


def test_the_extender_settings_are_a_frozen_model_of_the_config_package() -> None:
    config = ExtenderConfig(port=0)
    assert isinstance(config, BaseModel)
    with pytest.raises(ValidationError):
        config.port = 1  # type: ignore[misc]
    assert config.model_copy(update={"leader_lease": "kube-system/kube-scheduler"}).leader_lease


def test_the_policy_names_the_settings_accept_are_the_ones_the_scheduler_maps() -> None:
    # Both read the policy registry: every accepted name runs a registered policy.
    assert {"binpack", "spread", "fgd", "kubegpu", *POLICIES} <= extender_accepts()
    for name in extender_accepts():
        ExtenderConfig(policy=name.upper()).validate()
        assert extender_policy(name) is POLICIES[{"binpack": "bestfit"}.get(name, name)]
    with pytest.raises(ExtenderConfigError, match="policy 'roundrobin' unknown"):
        ExtenderConfig(policy="roundrobin").validate()
