"""How the DRA driver introduces itself to the kubelet: where its two sockets live
(:class:`SocketPaths`) and the plugin-registration service the kubelet calls on the first one
(``GetInfo``, then ``NotifyRegistrationStatus`` with the outcome). Apart from
:mod:`kubegpu.dra.server`, which serves it beside the DRA service, because it is the kubelet's
plugin-watcher protocol, not DRA's.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpc import aio

from kubegpu.dra.api.pluginregistration.v1 import api_pb2 as reg_pb
from kubegpu.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# gRPC service names as the kubelet expects them in supported_versions, preferred first: the
# DRA service, and the device-health service the driver serves. From 1.37 the kubelet opens
# the health stream only for a driver that lists it here (pickHealthService in its
# dra_plugin_manager.go; without it a pod's allocatedResourcesStatus stays empty); 1.35 and
# 1.36 open it anyway and skip names they do not know when picking the DRA service.
SUPPORTED_VERSIONS: tuple[str, ...] = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1alpha1.DRAResourceHealth",
)

DEFAULT_PLUGINS_REGISTRY = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")


@dataclass(frozen=True)
class SocketPaths:
    registration: Path
    dra: Path

    @classmethod
    def for_driver(
        cls,
        driver: str,
        plugins_registry: Path = DEFAULT_PLUGINS_REGISTRY,
        plugins_dir: Path = DEFAULT_PLUGINS_DIR,
    ) -> SocketPaths:
        return cls(plugins_registry / f"{driver}-reg.sock", plugins_dir / driver / "dra.sock")


def _answers(path: Path, timeout_s: float) -> bool:
    """Whether a process accepts connections on the unix socket ``path``. A socket file
    whose server is gone (a crashed driver's) refuses; no file is no server."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout_s)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def foreign_server(sockets: SocketPaths, *, timeout_s: float = 1.0) -> Path | None:
    """The socket of ours that another process serves, or None. Asked while this driver holds
    the claim on its sockets, so no kubegpu driver serves them: a socket that answers then
    belongs to a driver of the same name that is not ours (NVIDIA's DRA driver, where
    ``dra.naming: nvidia`` makes our name ``gpu.nvidia.com``). Serving beside it would
    replace its sockets and its ResourceSlices."""
    for path in (sockets.registration, sockets.dra):
        if _answers(path, timeout_s):
            return path
    return None


@dataclass(frozen=True)
class RegistrationStatus:
    registered: bool
    error: str


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(
        self,
        driver: str,
        endpoint: Path,
        on_status: Callable[[RegistrationStatus], None] | None = None,
    ) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.on_status = on_status
        self.statuses: list[RegistrationStatus] = []

    async def GetInfo(
        self, request: reg_pb.InfoRequest, context: aio.ServicerContext[Any, Any]
    ) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, context: aio.ServicerContext[Any, Any]
    ) -> reg_pb.RegistrationStatusResponse:
        status = RegistrationStatus(request.plugin_registered, request.error)
        self.statuses.append(status)
        if status.registered:
            log.info("kubelet registered DRA driver %s at %s", self.driver, self.endpoint)
        else:
            log.error("kubelet refused DRA driver %s: %s", self.driver, status.error)
        if self.on_status is not None:
            self.on_status(status)
        return reg_pb.RegistrationStatusResponse()
