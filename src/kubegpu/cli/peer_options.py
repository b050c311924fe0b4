"""The compat-mode options the extender and the peer webhook share (they must read peer pods
alike; the node agent reads the same settings from ``sharing.gpuShare.compat``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from kubegpu.config.model import MAX_VOLCANO_MEMORY_FACTOR
from kubegpu.sharing.peers import DEFAULT_PEER_COMPUTE_MILLI, PeerCompat, peer_compat

F = TypeVar("F", bound=Callable[..., Any])


def peer_compat_options(command: F) -> F:
    for option in reversed(
        (
            click.option(
                "--peer-compat",
                default="",
                show_default=True,
                help="Comma list of compat modes: volcano, aliyun (sharing.gpuShare.compat.modes).",
            ),
            click.option(
                "--aliyun-memory-unit",
                type=click.Choice(["GiB", "MiB"]),
                default="GiB",
                show_default=True,
                help="Unit of aliyun.com/gpu-mem (sharing.gpuShare.compat.aliyunMemoryUnit).",
            ),
            click.option(
                "--volcano-memory-factor",
                type=click.IntRange(1, MAX_VOLCANO_MEMORY_FACTOR),
                default=1,
                show_default=True,
                help="MiB in one volcano.sh/gpu-memory (gpuShare.compat.volcanoMemoryFactor).",
            ),
            click.option(
                "--peer-compute-milli",
                type=click.IntRange(1, 999),
                default=DEFAULT_PEER_COMPUTE_MILLI,
                show_default=True,
                help="Milli-GPU a peer container's share holds (gpuShare.compat.computeMilli).",
            ),
        )
    ):
        command = option(command)
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
