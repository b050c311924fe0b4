"""The compat-mode options the extender and the peer webhook share (they must read peer pods
alike; the node agent reads the same settings from ``sharing.gpuShare.compat``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from kubegpu.cli.config_options import config_option
from kubegpu.config.model import AgentConfig
from kubegpu.sharing.peers import PeerCompat, peer_compat

F = TypeVar("F", bound=Callable[..., Any])

# Each option and the node agent's setting it must agree with; help, type, bounds and default
# come from that setting's field.
PEER_OPTIONS: dict[str, str] = {
    "--peer-compat": "sharing.gpuShare.compat.modes",
    "--aliyun-memory-unit": "sharing.gpuShare.compat.aliyunMemoryUnit",
    "--volcano-memory-factor": "sharing.gpuShare.compat.volcanoMemoryFactor",
    "--peer-compute-milli": "sharing.gpuShare.compat.computeMilli",
}


def peer_compat_options(command: F) -> F:
    for flag, path in reversed(PEER_OPTIONS.items()):
        command = config_option(AgentConfig, path, flag, from_file=False, cite="agent")(command)
    return command


def peers_from_options(options: dict[str, Any]) -> tuple[PeerCompat, ...]:
    try:
        return peer_compat(
            str(options["peer_compat"] or "").split(","),
            aliyun_memory_unit=options["aliyun_memory_unit"],
            volcano_memory_factor=int(options["volcano_memory_factor"]),
            compute_milli=int(options["peer_compute_milli"]),
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--peer-compat") from None
