"""Reading Nodes and Pods for inspect: kubectl's kubeconfig rules, one list, or list + watch.

Kubeconfig resolution follows kubectl, not lightkube's ``from_env`` (which prefers the
in-cluster service account): ``--kubeconfig``, else every existing file in ``$KUBECONFIG``
(merged, first file wins per entry and for ``current-context``), else ``~/.kube/config``, else
the in-cluster service account. Every failure to reach or read the cluster becomes one
:class:`ClusterError` with a message fit for a terminal; the command maps it to exit code 1,
and :class:`KubeconfigProblem` (no kubeconfig, one that cannot be used, an unknown context:
the user's to fix) to exit code 2.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import lightkube
import yaml
from lightkube import ApiError, ConfigError
from lightkube.config.kubeconfig import SERVICE_ACCOUNT, KubeConfig

from kubegpu.kube.client import KubeconfigError, check_context_files, load_kubeconfig_file
from kubegpu.kube.list_watch import RawNode, RawPod, watch_events

log = logging.getLogger(__name__)


class ClusterError(Exception):
    """The cluster cannot be read; the message says where and why."""


class KubeconfigProblem(ClusterError):
    """There is no usable kubeconfig (or context) to read the cluster with."""


# --------------------------------------------------------------------------- kubeconfig
def _merge(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """kubectl's merge of several kubeconfig files: the first file to define a named cluster,
    user or context, or the current context, wins."""
    merged: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [],
        "users": [],
        "contexts": [],
    }
    for doc in documents:
        for section in ("clusters", "users", "contexts"):
            known = {item.get("name") for item in merged[section]}
            for item in doc.get(section) or []:
                if isinstance(item, dict) and item.get("name") not in known:
                    merged[section].append(item)
                    known.add(item.get("name"))
        if not merged.get("current-context") and doc.get("current-context"):
            merged["current-context"] = doc["current-context"]
    return merged


def resolve_kubeconfig(
    explicit: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    service_account: str | Path = SERVICE_ACCOUNT,
) -> KubeConfig:
    """The kubeconfig kubectl would use (see the module docstring); raises
    :class:`ClusterError` when there is none."""
    env = os.environ if environ is None else environ
    try:
        if explicit:
            if not Path(explicit).is_file():
                raise KubeconfigProblem(f"kubeconfig {explicit} does not exist")
            return load_kubeconfig_file(Path(explicit), check_files=False)
        listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
        existing = [Path(p).expanduser() for p in listed if Path(p).expanduser().is_file()]
        if len(existing) == 1:
            return load_kubeconfig_file(existing[0], check_files=False)
        if existing:
            documents = []
            for path in existing:
                loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
                if isinstance(loaded, dict):
                    # Relative certificate paths are relative to their own file.
                    documents.append(_absolutise(loaded, path.parent))
            return KubeConfig.from_dict(_merge(documents))
        default = (home or Path.home()) / ".kube" / "config"
        if not listed and default.is_file():
            return load_kubeconfig_file(default, check_files=False)
        if Path(service_account).is_dir() and env.get("KUBERNETES_SERVICE_HOST"):
            return KubeConfig.from_service_account(str(service_account))
    except KubeconfigError as exc:
        raise KubeconfigProblem(str(exc)) from None
    except (ConfigError, KeyError, TypeError, AttributeError) as exc:
        raise KubeconfigProblem(f"kubeconfig: {type(exc).__name__}: {exc}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise KubeconfigProblem(f"cannot read kubeconfig: {exc}") from None
    where = "$KUBECONFIG" if listed else str(default)
    raise KubeconfigProblem(
        f"no kubeconfig found ({where} does not exist) and not running inside a cluster; "
        "pass --kubeconfig"
    )


_PATH_KEYS = ("certificate-authority", "client-certificate", "client-key", "tokenFile")


def _absolutise(doc: dict[str, Any], base: Path) -> dict[str, Any]:
    for section, inner in (("clusters", "cluster"), ("users", "user")):
        for item in doc.get(section) or []:
            body = item.get(inner) if isinstance(item, dict) else None
            if not isinstance(body, dict):
                continue
            for key in _PATH_KEYS:
                value = body.get(key)
                if isinstance(value, str) and value and not os.path.isabs(value):
                    body[key] = str(base / value)
    return doc


@dataclass(frozen=True)
class Connection:
    client: lightkube.AsyncClient
    server_url: str


def make_client(
    kubeconfig: str | Path | None = None,
    *,
    context: str | None = None,
    request_timeout_s: float = 10.0,
) -> Connection:
    """An async client for the resolved kubeconfig (and ``context``, default: current)."""
    config = resolve_kubeconfig(kubeconfig)
    try:
        single = config.get(context_name=context)
    except (ConfigError, KeyError) as exc:
        raise KubeconfigProblem(f"kubeconfig: {exc} (--context {context})") from None
    if single is None:
        raise KubeconfigProblem("kubeconfig has no current context; pass --context")
    try:  # the chosen context's files, now: lightkube would open them with a traceback
        check_context_files(single, str(config.fname or "$KUBECONFIG"))
    except KubeconfigError as exc:
        raise KubeconfigProblem(str(exc)) from None
    client = lightkube.AsyncClient(
        single, timeout=httpx.Timeout(request_timeout_s), field_manager="kubegpu-inspect"
    )
    return Connection(client, single.cluster.server)


def describe_failure(server_url: str, exc: BaseException) -> str:
    """A one-line explanation of why the API server at ``server_url`` could not be read."""
    server = f" at {server_url}" if server_url else ""
    if isinstance(exc, ApiError):
        code = exc.status.code
        reason = exc.status.message or exc.status.reason or ""
        hint = ""
        if code in (401, 403):
            hint = " (inspect needs get/list/watch on nodes and pods in all namespaces)"
        return f"the Kubernetes API server{server} answered {code}: {reason}{hint}"
    if isinstance(exc, httpx.TimeoutException):
        return f"the Kubernetes API server{server} did not answer in time"
    if isinstance(exc, ValueError | ConfigError):
        return f"unexpected answer from the Kubernetes API server{server}: {exc}"
    return f"cannot reach the Kubernetes API server{server}: {type(exc).__name__}: {exc}"


_FAILURES = (httpx.HTTPError, OSError, ApiError, ConfigError, ValueError)


# --------------------------------------------------------------------------- one list
@dataclass(frozen=True)
class ClusterListing:
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    nodes_version: str = ""
    pods_version: str = ""


async def list_cluster(
    client: lightkube.AsyncClient, server_url: str = "", nodes: Collection[str] = ()
) -> ClusterListing:
    """Every Node and every Pod (all namespaces) as JSON; raises :class:`ClusterError`.

    With ``nodes``, only those Nodes, the Pods bound to them and the Pods not bound yet
    (a decided pod waiting for its binding names its node only in its annotation) are listed,
    through field selectors, so inspecting one node of a large cluster moves a few objects,
    not the cluster."""
    try:
        if not nodes:
            node_list = client.list(RawNode)
            pod_list = client.list(RawPod, namespace="*")
            found_nodes, found_pods = await asyncio.gather(_collect(node_list), _collect(pod_list))
            return ClusterListing(
                found_nodes, found_pods, node_list.resourceVersion, pod_list.resourceVersion
            )
        wanted = sorted(set(nodes))
        node_lists = [client.list(RawNode, fields={"metadata.name": n}) for n in wanted]
        pod_lists = [
            client.list(RawPod, namespace="*", fields={"spec.nodeName": n}) for n in [*wanted, ""]
        ]
        parts = await asyncio.gather(*(_collect(x) for x in [*node_lists, *pod_lists]))
        found_nodes = [n for part in parts[: len(node_lists)] for n in part]
        by_uid: dict[str, dict[str, Any]] = {}
        for part in parts[len(node_lists) :]:
            for pod in part:
                by_uid[str((pod.get("metadata") or {}).get("uid") or id(pod))] = pod
        return ClusterListing(found_nodes, list(by_uid.values()))
    except _FAILURES as exc:
        raise ClusterError(describe_failure(server_url, exc)) from exc


async def _collect(listing: Any) -> list[dict[str, Any]]:
    return [dict(item) async for item in listing]


# --------------------------------------------------------------------------- list + watch
@dataclass
class ClusterState:
    """Nodes by name and pods by uid, kept current by :func:`follow_cluster`. ``changed`` is
    set after every applied event; the consumer clears it."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    events: int = 0

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = str(meta.get("name") if kind == "nodes" else meta.get("uid") or "")
        if not key:
            return
        store = self.nodes if kind == "nodes" else self.pods
        if event == "DELETED":
            store.pop(key, None)
        else:
            store[key] = obj
        self.events += 1
        self.changed.set()


async def follow_cluster(
    client: lightkube.AsyncClient,
    state: ClusterState,
    *,
    server_url: str = "",
    on_error: Callable[[str], None] | None = None,
    max_backoff_s: float = 5.0,
) -> None:
    """List then watch nodes and pods into ``state`` until cancelled. A failed stream is
    resumed after a bounded backoff; 410 Expired relists. ``on_error`` hears each failure."""
    listed: set[str] = set()

    async def loop(kind: type[RawNode] | type[RawPod], label: str) -> None:
        extra: dict[str, Any] = {"namespace": "*"} if kind is RawPod else {}
        version: str | None = None
        failures = 0
        while True:
            try:
                if version is None:
                    listing = client.list(kind, **extra)
                    objects = await _collect(listing)
                    store = state.nodes if label == "nodes" else state.pods
                    store.clear()
                    for obj in objects:
                        state.apply(label, "ADDED", obj)
                    version = listing.resourceVersion
                    listed.add(label)
                    if listed >= {"nodes", "pods"}:
                        state.synced.set()
                    state.changed.set()
                stream = watch_events(
                    client, kind, resource_version=version, server_timeout=None, **extra
                )
                async for event, data in stream:
                    rv = (data.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        version = rv
                    if event != "BOOKMARK":
                        state.apply(label, event, data)
                    failures = 0
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                if exc.status.code == 410:
                    version = None
                    continue
                failures += 1
                await _pause(label, failures, describe_failure(server_url, exc))
            except _FAILURES as exc:
                failures += 1
                await _pause(label, failures, describe_failure(server_url, exc))

    async def _pause(label: str, failures: int, why: str) -> None:
        if on_error is not None:
            on_error(f"{label}: {why}")
        log.warning("inspect: %s watch failed (%s); retrying", label, why)
        await asyncio.sleep(min(max_backoff_s, 0.25 * 2 ** min(failures, 8)))

    async with asyncio.TaskGroup() as group:
        group.create_task(loop(RawNode, "nodes"))
        group.create_task(loop(RawPod, "pods"))
