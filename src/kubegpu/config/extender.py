"""The extender's settings (a pydantic model, like the node agent's), their validation and the
target workload file.

One config system for every role: the extender's settings live in :mod:`kubegpu.config` beside
the node agent's. They keep their own shape: flat, with the long option names as the settings
file's keys (``kind: ExtenderConfig``), flag > ``KUBEGPU_EXTENDER_*`` > file > default resolved
by the CLI. The model holds the result; :meth:`ExtenderConfig.validate` checks it, so an
instance can be built first and refused with the setting named. Checking the files the
settings name (TLS, kubeconfig) is the extender role's (:func:`kubegpu.roles.extender.
check_files`).

Settings arrive from flags, ``KUBEGPU_EXTENDER_*`` variables or a versioned YAML file (the
CLI resolves that precedence); this module only checks the result. Plain HTTP is refused on
any address but loopback unless explicitly allowed, because the scheduler's calls carry whole
pod specs and the bind verb acts on the cluster. The optional metrics listener
(``metrics-port``) is plain HTTP wherever it listens: it serves only ``/metrics``, ``/healthz``
and ``/readyz``, reads no body and has no verb that changes anything.
"""

from __future__ import annotations

import difflib
import ipaddress
from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from kubegpu.core.names import model_key
from kubegpu.core.version_skew import parse_version
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import PodRequest
from kubegpu.placement.policies import (
    DEFAULT_POLICY,
    extender_accepts,
    extender_names,
    names_in_prose,
)
from kubegpu.sharing.resources import ResourceNames

CONFIG_API_VERSION = "kubegpu.io/v1alpha1"
CONFIG_KIND = "ExtenderConfig"
DEFAULT_PORT = 8888
# A node-cache-capable call (node names only) over any cluster size, with the largest pod etcd
# stores (1.5 MiB). Not enough without node caching: full Node objects are ~15 KiB each
# (1,213 realistic ones are 18 MiB, 5,000 are 75 MiB), hence the larger default of that mode.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
FULL_NODES_MAX_BODY_BYTES = 128 * 1024 * 1024
# Bytes of request bodies held at once, across requests: four full-size bodies of the cache
# mode, or one of the full-Node mode (the body limit, whichever is larger).
DEFAULT_MAX_INFLIGHT_BODY_BYTES = 64 * 1024 * 1024
# The largest limits that may be set: a GiB per request (a 5,000-node filter with full Node
# objects is 75 MiB) and four of them at once. Unbounded, a typo of a few digits lets one
# client make the extender hold more memory than its node has.
MAX_BODY_BYTES = 1024 * 1024 * 1024
MAX_INFLIGHT_BODY_BYTES = 4 * MAX_BODY_BYTES
MAX_REQUEST_TIMEOUT_S = 3600.0
MAX_WORKLOAD_REFRESH_S = 86_400.0
MAX_BIND_ATTEMPTS = 100


class ExtenderConfigError(ValueError):
    """A setting is wrong; the message names it and its value."""


class ExtenderConfig(BaseModel):
    # Frozen like the node agent's. Values arrive typed by the command line (the settings
    # file's values go through its options too), so construction has nothing to refuse.
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(
        default=DEFAULT_PORT,
        description="Port of the verbs' listener (0 picks a free one, logged at start).",
    )
    policy: str = Field(
        default=DEFAULT_POLICY,
        description=f"{names_in_prose(extender_names())} (or any placement engine policy name).",
    )
    names: ResourceNames = Field(
        default_factory=ResourceNames,
        description="The resources accounted (whole GPUs, GPU memory, GPU compute, share "
        "slots) and the peer compat modes, each equal to the node agent's sharing.gpuShare "
        "setting of the same meaning.",
    )
    tls_cert_file: Path | None = Field(
        default=None,
        description="Serve HTTPS with this PEM certificate (chain); needs --tls-key-file.",
    )
    tls_key_file: Path | None = Field(
        default=None, description="The unencrypted PEM private key of --tls-cert-file."
    )
    client_ca_file: Path | None = Field(
        default=None, description="Require client certificates signed by it."
    )
    allow_insecure_http: bool = Field(
        default=False, description="Serve plain HTTP on a non-loopback address."
    )
    node_cache_capable: bool = Field(
        default=True,
        description="Must match nodeCacheCapable in kube-scheduler's extender config. Off, "
        "every filter carries full Node objects (about 15 KiB each: 75 MiB for 5,000 nodes), "
        "so the body limits default larger (max-body-bytes 128 MiB).",
    )
    max_body_bytes: int | None = Field(
        default=None,
        description="Largest request body accepted; a bigger one is answered 413. Unset: "
        "16 MiB, or 128 MiB with --no-node-cache-capable.",
    )
    max_inflight_body_bytes: int | None = Field(
        default=None,
        description="Bytes of request bodies held at once across all requests; a request that "
        "would pass it is answered 503 at once (kube-scheduler retries the pod). Unset: 64 MiB "
        "or max-body-bytes, whichever is larger.",
    )
    request_head_timeout_s: float = Field(
        default=30.0,
        description="Close a connection that has not sent a whole request head this long "
        "after it opened or was last answered (idle keep-alive connections too).",
    )
    request_body_timeout_s: float = Field(
        default=30.0,
        description="Answer 408 and close when a request body is not complete this long after "
        "its head.",
    )
    kubeconfig: Path | None = Field(default=None, description="Default: in-cluster, then ~/.kube.")
    workload_file: Path | None = Field(
        default=None,
        description="Target workload for fgd/kubegpu (default: every pod in the cluster, "
        "CPU-only ones included, as the simulator does).",
    )
    workload_refresh_s: float = Field(
        default=300.0,
        description="How often fgd/kubegpu re-read the cluster's GPU pods as their target "
        "workload.",
    )
    dra_naming: Literal["kubegpu", "nvidia"] = Field(
        default="kubegpu",
        description="The DRA driver's naming, equal to the driver's dra.naming: `kubegpu` "
        "ranks claims for gpu.kubegpu.io's classes, `nvidia` for gpu.nvidia.com's.",
    )
    preemption: bool = Field(
        default=True,
        description="Preempt for pods kube-scheduler's own preemption cannot help (a share "
        "blocked by card memory or compute): evict the fewest lower-priority pods that free "
        "one card, as kube-scheduler would, and hold the card for the pod. The preempt verb "
        "(preemptVerb: preempt in the scheduler config) answers either way.",
    )
    bind_attempts: int = Field(
        default=5,
        description="Tries per bind when the API answers a conflict (409) or is briefly "
        "unavailable.",
    )
    leader_lease: str | None = Field(
        default=None,
        description="Required. namespace/name of the leader-election Lease of the "
        "kube-scheduler that calls this extender (kube-system/kube-scheduler for the default "
        "scheduler): bind refuses unless that Lease's holder is leader-identity. 'none' when "
        "exactly one extender can ever run (two unguarded extenders both bind and over-commit "
        "cards).",
    )
    leader_identity: str | None = Field(
        default=None,
        description="Who this extender binds for: a leader-lease holderIdentity equal to it or "
        "starting with it and '_' (kube-scheduler writes its host name, '_' and a UUID). "
        "Unset: this host's name.",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="IP address of the metrics listener (0.0.0.0 or :: for every address).",
    )
    metrics_port: int | None = Field(
        default=None,
        description="Also serve /metrics, /healthz and /readyz, and nothing else, on this port "
        "over plain HTTP (safe: read-only, no verb), for Prometheus and the kubelet's probes. "
        "Unset: off.",
    )
    scheduler_version: str | None = Field(
        default=None,
        description="Version of the kube-scheduler that calls this extender (its image tag, "
        "e.g. v1.31.4). Set, the extender refuses to start when it is newer than the API "
        "server or more than one minor version older (Kubernetes' version skew policy). The "
        "second-scheduler overlay sets it from the kube-scheduler image. Unset: not checked.",
    )

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def body_limit_bytes(self) -> int:
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return DEFAULT_MAX_BODY_BYTES if self.node_cache_capable else FULL_NODES_MAX_BODY_BYTES

    @property
    def inflight_limit_bytes(self) -> int:
        if self.max_inflight_body_bytes is not None:
            return self.max_inflight_body_bytes
        return max(DEFAULT_MAX_INFLIGHT_BODY_BYTES, self.body_limit_bytes)

    # Not pydantic's (deprecated) ``validate``: the extender's own check of settings built from
    # flags, environment and file together, raising ExtenderConfigError naming the setting.
    def validate(self) -> None:  # type: ignore[override]
        policies = extender_accepts()  # the policy registry's
        if self.policy.lower() not in policies:
            raise ExtenderConfigError(
                f"policy {self.policy!r} unknown; choose one of {sorted(policies)}"
            )
        if not 0 <= self.port <= 65535:
            raise ExtenderConfigError(f"port {self.port} out of range")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ExtenderConfigError("tls-cert-file and tls-key-file go together")
        if self.client_ca_file is not None and not self.tls:
            raise ExtenderConfigError("client-ca-file needs tls-cert-file and tls-key-file")
        if not self.tls and not self.allow_insecure_http and not is_loopback(self.host):
            raise ExtenderConfigError(
                f"refusing plain HTTP on {self.host}: configure tls-cert-file/tls-key-file or "
                "pass --allow-insecure-http"
            )
        if self.body_limit_bytes < 1024:
            raise ExtenderConfigError(f"max-body-bytes {self.max_body_bytes} is too small")
        if self.body_limit_bytes > MAX_BODY_BYTES:
            raise ExtenderConfigError(
                f"max-body-bytes {self.max_body_bytes} is more than {MAX_BODY_BYTES} (1 GiB)"
            )
        if self.inflight_limit_bytes > MAX_INFLIGHT_BODY_BYTES:
            raise ExtenderConfigError(
                f"max-inflight-body-bytes {self.max_inflight_body_bytes} is more than "
                f"{MAX_INFLIGHT_BODY_BYTES} (4 GiB)"
            )
        if self.inflight_limit_bytes < self.body_limit_bytes:
            raise ExtenderConfigError(
                f"max-inflight-body-bytes {self.inflight_limit_bytes} is smaller than "
                f"max-body-bytes {self.body_limit_bytes}: no full-size request could be served"
            )
        for key, seconds in (
            ("request-head-timeout-seconds", self.request_head_timeout_s),
            ("request-body-timeout-seconds", self.request_body_timeout_s),
        ):
            if not 0 < seconds <= MAX_REQUEST_TIMEOUT_S:  # also refuses NaN
                raise ExtenderConfigError(f"{key} {seconds} must be more than 0 and at most 3600")
        if not 0 < self.workload_refresh_s <= MAX_WORKLOAD_REFRESH_S:
            raise ExtenderConfigError(
                f"workload-refresh-seconds {self.workload_refresh_s} must be more than 0 and at "
                f"most {MAX_WORKLOAD_REFRESH_S:.0f}"
            )
        if not 1 <= self.bind_attempts <= MAX_BIND_ATTEMPTS:
            raise ExtenderConfigError(f"bind-attempts must be 1 to {MAX_BIND_ATTEMPTS}")
        self._validate_metrics_listener()
        if self.scheduler_version is not None:
            try:
                parse_version(self.scheduler_version)
            except ValueError as exc:
                raise ExtenderConfigError(f"scheduler-version {exc}") from None
        if self.leader_lease:
            namespace, _, name = self.leader_lease.partition("/")
            if not namespace or not name or "/" in name:
                raise ExtenderConfigError(
                    f"leader-lease {self.leader_lease!r} must be namespace/name, e.g. "
                    "kube-system/kube-scheduler"
                )

    def _validate_metrics_listener(self) -> None:
        if self.metrics_port is None:
            return
        if not 0 <= self.metrics_port <= 65535:
            raise ExtenderConfigError(f"metrics-port {self.metrics_port} out of range (0-65535)")
        if not is_ip_or_localhost(self.metrics_host):
            raise ExtenderConfigError(
                f"metrics-host {self.metrics_host!r} is not an IP address (e.g. 0.0.0.0, ::, "
                "127.0.0.1)"
            )
        hosts = {self.host, self.metrics_host}
        if self.metrics_port == self.port != 0 and (len(hosts) == 1 or hosts & _WILDCARD_HOSTS):
            raise ExtenderConfigError(
                f"metrics-port {self.metrics_port} is also port on {self.host}: the verbs and "
                "the metrics listener need a port each"
            )


_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def is_ip_or_localhost(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# The leader-lease value that says "exactly one extender runs": binds are then never gated.
SINGLE_INSTANCE = "none"


def resolve_leader_lease(value: str | None) -> str | None:
    """``namespace/name`` stays; ``none`` is None (no gate); unset is an error.

    There is no silent default: an extender without a lease binds whenever asked, so two of
    them (a second control-plane node, a rolling update, a copied config) each hand out the
    same cards. Running unguarded has to be said out loud."""
    if value is None or not value.strip():
        raise ExtenderConfigError(
            "leader-lease is not set: give the namespace/name of the Lease that the "
            "kube-scheduler calling this extender elects its leader with (kube-system/"
            "kube-scheduler for the default scheduler), or 'none' if exactly one extender "
            "can ever run"
        )
    if value.strip().lower() == SINGLE_INSTANCE:
        return None
    return value.strip()


def load_config_file(path: Path, known: Collection[str]) -> dict[str, Any]:
    """A versioned YAML file as option defaults (keys are the long flag names, ``known``).

    An unknown key is an error naming the nearest known one: silently ignored, ``polcy:`` or
    ``leader-leese:`` would run with the default, and the latter would bind with no leader
    guard at all."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ExtenderConfigError(f"{path}: not UTF-8 text (byte offset {exc.start})") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ExtenderConfigError(f"{path}: cannot read ({exc})") from None
    if not isinstance(doc, dict):
        raise ExtenderConfigError(f"{path}: must be a mapping")
    if doc.get("apiVersion") != CONFIG_API_VERSION or doc.get("kind") != CONFIG_KIND:
        raise ExtenderConfigError(
            f"{path}: apiVersion/kind must be {CONFIG_API_VERSION}/{CONFIG_KIND}, got "
            f"{doc.get('apiVersion')!r}/{doc.get('kind')!r}"
        )
    settings = doc.get("settings") or {}
    if not isinstance(settings, dict):
        raise ExtenderConfigError(f"{path}: settings must be a mapping")
    keys = sorted(k.replace("_", "-") for k in known)
    for key in settings:
        if str(key).replace("_", "-") not in keys:
            close = difflib.get_close_matches(str(key).replace("_", "-"), keys, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(keys)}"
            raise ExtenderConfigError(f"{path}: settings: unknown key {key!r} ({hint})")
    return {str(k).replace("-", "_"): v for k, v in settings.items()}


def load_workload(path: Path) -> TypicalWorkload:
    """A target workload for FGD/kubegpu: YAML ``pods: [{cpuMilli, gpuMilli, gpuCount,
    weight, models?}]`` (``gpuMilli`` per card; whole cards are 1000)."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ExtenderConfigError(
            f"workload file {path}: not UTF-8 text (byte offset {exc.start})"
        ) from None
    except (OSError, yaml.YAMLError) as exc:
        raise ExtenderConfigError(f"workload file {path}: cannot read ({exc})") from None
    pods = doc.get("pods") if isinstance(doc, dict) else None
    if not isinstance(pods, list) or not pods:
        raise ExtenderConfigError(f"workload file {path}: needs a non-empty 'pods' list")
    weighted: list[tuple[PodRequest, float]] = []
    for i, item in enumerate(pods):
        try:
            request = PodRequest(
                int(item["cpuMilli"]),
                0,
                int(item.get("gpuCount", 1 if int(item.get("gpuMilli", 0)) else 0)),
                int(item.get("gpuMilli", 0)),
                None,
                frozenset(model_key(str(m)) for m in item.get("models") or ()),
            )
            weight = float(item["weight"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ExtenderConfigError(f"workload file {path}: pods[{i}]: {exc}") from None
        if weight <= 0:
            raise ExtenderConfigError(f"workload file {path}: pods[{i}]: weight must be > 0")
        weighted.append((request, weight))
    return TypicalWorkload.from_weights(weighted)
