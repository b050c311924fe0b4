"""Names vulture reports as unused that are used, each with the reason it cannot see the use.

Read by ``tests/test_dead_code.py`` (never imported). vulture counts a name as used when it
appears anywhere in the scanned files, so each line below marks one name used.
"""

from vulture.whitelist_utils import Whitelist  # type: ignore[import-untyped]

_ = Whitelist()

USED_WHERE_VULTURE_CANNOT_SEE = (
    # http.server.BaseHTTPRequestHandler calls these overrides by name.
    _.log_message,
    _.do_GET,
    # click calls a ClickException's show() to print it (cli/main.py's one-line failures).
    _.show,
    # The console script of pyproject.toml's [project.scripts] (kubectl plugin).
    _.kubectl_gpu_main,
    _.kubectl_inspect_gpushare_main,
    # pynvml functions the NVML backend calls by name through ``_optional(nvml, "…")``; the
    # scripted stand-in of tests/inventory/scripted_nvml.py defines them for that.
    _.nvmlSystemGetDriverVersion,
    _.nvmlSystemGetCudaDriverVersion_v2,
    _.nvmlDeviceGetCudaComputeCapability,
    _.nvmlDeviceGetNumaNodeId,
    _.nvmlDeviceGetMigMode,
    _.nvmlDeviceGetBrand,
    _.nvmlDeviceGetArchitecture,
    _.nvmlDeviceGetNvLinkState,
    _.nvmlDeviceGetNvLinkRemotePciInfo,
    _.nvmlDeviceGetNvLinkRemoteDeviceType,
    _.nvmlDeviceGetTopologyCommonAncestor,
)
