"""The extender's settings are a model of the one config system (pydantic, in kubegpu.config)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from kubegpu.config.extender import POLICY_NAMES, ExtenderConfig
from kubegpu.extender.scheduler import POLICY_ALIASES


def test_the_extender_settings_are_a_frozen_model_of_the_config_package() -> None:
    config = ExtenderConfig(port=0)
    assert isinstance(config, BaseModel)
    with pytest.raises(ValidationError):
        config.port = 1  # type: ignore[misc]
    assert config.model_copy(update={"leader_lease": "kube-system/kube-scheduler"}).leader_lease


def test_the_policy_names_the_settings_accept_are_the_ones_the_scheduler_maps() -> None:
    assert set(POLICY_ALIASES) == POLICY_NAMES
