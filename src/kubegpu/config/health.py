"""The health policy the config file asks for, resolved once for every role that judges GPUs.

The node agent, the exporter and the labeller must judge an Xid the same way (their verdicts
are compared by operators side by side), so the one resolution of NVIDIA's ``DP_*_HEALTHCHECKS``
environment and the ``health`` block lives here, beside the config model it reads, rather than
in one of the edges the others may not import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from kubegpu.config.model import Health
from kubegpu.core.health import HealthCheckPolicy


def health_policy(health: Health, env: Mapping[str, str]) -> HealthCheckPolicy:
    """The file's Xid policy, NVIDIA's ``DP_*_HEALTHCHECKS`` environment on it, then the file's
    Xid lists on top."""
    base = HealthCheckPolicy.from_nvidia_env(
        env,
        recover_after_healthy_checks=health.recover_after_healthy_checks,
        xid_policy=health.xid_policy,
    )
    return dataclasses.replace(
        base,
        disabled=base.disabled or health.disabled,
        disabled_xids=base.disabled_xids | frozenset(health.ignored_xids),
        enabled_xids=base.enabled_xids | frozenset(health.critical_xids),
    )
