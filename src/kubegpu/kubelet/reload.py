"""What a SIGHUP reload changes: the new config read and judged, before anything is stopped.

A reload re-reads the file with the flags and environment over it again, builds the new plans
and checks they can be served with the API access the agent has. A config that does not load,
or whose plans cannot be built, is rejected and the running one kept (the agent logs why); an
unchanged one changes nothing. Otherwise :class:`ConfigChange` says which parts must restart,
so the supervisor restarts only those (the probes' listener, the exporter, the health judge and
the MPS daemon are kept when their blocks did not change).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kubegpu.config.load import ConfigError, load_config
from kubegpu.config.model import AgentConfig
from kubegpu.core.gpu import NodeInventory
from kubegpu.kubelet.plans import build_plans
from kubegpu.kubelet.resources import PlanError, ResourcePlan


class ReloadRejected(Exception):
    """The new config cannot be used; the running one stays."""


@dataclass(frozen=True)
class ConfigChange:
    config: AgentConfig
    plans: list[ResourcePlan]
    health: bool  # the health block changed: judge again with the new policy
    probes: bool  # flags.healthListen changed: serve the probes elsewhere
    exporter: bool  # the exporter block changed: restart it
    keep_mps: bool  # sharing stays on: its MPS daemon is kept if its settings are the same


def check_api_access(config: AgentConfig, *, api: bool, node_name: str) -> None:
    """Raise PlanError for a setting that needs API access the agent was not given."""
    if config.sharing.gpu_share.enabled and (not api or not node_name):
        raise PlanError(
            "sharing.gpuShare.enabled needs API access (--kubeconfig or in-cluster) and "
            "--node-name: share slots are served from the extender's pod annotations"
        )
    exporter = config.exporter
    if exporter.enabled and exporter.pod_directory == "api" and (not api or not node_name):
        raise PlanError(
            "exporter.podDirectory: api needs API access (--kubeconfig or in-cluster) and "
            "--node-name; use logs to name pods from the kubelet's log directory"
        )


def read_change(
    running: AgentConfig,
    config_path: Path | None,
    overrides: Mapping[str, object],
    inventory: NodeInventory,
    *,
    api: bool,
    node_name: str,
) -> ConfigChange | None:
    """The change a reload makes, or None when the config is unchanged; raises
    :class:`ReloadRejected` saying why the new one cannot be used."""
    try:
        new = load_config(config_path, overrides)
        plans = build_plans(new, inventory)
        check_api_access(new, api=api, node_name=node_name)
    except (ConfigError, PlanError) as err:
        raise ReloadRejected(str(err)) from err
    if new == running:
        return None
    return ConfigChange(
        config=new,
        plans=plans,
        health=new.health != running.health,
        probes=new.flags.health_listen != running.flags.health_listen,
        exporter=new.exporter != running.exporter,
        keep_mps=new.sharing.gpu_share.enabled,
    )
