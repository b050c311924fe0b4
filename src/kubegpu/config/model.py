"""The node agent's versioned configuration file (``version: v1``) as validated models.

The shape follows NVIDIA's device plugin config (``flags``, ``flags.plugin``,
``sharing.timeSlicing``, ``resources.gpus``) wherever the concepts match, so a user can carry
their file over; what NVIDIA parses and then silently ignores (per-resource ``rename`` and
``devices``, custom resource names) is honoured here. Every model forbids unknown fields, so a
typo is an error naming the field instead of a silently ignored setting.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

DEFAULT_VENDOR_DOMAIN = "nvidia.com"
DEFAULT_RESOURCE = "nvidia.com/gpu"
# Under flags.migStrategy mixed each MIG profile is its own resource, named as NVIDIA's device
# plugin names it: this prefix, then the profile with "+" as "." (nvidia.com/mig-1g.10gb.me).
MIG_RESOURCE_PREFIX = f"{DEFAULT_VENDOR_DOMAIN}/mig-"

DeviceListStrategy = Literal["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]
ENVVAR_ONLY: list[DeviceListStrategy] = ["envvar"]
CDI_STRATEGIES: frozenset[str] = frozenset({"cdi-annotations", "cdi-cri"})

# Name part of an extended resource: a DNS-1123-ish label with dots, at most 63 characters.
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# Binding one of these takes the port on every address.
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
_DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# The largest value each number of the config (and of the flags that share its meaning) may
# take. Every number has a maximum as well as a minimum: an unbounded interval is a timer that
# never fires, an unbounded count a list that is built until memory runs out. tests/config
# fails on a numeric field without both bounds; docs/configuration.md shows them.
MAX_INTERVAL_S = 86_400.0  # a day, for every background interval
MAX_RESTART_DELAY_S = 3_600.0  # the MPS daemon's restart back-off
MAX_EXPORTER_INTERVAL_S = 3_600.0  # data older than an hour is no metric
MAX_READ_TIMEOUT_S = 600.0  # one NVML read
# GPUs of one node: counts 1..1024, indices 0..1023 (the largest machines have 16 or so).
MAX_GPUS_PER_NODE = 1024
MAX_REPLICAS = 1024  # time-slicing replicas (device ids) per GPU
MAX_SLOTS_PER_CARD = 1024  # containers sharing one card
MAX_XID = 65_535  # Xid codes are small numbers (under 200 so far)
MAX_HEALTHY_CHECKS = 1_000_000  # about 55 hours of 0.2 s health checks
# MiB in one volcano.sh/gpu-memory: one unit may not be more than the largest card (256 GiB).
MAX_VOLCANO_MEMORY_FACTOR = 262_144


def parse_listen_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` as ``(host, port)``: ``127.0.0.1:9401``, ``[::1]:9401``, or ``:9401`` for
    every interface. Port 0 picks a free port (tests). Raises ValueError naming the value."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT (e.g. 0.0.0.0:9401), got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def qualify_resource_name(name: str) -> str:
    """``gpu`` → ``nvidia.com/gpu`` (NVIDIA's convention); full names are checked as the kubelet
    does for extended resources: a domain that is not ``kubernetes.io``, no ``requests.``."""
    full = name if "/" in name else f"{DEFAULT_VENDOR_DOMAIN}/{name}"
    domain, _, part = full.partition("/")
    if (
        not _DOMAIN.match(domain)
        or domain == "kubernetes.io"
        or domain.endswith(".kubernetes.io")
        or full.startswith("requests.")
        or not _NAME_PART.match(part)
    ):
        raise ValueError(f"not a valid extended resource name: {name!r}")
    return full


def check_devices(value: object) -> object:
    """``devices``: a count of 1 to :data:`MAX_GPUS_PER_NODE`, or indices below it (and
    UUIDs)."""
    if isinstance(value, int) and not 1 <= value <= MAX_GPUS_PER_NODE:
        raise ValueError(f"a device count must be 1 to {MAX_GPUS_PER_NODE}")
    if isinstance(value, list):
        for item in value:
            if isinstance(item, int) and not 0 <= item < MAX_GPUS_PER_NODE:
                raise ValueError(f"a device index must be 0 to {MAX_GPUS_PER_NODE - 1}, got {item}")
    return value


def check_xids(value: list[int]) -> list[int]:
    for xid in value:
        if not 0 <= xid <= MAX_XID:
            raise ValueError(f"an Xid must be 0 to {MAX_XID}, got {xid}")
    return value


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        # An interval of .nan or .inf would never fire (or compare false everywhere).
        allow_inf_nan=False,
    )


class PluginFlags(_Model):
    pass_device_specs: bool = Field(
        default=False,
        description="Also return device specs for `/dev/nvidiactl`, `/dev/nvidia-uvm`, "
        "`/dev/nvidia-uvm-tools` and each GPU's `/dev/nvidiaN` (under `devRoot` on the host).",
    )
    device_list_strategy: list[DeviceListStrategy] = Field(
        default_factory=lambda: ENVVAR_ONLY[:],
        description="How `Allocate` names the GPUs: `envvar` sets `NVIDIA_VISIBLE_DEVICES`; "
        "`volume-mounts` mounts `/dev/null` at `/var/run/nvidia-container-devices/<id>`; "
        "`cdi-cri` returns CDI device names; `cdi-annotations` returns them as a pod "
        "annotation under `cdiAnnotationPrefix`. A `cdi-*` strategy also writes a CDI spec "
        "into `cdiDir`.",
    )
    device_id_strategy: Literal["uuid", "index"] = Field(
        default="uuid",
        # NVIDIA spells it with a capital ID, which the camelCase generator would not produce.
        alias="deviceIDStrategy",
        description="What containers see in the device list: GPU UUIDs or indices.",
    )
    cdi_annotation_prefix: str = Field(
        default="cdi.k8s.io/",
        description="Prefix of the pod annotation keys `Allocate` returns with the "
        "`cdi-annotations` device list strategy.",
    )
    cdi_dir: str = Field(
        default="/var/run/cdi",
        description="Where the CDI spec file goes when a `cdi-*` device list strategy is on. "
        "Rewritten atomically at start and on every config change, and kept when the agent "
        "stops, so a container restarted meanwhile still resolves its CDI names.",
    )
    cdi_kind: str = Field(
        default="k8s.kubegpu.io/gpu",
        description="The CDI spec's vendor/class, also the prefix of every CDI device name "
        "`Allocate` returns. A kind of our own, as NVIDIA's plugin has "
        "`k8s.device-plugin.nvidia.com/gpu`: nvidia-ctk and the GPU operator write a spec of "
        "kind `nvidia.com/gpu` into the same directory, and two specs defining the same "
        "device names conflict, so the runtime resolves neither.",
    )
    dev_root: str = Field(
        default="/",
        description="Host root under which device nodes live (a containerised driver puts "
        "them elsewhere).",
    )
    shared_devices_allocation_policy: Literal["distributed", "packed"] = Field(
        default="distributed",
        description="Which time-slicing replicas `GetPreferredAllocation` prefers: "
        "`distributed` takes from the least used GPU first, `packed` fills the busiest GPU "
        "first.",
    )
    pre_start_container: bool = Field(
        default=False,
        description="Ask the kubelet to call PreStartContainer (a no-op that logs) before "
        "every start.",
    )

    @field_validator("device_list_strategy", mode="before")
    @classmethod
    def _accept_string(cls, value: object) -> object:
        # NVIDIA accepts one string, a comma list, or a YAML list.
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("device_list_strategy")
    @classmethod
    def _not_empty(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one device list strategy is required")
        return list(dict.fromkeys(value))

    @field_validator("cdi_kind")
    @classmethod
    def _vendor_class(cls, value: str) -> str:
        vendor, _, klass = value.partition("/")
        if not vendor or not klass or "/" in klass or "=" in value:
            raise ValueError(f"CDI kind must look like vendor.com/class, got {value!r}")
        return value


class Flags(_Model):
    mig_strategy: Literal["none", "single", "mixed"] = Field(
        default="none",
        description="How cards in MIG mode are advertised, as NVIDIA's `--mig-strategy` "
        "(docs/mig.md): `none` advertises them as whole GPUs; `single` advertises their MIG "
        "devices as `nvidia.com/gpu`, and refuses to start unless every card is in MIG mode "
        "with MIG devices of one type; `mixed` advertises each profile as its own resource "
        "(`nvidia.com/mig-1g.10gb`, `nvidia.com/mig-3g.40gb`, ...) beside the cards not in "
        "MIG mode. Under `single` and `mixed` a card in MIG mode is neither a whole GPU nor "
        "shared (`sharing.gpuShare`, peer compat modes).",
    )
    fail_on_init_error: bool = Field(
        default=True,
        description="When the GPU backend cannot be opened: `true` exits 1; `false` logs the "
        "error and idles until stopped (for nodes without usable GPUs).",
    )
    health_listen: str = Field(
        default="",
        description="HOST:PORT (e.g. `0.0.0.0:9401`) where the agent serves the kubelet's "
        "probes: `/healthz` is 200 while its event loop and every resource's gRPC server "
        "answer, `/readyz` while every resource is registered with the running kubelet; 503 "
        "with the reason otherwise. Empty = off, the default, so several agents on one "
        "machine (`kubegpu demo`) never collide.",
    )
    plugin: PluginFlags = Field(
        default_factory=PluginFlags,
        description="Settings shaped like NVIDIA's `flags.plugin`.",
    )

    @field_validator("health_listen")
    @classmethod
    def _listen_address(cls, value: str) -> str:
        if value:
            parse_listen_address(value)
        return value


class GpuResource(_Model):
    """GPUs whose product name matches ``pattern`` (shell glob) are advertised as ``name``."""

    pattern: str = Field(
        default="*",
        description="Shell glob matched against the GPU's product name (e.g. `*A100*`); the "
        "first matching entry wins.",
    )
    name: str = Field(
        description="Extended resource name for the matching GPUs; a bare name gets `nvidia.com/`."
    )

    @field_validator("name")
    @classmethod
    def _qualify(cls, value: str) -> str:
        return qualify_resource_name(value)


class Resources(_Model):
    gpus: list[GpuResource] = Field(
        default_factory=lambda: [GpuResource(pattern="*", name=DEFAULT_RESOURCE)],
        description="Product-name patterns and the resource each matching GPU is advertised "
        "as; the first matching entry wins, a GPU matching none is not advertised.",
    )

    @field_validator("gpus")
    @classmethod
    def _not_empty(cls, value: list[GpuResource]) -> list[GpuResource]:
        if not value:
            raise ValueError("at least one GPU resource is required")
        return value


class SharedResource(_Model):
    name: str = Field(description="A resource from `resources.gpus` to time-slice.")
    replicas: int = Field(
        ge=1,
        le=MAX_REPLICAS,
        description="Device ids advertised per GPU (`<uuid>::0` ... `<uuid>::N-1`); nothing "
        "limits what each replica's container uses.",
    )
    rename: str | None = Field(
        default=None,
        description="Advertise the replicas under this name instead (the GPUs leave the "
        "original name).",
    )
    devices: Literal["all"] | int | list[int | str] = Field(
        default="all",
        description="`all`, the first N GPUs by index, or a list of indices / UUIDs; anything "
        "but `all` needs `rename` or `renameByDefault`.",
    )

    @field_validator("name", "rename")
    @classmethod
    def _qualify(cls, value: str | None) -> str | None:
        return None if value is None else qualify_resource_name(value)

    @field_validator("devices")
    @classmethod
    def _positive_count(cls, value: object) -> object:
        return check_devices(value)


class TimeSlicing(_Model):
    rename_by_default: bool = Field(
        default=False,
        description="Advertise every time-sliced resource as `<name>.shared` unless it has "
        "its own `rename`.",
    )
    fail_requests_greater_than_one: bool = Field(
        default=False,
        description="Refuse (`Allocate` error) a container asking for more than one replica "
        "of a time-sliced resource, as NVIDIA's option of the same name does.",
    )
    resources: list[SharedResource] = Field(
        default_factory=list, description="Which resources are time-sliced, and how many ways."
    )


class MpsSettings(_Model):
    """The CUDA MPS control daemon the agent runs for the shared cards (enforcement: mps)."""

    control_command: str = Field(
        default="nvidia-cuda-mps-control",
        description="Path or name of nvidia-cuda-mps-control; tests point it at a fake daemon "
        "script.",
    )
    control_args: list[str] = Field(
        default_factory=lambda: ["-f"],
        description="-f keeps the daemon in the foreground, so the agent sees it die and "
        "restarts it; with -d it forks away and its death could not be noticed.",
    )
    host_dir: str = Field(
        default="/run/kubegpu/mps",
        description="Host directory holding pipe/ and log/; containers get both mounted at "
        "the same path.",
    )
    restart_initial_s: float = Field(
        default=0.5,
        gt=0,
        le=MAX_RESTART_DELAY_S,
        description="First delay before restarting an MPS control daemon that exited "
        "(seconds; doubles).",
    )
    restart_max_s: float = Field(
        default=30.0,
        gt=0,
        le=MAX_RESTART_DELAY_S,
        description="Longest restart delay for the MPS daemon (seconds).",
    )


class PeerCompat(_Model):
    """Pods written for another GPU-share system run unchanged (docs/sharing.md, "Compat modes").

    ``volcano``: ``volcano.sh/gpu-memory`` (MiB × ``volcanoMemoryFactor``) is a share; the node
    shows ``volcano.sh/gpu-memory`` (and ``volcano.sh/gpu-number`` as 0: whole cards are
    ``nvidia.com/gpu``); containers get ``VOLCANO_GPU_TOTAL``, ``VOLCANO_GPU_MEMORY_TOTAL`` and
    ``VOLCANO_GPU_ALLOCATED``. ``aliyun``: ``aliyun.com/gpu-mem`` (in ``aliyunMemoryUnit``) is a
    share; the node shows ``aliyun.com/gpu-mem`` (and ``aliyun.com/gpu-count`` as 0);
    containers get ``ALIYUN_COM_GPU_MEM_IDX``, ``_POD``, ``_CONTAINER`` and ``_DEV``. The peer
    webhook (``kubegpu peer-webhook``) refuses the peers' resources kubegpu does not serve
    at creation; it and the extender must run with the same modes.
    """

    modes: list[Literal["volcano", "aliyun"]] = Field(
        default_factory=list,
        description="Peers whose pods are served: `volcano`, `aliyun`; empty = none (peer "
        "resources ignored).",
    )
    aliyun_memory_unit: Literal["GiB", "MiB"] = Field(
        default="GiB", description="Gpushare's --memory-unit: what one aliyun.com/gpu-mem is."
    )
    volcano_memory_factor: int = Field(
        default=1,
        ge=1,
        le=MAX_VOLCANO_MEMORY_FACTOR,
        description="Volcano's --gpu-memory-factor: MiB in one volcano.sh/gpu-memory.",
    )
    compute_milli: int = Field(
        default=1,
        ge=1,
        le=999,
        description="Compute a peer container's share holds, in milli-GPU: the peers reserve "
        "none; 1 lets as many peer pods share a card as its memory allows. With `enforcement: "
        "mps` it is also the container's SM share (at least 1 %): raise it there.",
    )

    @field_validator("modes")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))


class GpuShare(_Model):
    """Card-level GPU sharing with the kubegpu scheduler extender (see docs/sharing.md).

    The agent advertises ``slots_per_card`` share slots of ``resource_name`` per selected card
    next to the whole-GPU resource; the extender decides which card a sharing pod gets and
    records it on the pod, and ``Allocate`` hands out that card. Needs API access
    (``--kubeconfig`` or in-cluster) and ``--node-name``.
    """

    enabled: bool = Field(
        default=False,
        description="Advertise share slots next to the whole GPUs and serve the extender's "
        "decisions. Needs API access (`--kubeconfig` or in-cluster) and `--node-name`, else "
        "exit 2.",
    )
    resource_name: str = Field(
        default="kubegpu.io/gpu-shared",
        description="The share-slot resource advertised per card (one slot per sharing container).",
    )
    memory_resource_name: str = Field(
        default="kubegpu.io/gpu-memory",
        description="GPU memory in MiB that pods request; accounted by the extender only, "
        "never advertised by the node.",
    )
    compute_resource_name: str = Field(
        default="kubegpu.io/gpu-compute",
        description="Compute in milli-GPU (1000 = one card) that pods request; accounted by "
        "the extender only, never advertised by the node.",
    )
    whole_resource_name: str = Field(
        default=DEFAULT_RESOURCE,
        description="The whole-GPU resource the extender accounts against (one of resources.gpus).",
    )
    slots_per_card: int = Field(
        default=32,
        ge=1,
        le=MAX_SLOTS_PER_CARD,
        description="Containers sharing one card at once; the kubelet counts slots, the "
        "extender counts MiB.",
    )
    devices: Literal["all"] | int | list[int | str] = Field(
        default="all",
        description="Which cards offer share slots: `all`, the first N by index, or a list of "
        "indices / UUIDs.",
    )
    enforcement: Literal["none", "mps"] = Field(
        default="none",
        description="`none`: the container is told its share in environment variables and "
        "nothing holds it to it (trust-based). `mps`: the agent runs the CUDA MPS control "
        "daemon and sets per-client memory and thread limits.",
    )
    mps: MpsSettings = Field(
        default_factory=MpsSettings,
        description="The CUDA MPS control daemon run for `enforcement: mps`.",
    )
    sync_interval_s: float = Field(
        default=5.0,
        gt=0,
        le=MAX_INTERVAL_S,
        description="The agent watches its node's pods (to withdraw colliding ids, whole vs "
        "shared); after a failed watch it retries after this times the failures in a row (at "
        "most ten times it), and without RBAC to watch it lists the pods this often instead.",
    )
    reconcile_interval_s: float = Field(
        default=30.0,
        gt=0,
        le=MAX_INTERVAL_S,
        description="How often the kubelet's PodResources API is cross-checked against the pod "
        "annotations.",
    )
    inventory_interval_s: float = Field(
        default=300.0,
        gt=0,
        le=MAX_INTERVAL_S,
        description="How often the node's GPU inventory annotation is re-asserted (also on "
        "start and health).",
    )
    pod_resources_socket: str = Field(
        default="/var/lib/kubelet/pod-resources/kubelet.sock",
        description="The kubelet's PodResources API socket, used to reconcile which pod got "
        "which card.",
    )
    compat: PeerCompat = Field(
        default_factory=PeerCompat,
        description="Peer compat modes (Volcano, Aliyun gpushare): their pods' resources read "
        "as shares.",
    )

    @field_validator("resource_name", "memory_resource_name", "compute_resource_name")
    @classmethod
    def _qualify(cls, value: str) -> str:
        if "/" not in value:
            raise ValueError(f"a share resource needs a domain (e.g. kubegpu.io/x), got {value!r}")
        return qualify_resource_name(value)

    @field_validator("whole_resource_name")
    @classmethod
    def _qualify_whole(cls, value: str) -> str:
        return qualify_resource_name(value)

    @field_validator("devices")
    @classmethod
    def _positive_count(cls, value: object) -> object:
        return check_devices(value)


class Sharing(_Model):
    time_slicing: TimeSlicing = Field(
        default_factory=TimeSlicing,
        description="NVIDIA-style time-slicing: several device ids per GPU, no limits.",
    )
    gpu_share: GpuShare = Field(default_factory=GpuShare)


class Health(_Model):
    """Health-check knobs; NVIDIA's ``DP_DISABLE_HEALTHCHECKS`` / ``DP_ENABLE_HEALTHCHECKS``
    environment variables are honoured on top of these."""

    disabled: bool = Field(
        default=False,
        description="Turn health checking off: every GPU stays Healthy whatever happens.",
    )
    xid_policy: Literal["catalog", "nvidia-device-plugin"] = Field(
        default="catalog",
        description="Which Xids are critical before `ignoredXids`, `criticalXids` and NVIDIA's "
        "`DP_*_HEALTHCHECKS` apply: `catalog` follows NVIDIA's Xid catalog (docs/xid-policy.md: "
        "Xids that only need the application restarted pass, those that need a node reboot "
        "keep the GPU unhealthy until the agent restarts); `nvidia-device-plugin` is NVIDIA's "
        "device plugin's rule (13, 31, 43, 45, 68 and 109 pass, every other Xid is critical).",
    )
    ignored_xids: list[int] = Field(
        default_factory=list,
        description="Xids ignored in addition to those `xidPolicy` lets pass.",
    )
    critical_xids: list[int] = Field(
        default_factory=list,
        description="Xids treated as fatal even when ignored by default or above.",
    )
    recover_after_healthy_checks: int | None = Field(
        default=None,
        ge=1,
        le=MAX_HEALTHY_CHECKS,
        description="Report a GPU Healthy again after this many consecutive health checks "
        "without a critical event (not for a lost GPU: that needs the device back; nor after "
        "an Xid that needs a node reboot under `xidPolicy`); None = never, as NVIDIA. A check "
        "is one wait for GPU events of 0.2 s, shorter when a non-critical event ends it, so 300 "
        "checks are at most a minute without a critical Xid.",
    )

    @field_validator("ignored_xids", "critical_xids")
    @classmethod
    def _xids(cls, value: list[int]) -> list[int]:
        return check_xids(value)


class Exporter(_Model):
    """The Prometheus exporter run inside the node agent: the same ``/metrics`` and ``/healthz``
    as ``kubegpu exporter``, read through the agent's GPU backend, with GPU health and Xid
    counts from the agent's own health monitor. Off by default; when off nothing of it is
    loaded. With health checks disabled (``health.disabled`` or
    ``DP_DISABLE_HEALTHCHECKS=all``) the agent watches no GPU events, so the Xid counters stay
    at zero; a separate ``kubegpu exporter`` watches its own."""

    enabled: bool = Field(
        default=False,
        description="Serve the exporter from the agent; off, none of its modules (nor "
        "prometheus_client) load.",
    )
    listen: str = Field(
        default="127.0.0.1:9400",
        description="HOST:PORT for /metrics and /healthz (the DaemonSet uses `0.0.0.0:9400`).",
    )
    interval_s: float = Field(
        default=10.0,
        gt=0,
        le=MAX_EXPORTER_INTERVAL_S,
        description="Seconds between background refreshes; a scrape only reads the latest one.",
    )
    read_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=MAX_READ_TIMEOUT_S,
        description="Longest wait for one NVML read; the last snapshot is served meanwhile.",
    )
    pod_resources_socket: str = Field(
        default="/var/lib/kubelet/pod-resources/kubelet.sock",
        description="The kubelet's PodResources socket, for which container holds which GPU; "
        '"" = do not ask (per-pod metrics are then absent).',
    )
    pod_directory: Literal["logs", "api"] = Field(
        default="logs",
        description="Where pod names come from: `logs` (the kubelet's pod log directory, no "
        "API access) or `api` (the node's pods from the API server, which also gives shared "
        "pods' shares for kubegpu_pod_gpu_over_share; needs API access).",
    )
    pod_log_dir: str = Field(
        default="/var/log/pods",
        description="The kubelet's pod log root, for podDirectory: logs.",
    )
    proc: str = Field(
        default="/proc",
        description="Procfs root in which GPU processes' cgroups are read (the host's: mount "
        "it, e.g. at /host/proc, or run with hostPID).",
    )

    @field_validator("listen")
    @classmethod
    def _listen_address(cls, value: str) -> str:
        parse_listen_address(value)
        return value


class DraSteering(_Model):
    """Steering DRA's first fit (docs/dra.md, "Steering"): the driver lists its devices in the
    order that serves the target workload's shares best under 07-Kubegpu's card choice."""

    workload_file: str | None = Field(
        default=None,
        description="The target workload, the same YAML file as the extender's "
        "`workload-file` (`pods: [{cpuMilli, gpuMilli, gpuCount, weight}]`; its single-card "
        "shares are what the order serves). Unset: no steering, devices in GPU index order.",
    )
    interval_s: float = Field(
        default=5.0,
        gt=0,
        le=MAX_INTERVAL_S,
        description="How often the driver reads the claims allocated from its pool (one list "
        "of all ResourceClaims) and re-publishes its ResourceSlice if the order changed: at "
        "most once per interval.",
    )


class Dra(_Model):
    """The DRA driver (`kubegpu dra-driver`, docs/dra.md), used with `gpuAllocation: dra`."""

    enforcement: Literal["none", "mps"] = Field(
        default="none",
        description="`mps`: a shared claim's container is held to its share by the CUDA MPS "
        "daemon the driver runs (same supervisor and settings as sharing.gpuShare.mps); "
        "`none`: accounting only.",
    )
    mps: MpsSettings = Field(
        default_factory=MpsSettings,
        description="The DRA driver's own MPS daemon, one per node for all its GPUs; same keys "
        "as sharing.gpuShare.mps, whose daemon it replaces on a DRA node.",
    )
    steering: DraSteering = Field(default_factory=DraSteering)
    naming: Literal["kubegpu", "nvidia"] = Field(
        default="kubegpu",
        description="`kubegpu`: driver and DeviceClasses gpu.kubegpu.io; `nvidia`: publish as "
        "NVIDIA's DRA driver does (driver and DeviceClass gpu.nvidia.com, its attribute names "
        "and formats), so claims and CEL selectors written for it run unchanged. Refused on a "
        "node where NVIDIA's own driver serves gpu.nvidia.com. The extender's --dra-naming "
        "must say the same (docs/migrate-nvidia.md).",
    )
    mig: Literal["static", "dynamic"] = Field(
        default="static",
        description="Cards in MIG mode (docs/mig.md). `static`: each GPU instance the card "
        "holds is a device (the admin partitions the card); `dynamic`: every placement the "
        "card's profiles allow is a device over a shared counter set (Kubernetes partitionable "
        "devices, on by default from 1.36, the DRAPartitionableDevices gate before), and the "
        "driver creates the instance when a claim is prepared and destroys it on unprepare; "
        "instances no prepared claim holds are destroyed at start.",
    )


class AgentConfig(_Model):
    version: Literal["v1"] = Field(
        default="v1", description="Config schema version; the only one is `v1`."
    )
    flags: Flags = Field(
        default_factory=Flags,
        description="Settings shaped like NVIDIA's device plugin `flags`.",
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="Which GPUs are advertised under which extended resource name.",
    )
    sharing: Sharing = Field(
        default_factory=Sharing,
        description="Time-slicing (NVIDIA-compatible) and card-level sharing with the extender.",
    )
    health: Health = Field(default_factory=Health)
    exporter: Exporter = Field(default_factory=Exporter)
    gpu_allocation: Literal["devicePlugin", "dra"] = Field(
        default="devicePlugin",
        description="Who hands this node's GPUs to pods: `devicePlugin` (kubegpu "
        "device-plugin) or `dra` (kubegpu dra-driver). Never both: each refuses to start when "
        "this names the other.",
    )
    dra: Dra = Field(default_factory=Dra)

    @model_validator(mode="after")
    def _shared_resources_exist(self) -> AgentConfig:
        known = {r.name for r in self.resources.gpus}
        mixed = self.flags.mig_strategy == "mixed"
        seen: set[str] = set()
        for i, shared in enumerate(self.sharing.time_slicing.resources):
            where = f"sharing.timeSlicing.resources.{i}"
            # Under mixed a MIG profile's resource may be time-sliced too, as with NVIDIA's.
            mig_resource = mixed and shared.name.startswith(MIG_RESOURCE_PREFIX)
            if shared.name not in known and not mig_resource:
                raise ValueError(
                    f"{where}.name: {shared.name!r} is not one of the GPU resources {sorted(known)}"
                    + (
                        " (a MIG profile's resource needs flags.migStrategy: mixed)"
                        if shared.name.startswith(MIG_RESOURCE_PREFIX)
                        else ""
                    )
                )
            if shared.name in seen:
                raise ValueError(f"{where}.name: {shared.name!r} is shared twice")
            seen.add(shared.name)
            share = self.sharing.gpu_share
            if share.enabled and shared.name == share.whole_resource_name:
                raise ValueError(
                    f"{where}.name: {shared.name!r} is time-sliced and also the whole-GPU "
                    "resource of sharing.gpuShare; card-level sharing needs whole cards"
                )
            renamed = shared.rename is not None or self.sharing.time_slicing.rename_by_default
            if shared.devices != "all" and not renamed:
                # Otherwise shared and unshared GPUs would mix under one resource name.
                raise ValueError(
                    f"{where}.devices: sharing a subset of GPUs needs rename or renameByDefault"
                )
        share = self.sharing.gpu_share
        if share.enabled and share.whole_resource_name not in known:
            raise ValueError(
                f"sharing.gpuShare.wholeResourceName: {share.whole_resource_name!r} is not one of "
                f"the GPU resources {sorted(known)}"
            )
        if share.compat.modes and not share.enabled:
            raise ValueError(
                "sharing.gpuShare.compat.modes: compat modes serve peer pods as shares; set "
                "sharing.gpuShare.enabled: true"
            )
        if share.enabled and share.resource_name in known:
            raise ValueError(
                f"sharing.gpuShare.resourceName: {share.resource_name!r} is already a GPU resource"
            )
        if mixed and share.enabled and share.enforcement == "mps":
            # NVIDIA's device plugin refuses the same pair at start.
            raise ValueError(
                "flags.migStrategy: using --mig-strategy=mixed is not supported with MPS "
                "(sharing.gpuShare.enforcement: mps)"
            )
        exporter = self.exporter
        if exporter.enabled and self.flags.health_listen:
            (metrics_host, metrics_port), (probes_host, probes_port) = (
                parse_listen_address(exporter.listen),
                parse_listen_address(self.flags.health_listen),
            )
            hosts = {metrics_host, probes_host}
            if metrics_port == probes_port != 0 and (len(hosts) == 1 or hosts & _WILDCARD_HOSTS):
                raise ValueError(
                    f"exporter.listen: {exporter.listen!r} is also flags.healthListen; the "
                    "metrics and the health endpoints need a port each"
                )
        return self

    @property
    def uses_cdi(self) -> bool:
        return bool(CDI_STRATEGIES & set(self.flags.plugin.device_list_strategy))
