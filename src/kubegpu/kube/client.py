"""Building lightkube clients from a kubeconfig file or the in-cluster service account.

lightkube reports a bad kubeconfig as whatever its parsing hit first (``KeyError:
'clusters'``, ``UnicodeDecodeError``, its own ``ConfigError`` "~/.kube/config not found" when
there is none at all): :func:`load_kubeconfig` turns each into one :class:`KubeconfigError`
naming the file, so every role can exit 2 with that line before it starts anything. The files a
kubeconfig names (certificate authority, client certificate and key, token file) are opened
by lightkube only when the first client is made, with a ``FileNotFoundError`` that names
neither the kubeconfig nor the key: :func:`check_context_files` opens them at load instead.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

import lightkube
import yaml
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SERVICE_ACCOUNT, KubeConfig, SingleConfig
from lightkube.config.models import User

from kubegpu.kube.errors import KubeconfigError

# The async client as the roles name it (they may not import lightkube themselves).
AsyncKubeClient = lightkube.AsyncClient


__all__ = [
    "AsyncKubeClient",
    "KubeconfigError",
    "async_client",
    "check_context_files",
    "client_from",
    "load_kubeconfig",
    "load_kubeconfig_file",
    "server_version",
]


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


def load_kubeconfig_file(path: Path, *, check_files: bool = True) -> KubeConfig:
    """One kubeconfig file, checked enough that lightkube cannot fail on it with a KeyError.

    With ``check_files``, the files its current context names are opened too
    (:func:`check_context_files`); a caller that picks another context passes False and checks
    that one."""
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
        config = KubeConfig.from_dict(doc, fname=str(path))
    except Exception as exc:  # KeyError, TypeError, ConfigError, ...
        raise KubeconfigError(f"kubeconfig {path}: {type(exc).__name__}: {exc}") from None
    if check_files and config.current_context:
        try:
            single = config.get()
        except Exception as exc:  # ConfigError (unknown context), KeyError (unknown cluster)
            raise KubeconfigError(f"kubeconfig {path}: {type(exc).__name__}: {exc}") from None
        if single is not None:
            check_context_files(single, str(path))
    return config


# (kubeconfig key, where lightkube keeps it): the files a context may name.
_CLUSTER_FILES = (("certificate-authority", "certificate_auth"),)
_USER_FILES = (
    ("client-certificate", "client_cert"),
    ("client-key", "client_key"),
    ("tokenFile", "token_file"),
)


def check_context_files(single: SingleConfig, source: str) -> None:
    """Raise :class:`KubeconfigError` naming ``source`` (the kubeconfig) and the file unless
    every file the context names can be read and its certificates and key load.

    Relative names are relative to the kubeconfig's folder, as kubectl reads them."""
    named: list[tuple[str, object]] = [
        (key, getattr(single.cluster, attr, None)) for key, attr in _CLUSTER_FILES
    ]
    if single.user is not None:
        named += [(key, getattr(single.user, attr, None)) for key, attr in _USER_FILES]
    for key, name in named:
        if not name:
            continue
        try:
            file = Path(single.abs_file(str(name)))
            with file.open("rb"):
                pass
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise KubeconfigError(f"kubeconfig {source}: {key} {name}: {reason}") from None
        except Exception as exc:  # lightkube's ConfigError: relative, kubeconfig path unknown
            raise KubeconfigError(f"kubeconfig {source}: {key} {name}: {exc}") from None
    # What the first client does with them, file by file so the message names the culprit:
    # a certificate that is not PEM or a key that does not match it fails here, at start.
    ca = single.cluster.certificate_auth
    if ca:
        try:
            ssl.create_default_context(cafile=str(single.abs_file(ca)))
        except (ssl.SSLError, ValueError) as exc:
            raise KubeconfigError(
                f"kubeconfig {source}: certificate-authority {ca}: not a PEM certificate ({exc})"
            ) from None
    user = single.user or User()
    if user.client_cert and user.client_key:
        try:  # a bare context: the pair is what is checked, not the system's CAs (~30 ms)
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(
                str(single.abs_file(user.client_cert)), str(single.abs_file(user.client_key))
            )
        except (ssl.SSLError, ValueError) as exc:
            raise KubeconfigError(
                f"kubeconfig {source}: client-certificate {user.client_cert} and client-key "
                f"{user.client_key}: not a PEM certificate and its private key ({exc})"
            ) from None
    if not (single.cluster.certificate_auth_data or user.client_cert_data or user.client_key_data):
        return  # every file checked above; verify_cluster would only load the system's CAs
    try:  # the *-data variants (base64 in the file itself), and any mix of the two
        verify_cluster(single.cluster, user, single.abs_file)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise KubeconfigError(
            f"kubeconfig {source}: cannot load the certificates or key of context "
            f"{single.context_name!r} ({exc})"
        ) from None


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
