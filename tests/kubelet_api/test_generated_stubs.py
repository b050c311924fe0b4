"""The committed kubelet API modules are fresh and wire-compatible with upstream."""

from __future__ import annotations

import difflib
import re
import shutil
import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from kubegpu.kubelet import protogen
from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from kubegpu.kubelet.api.podresources.v1 import api_pb2 as pr
from kubegpu.kubelet.api.podresources.v1 import api_pb2_grpc as pr_grpc

# Version stamps protoc / grpcio-tools embed; they change with the tool version, not the protos.
_PROTOBUF_VERSION_COMMENT = re.compile(r"^# Protobuf Python Version: .*$", re.MULTILINE)
_RUNTIME_VERSION_ARGS = re.compile(
    r"(ValidateProtobufRuntimeVersion\(\n\s*_runtime_version\.Domain\.PUBLIC,\n)"
    r"\s*\d+,\n\s*\d+,\n\s*\d+,\n\s*'[^']*',\n"
)
_GRPC_GENERATED_VERSION = re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.MULTILINE)


def without_version_stamps(text: str) -> str:
    text = _PROTOBUF_VERSION_COMMENT.sub("# Protobuf Python Version: <stamp>", text)
    text = _RUNTIME_VERSION_ARGS.sub(r"\1    <stamp>\n", text)
    return _GRPC_GENERATED_VERSION.sub("GRPC_GENERATED_VERSION = '<stamp>'", text)


def test_version_stamp_normalisation_removes_only_the_stamp_lines() -> None:
    pb2 = (protogen.SOURCE_ROOT / protogen.PROTO_FILES[0]).with_name("api_pb2.py").read_text()
    grpc_py = (protogen.SOURCE_ROOT / protogen.PROTO_FILES[0]).with_name("api_pb2_grpc.py")
    for text, expected in [(pb2, 5), (grpc_py.read_text(), 1)]:
        diff = difflib.ndiff(text.splitlines(), without_version_stamps(text).splitlines())
        removed = [line[2:] for line in diff if line.startswith("- ")]
        assert len(removed) == expected
        stamp = re.compile(
            r"^(# Protobuf Python Version: .*|\s+\d+,|\s+'[^']*',|GRPC_GENERATED_VERSION = .*)$"
        )
        assert all(stamp.match(line) for line in removed), removed


@pytest.mark.timeout(120)
def test_committed_stubs_match_a_fresh_generation() -> None:
    """Regenerate into a temp dir and compare every generated file with the committed one.

    The comparison ignores exactly the version stamps: the ``# Protobuf Python Version:``
    comment and the four version arguments of ``ValidateProtobufRuntimeVersion(...)`` in
    ``*_pb2.py``, and the ``GRPC_GENERATED_VERSION = '...'`` line in ``*_pb2_grpc.py``. CI may
    install a newer grpcio-tools than the one that generated the committed files; anything
    else that differs means the stubs are stale: run ``python -m kubegpu.kubelet.protogen``.
    """
    out = Path(tempfile.mkdtemp(prefix="kg-protogen-"))
    try:
        # The documented command, pointed at a temp dir.
        assert protogen.main(["--out", str(out)]) == 0
        fresh = protogen.generated_files(out)
        committed = protogen.generated_files(protogen.SOURCE_ROOT)
        assert [p.relative_to(out) for p in fresh] == [
            p.relative_to(protogen.SOURCE_ROOT) for p in committed
        ]
        stale = [
            str(c.relative_to(protogen.SOURCE_ROOT))
            for f, c in zip(fresh, committed, strict=True)
            if without_version_stamps(f.read_text()) != without_version_stamps(c.read_text())
        ]
        assert stale == [], (
            f"stale generated files, run python -m kubegpu.kubelet.protogen: {stale}"
        )
    finally:
        shutil.rmtree(out, ignore_errors=True)


STRING = FieldDescriptor.TYPE_STRING
BOOL = FieldDescriptor.TYPE_BOOL
INT32 = FieldDescriptor.TYPE_INT32
INT64 = FieldDescriptor.TYPE_INT64
UINT64 = FieldDescriptor.TYPE_UINT64
MESSAGE = FieldDescriptor.TYPE_MESSAGE

# (message, field, number, type, repeated, message type full name or None), from the fact sheet.
WIRE_FIELDS = [
    (dp.RegisterRequest, "version", 1, STRING, False, None),
    (dp.RegisterRequest, "endpoint", 2, STRING, False, None),
    (dp.RegisterRequest, "resource_name", 3, STRING, False, None),
    (dp.RegisterRequest, "options", 4, MESSAGE, False, "v1beta1.DevicePluginOptions"),
    (dp.DevicePluginOptions, "pre_start_required", 1, BOOL, False, None),
    (dp.DevicePluginOptions, "get_preferred_allocation_available", 2, BOOL, False, None),
    (dp.ListAndWatchResponse, "devices", 1, MESSAGE, True, "v1beta1.Device"),
    (dp.Device, "ID", 1, STRING, False, None),
    (dp.Device, "health", 2, STRING, False, None),
    (dp.Device, "topology", 3, MESSAGE, False, "v1beta1.TopologyInfo"),
    (dp.TopologyInfo, "nodes", 1, MESSAGE, True, "v1beta1.NUMANode"),
    (dp.NUMANode, "ID", 1, INT64, False, None),
    (dp.ContainerPreferredAllocationRequest, "available_deviceIDs", 1, STRING, True, None),
    (dp.ContainerPreferredAllocationRequest, "must_include_deviceIDs", 2, STRING, True, None),
    (dp.ContainerPreferredAllocationRequest, "allocation_size", 3, INT32, False, None),
    (dp.ContainerPreferredAllocationResponse, "deviceIDs", 1, STRING, True, None),
    (dp.ContainerAllocateRequest, "devices_ids", 1, STRING, True, None),
    (dp.ContainerAllocateResponse, "mounts", 2, MESSAGE, True, "v1beta1.Mount"),
    (dp.ContainerAllocateResponse, "devices", 3, MESSAGE, True, "v1beta1.DeviceSpec"),
    (dp.ContainerAllocateResponse, "cdi_devices", 5, MESSAGE, True, "v1beta1.CDIDevice"),
    (dp.Mount, "container_path", 1, STRING, False, None),
    (dp.Mount, "host_path", 2, STRING, False, None),
    (dp.Mount, "read_only", 3, BOOL, False, None),
    (dp.DeviceSpec, "permissions", 3, STRING, False, None),
    (dp.CDIDevice, "name", 1, STRING, False, None),
    (dp.PreStartContainerRequest, "devices_ids", 1, STRING, True, None),
    (pr.PodResources, "containers", 3, MESSAGE, True, "v1.ContainerResources"),
    (pr.PodResources, "cpu_ids", 4, INT64, True, None),
    (pr.PodResources, "memory", 5, MESSAGE, True, "v1.ContainerMemory"),
    (pr.ContainerResources, "devices", 2, MESSAGE, True, "v1.ContainerDevices"),
    (pr.ContainerResources, "dynamic_resources", 5, MESSAGE, True, "v1.DynamicResource"),
    (pr.ContainerDevices, "resource_name", 1, STRING, False, None),
    (pr.ContainerDevices, "device_ids", 2, STRING, True, None),
    (pr.ContainerDevices, "topology", 3, MESSAGE, False, "v1.TopologyInfo"),
    (pr.ContainerMemory, "size", 2, UINT64, False, None),
    (pr.DynamicResource, "claim_name", 2, STRING, False, None),
    (pr.ClaimResource, "share_id", 5, STRING, False, None),
    (pr.AllocatableResourcesResponse, "cpu_ids", 2, INT64, True, None),
    (pr.GetPodResourcesRequest, "pod_namespace", 2, STRING, False, None),
]


@pytest.mark.parametrize(
    ("message", "name", "number", "kind", "repeated", "type_name"),
    WIRE_FIELDS,
    ids=[f"{m.DESCRIPTOR.full_name}.{n}" for m, n, *_ in WIRE_FIELDS],  # type: ignore[attr-defined]
)
def test_field_numbers_and_types_match_upstream(
    message: type, name: str, number: int, kind: int, repeated: bool, type_name: str | None
) -> None:
    descriptor: Descriptor = message.DESCRIPTOR  # type: ignore[attr-defined]
    field = descriptor.fields_by_name[name]
    assert (field.number, field.type, field.is_repeated) == (number, kind, repeated)
    if type_name is not None:
        assert field.message_type is not None
        assert field.message_type.full_name == type_name


@pytest.mark.parametrize("name", ["envs", "annotations"])
def test_allocate_response_maps_are_string_to_string_maps(name: str) -> None:
    field = dp.ContainerAllocateResponse.DESCRIPTOR.fields_by_name[name]
    assert field.number == {"envs": 1, "annotations": 4}[name]
    entry = field.message_type
    assert entry is not None
    assert entry.GetOptions().map_entry
    assert [(f.name, f.type) for f in entry.fields] == [("key", STRING), ("value", STRING)]


def test_share_id_has_explicit_presence_and_field_one_of_dynamic_resource_is_free() -> None:
    assert pr.ClaimResource.DESCRIPTOR.fields_by_name["share_id"].has_presence
    assert 1 not in pr.DynamicResource.DESCRIPTOR.fields_by_number


def test_services_expose_exactly_the_upstream_methods() -> None:
    def paths(file_descriptor: object, service: str) -> dict[str, tuple[str, str, bool]]:
        svc = file_descriptor.services_by_name[service]  # type: ignore[attr-defined]
        return {
            f"/{svc.full_name}/{m.name}": (
                m.input_type.full_name,
                m.output_type.full_name,
                m.server_streaming,
            )
            for m in svc.methods
        }

    assert paths(dp.DESCRIPTOR, "Registration") == {
        "/v1beta1.Registration/Register": ("v1beta1.RegisterRequest", "v1beta1.Empty", False)
    }
    assert paths(dp.DESCRIPTOR, "DevicePlugin") == {
        "/v1beta1.DevicePlugin/GetDevicePluginOptions": (
            "v1beta1.Empty",
            "v1beta1.DevicePluginOptions",
            False,
        ),
        "/v1beta1.DevicePlugin/ListAndWatch": (
            "v1beta1.Empty",
            "v1beta1.ListAndWatchResponse",
            True,
        ),
        "/v1beta1.DevicePlugin/GetPreferredAllocation": (
            "v1beta1.PreferredAllocationRequest",
            "v1beta1.PreferredAllocationResponse",
            False,
        ),
        "/v1beta1.DevicePlugin/Allocate": (
            "v1beta1.AllocateRequest",
            "v1beta1.AllocateResponse",
            False,
        ),
        "/v1beta1.DevicePlugin/PreStartContainer": (
            "v1beta1.PreStartContainerRequest",
            "v1beta1.PreStartContainerResponse",
            False,
        ),
    }
    assert paths(pr.DESCRIPTOR, "PodResourcesLister") == {
        "/v1.PodResourcesLister/List": (
            "v1.ListPodResourcesRequest",
            "v1.ListPodResourcesResponse",
            False,
        ),
        "/v1.PodResourcesLister/GetAllocatableResources": (
            "v1.AllocatableResourcesRequest",
            "v1.AllocatableResourcesResponse",
            False,
        ),
        "/v1.PodResourcesLister/Get": (
            "v1.GetPodResourcesRequest",
            "v1.GetPodResourcesResponse",
            False,
        ),
    }


class _Registration(dp_grpc.RegistrationServicer):
    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        return dp.Empty()


class _DevicePlugin(dp_grpc.DevicePluginServicer):
    def Allocate(
        self, request: dp.AllocateRequest, context: grpc.ServicerContext
    ) -> dp.AllocateResponse:
        ids = list(request.container_requests[0].devices_ids)
        return dp.AllocateResponse(
            container_responses=[dp.ContainerAllocateResponse(envs={"IDS": ",".join(ids)})]
        )


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(pod_resources=[pr.PodResources(name="p")])


@pytest.fixture
def served() -> Iterator[grpc.Channel]:
    directory = Path(tempfile.mkdtemp(prefix="kg-wire-"))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    dp_grpc.add_RegistrationServicer_to_server(_Registration(), server)
    # The generated base classes answer UNIMPLEMENTED for the methods left out here.
    dp_grpc.add_DevicePluginServicer_to_server(_DevicePlugin(), server)  # type: ignore[abstract]
    pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(), server)  # type: ignore[abstract]
    server.add_insecure_port(f"unix://{directory / 'wire.sock'}")
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{directory / 'wire.sock'}") as channel:
            yield channel
    finally:
        server.stop(grace=None).wait()
        shutil.rmtree(directory, ignore_errors=True)


def test_servers_answer_on_the_upstream_wire_paths_with_hand_encoded_bytes(
    served: grpc.Channel,
) -> None:
    """Raw byte calls on the literal paths, as a Go kubelet or plugin would send them."""

    def call(path: str, payload: bytes) -> bytes:
        method = served.unary_unary(path)  # no serializers: bytes in, bytes out
        result = method(payload, timeout=5)
        assert isinstance(result, bytes)
        return result

    # RegisterRequest{version=1:"v1beta1", endpoint=2:"p.sock", resource_name=3:"a.io/g"}
    register = b"\x0a\x07v1beta1" + b"\x12\x06p.sock" + b"\x1a\x06a.io/g"
    assert call("/v1beta1.Registration/Register", register) == b""
    # AllocateRequest{container_requests=1:{devices_ids=1:"g0"}}
    reply = dp.AllocateResponse.FromString(
        call("/v1beta1.DevicePlugin/Allocate", b"\x0a\x04\x0a\x02g0")
    )
    assert dict(reply.container_responses[0].envs) == {"IDS": "g0"}
    listed = pr.ListPodResourcesResponse.FromString(call("/v1.PodResourcesLister/List", b""))
    assert [p.name for p in listed.pod_resources] == ["p"]
