"""Building lightkube clients from a kubeconfig file or the in-cluster service account."""

from __future__ import annotations

from pathlib import Path

import lightkube
from lightkube.config.kubeconfig import KubeConfig


def load_kubeconfig(path: str | Path | None = None) -> KubeConfig:
    """``path`` when given, else in-cluster config when running in a pod, else ~/.kube/config
    (lightkube's ``from_env`` order)."""
    if path:
        return KubeConfig.from_file(str(path))
    return KubeConfig.from_env()


def async_client(
    path: str | Path | None = None,
    *,
    trust_env: bool = True,
    field_manager: str = "kubegpu",
) -> lightkube.AsyncClient:
    return lightkube.AsyncClient(
        load_kubeconfig(path), field_manager=field_manager, trust_env=trust_env
    )


def sync_client(
    path: str | Path | None = None,
    *,
    trust_env: bool = True,
    field_manager: str = "kubegpu",
) -> lightkube.Client:
    return lightkube.Client(load_kubeconfig(path), field_manager=field_manager, trust_env=trust_env)
