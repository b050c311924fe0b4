"""Kubeconfig documents for a local, credential-free API server (the fake one).

A kubeconfig is how every Kubernetes client (lightkube, kubectl, our own CLI) is told where a
cluster is, so the fake API server hands one out instead of a bespoke connection object.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

CONTEXT = "kubegpu-fake"


def kubeconfig_dict(
    server_url: str, *, namespace: str = "default", ca_file: str | Path | None = None
) -> dict[str, Any]:
    """One cluster, one empty user (no credentials), one current context."""
    cluster: dict[str, Any] = {"server": server_url}
    if ca_file is not None:
        cluster["certificate-authority"] = str(Path(ca_file).resolve())
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": cluster}],
        # An explicit, empty user: lightkube refuses a context without one.
        "users": [{"name": CONTEXT, "user": {}}],
        "contexts": [
            {
                "name": CONTEXT,
                "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace},
            }
        ],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(
    path: str | Path,
    server_url: str,
    *,
    namespace: str = "default",
    ca_file: str | Path | None = None,
) -> Path:
    """Write a kubeconfig file readable only by its owner and return its path.

    Written to a temporary file beside it and renamed into place, so that a process polling for
    the file (the demo waits for the fake API server's) never reads it half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(
        kubeconfig_dict(server_url, namespace=namespace, ca_file=ca_file), sort_keys=False
    )
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path
