"""Building lightkube clients from a kubeconfig file or the in-cluster service account.

lightkube reports a bad kubeconfig as whatever its parsing hit first (``KeyError:
'clusters'``, ``UnicodeDecodeError``, its own ``ConfigError`` "~/.kube/config not found" when
there is none at all): :func:`load_kubeconfig` turns each into one :class:`KubeconfigError`
naming the file, so every role can exit 2 with that line before it starts anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightkube
import yaml
from lightkube.config.kubeconfig import SERVICE_ACCOUNT, KubeConfig

# The async client as the roles name it (they may not import lightkube themselves).
AsyncKubeClient = lightkube.AsyncClient


class KubeconfigError(ValueError):
    """There is no usable kubeconfig; the message names the file or says where it looked."""


def load_kubeconfig(path: str | Path | None = None) -> KubeConfig:
    """``path`` when given, else in-cluster config when running in a pod, else ~/.kube/config
    (lightkube's ``from_env`` order)."""
    if not path:
        in_cluster = os.environ.get("KUBERNETES_SERVICE_HOST") and Path(SERVICE_ACCOUNT).is_dir()
        if in_cluster:
            try:
                return KubeConfig.from_service_account()
            except Exception as exc:  # lightkube raises several kinds
                raise KubeconfigError(f"in-cluster service account: {exc}") from None
        listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
        default = Path(listed[0] if listed else "~/.kube/config").expanduser()
        if not default.is_file():
            raise KubeconfigError(
                f"no kubeconfig: not running in a cluster and {default} does not exist; "
                "pass --kubeconfig"
            )
        path = default
    return load_kubeconfig_file(Path(path))


def load_kubeconfig_file(path: Path) -> KubeConfig:
    """One kubeconfig file, checked enough that lightkube cannot fail on it with a KeyError."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise KubeconfigError(f"kubeconfig {path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise KubeconfigError(f"kubeconfig {path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"kubeconfig {path}: not YAML ({exc})") from None
    if not isinstance(doc, dict):
        raise KubeconfigError(f"kubeconfig {path}: not a kubeconfig (a YAML mapping)")
    for section in ("clusters", "contexts"):
        if not isinstance(doc.get(section), list) or not doc[section]:
            raise KubeconfigError(f"kubeconfig {path}: no {section}")
    try:
        return KubeConfig.from_dict(doc, fname=str(path))
    except Exception as exc:  # KeyError, TypeError, ConfigError, ...
        raise KubeconfigError(f"kubeconfig {path}: {type(exc).__name__}: {exc}") from None


def async_client(
    path: str | Path | None = None,
    *,
    trust_env: bool = True,
    field_manager: str = "kubegpu",
) -> lightkube.AsyncClient:
    return lightkube.AsyncClient(
        load_kubeconfig(path), field_manager=field_manager, trust_env=trust_env
    )


def client_from(config: KubeConfig, *, field_manager: str) -> lightkube.Client:
    """A synchronous client on a config already loaded (and checked) by :func:`load_kubeconfig`:
    roles load it at start, to exit 2 on a bad one, and make the client when they need it."""
    return lightkube.Client(config, field_manager=field_manager)


async def server_version(client: lightkube.AsyncClient) -> dict[str, Any]:
    """The API server's ``/version`` document. lightkube has no call for it: its HTTP client,
    authenticated as the caller, on the server's base URL."""
    http = client._client._client
    answer = await http.get("/version")
    answer.raise_for_status()
    doc: dict[str, Any] = answer.json()
    return doc
