"""Regenerates the Python modules for the kubelet gRPC protos in ``kubegpu.kubelet.api``.

Run ``python -m kubegpu.kubelet.protogen`` from a checkout with the ``[test]`` extra installed
(grpcio-tools and mypy-protobuf); it rewrites the committed ``api_pb2.py``, ``api_pb2.pyi``,
``api_pb2_grpc.py`` and ``api_pb2_grpc.pyi`` next to each ``.proto`` file. ``--out DIR`` writes
the tree under ``DIR`` instead (the staleness test uses that and compares).

Why generated imports come out absolute: protoc names each module after the proto's path
relative to the ``--proto_path``. We pass ``src/`` (the directory holding the ``kubegpu``
package) as the only proto_path and keep the ``.proto`` sources inside the package, so
``kubegpu/kubelet/api/deviceplugin/v1beta1/api.proto`` becomes
``kubegpu.kubelet.api.deviceplugin.v1beta1.api_pb2`` and ``api_pb2_grpc`` imports it as
``from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2``. No post-processing step is
needed. The proto *package* (``v1beta1``, ``v1``), which is what goes on the wire, is unaffected
by the file path.

This module lives outside the quarantined ``kubegpu.kubelet.api`` package so ruff and mypy
still check it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

# The directory that holds the ``kubegpu`` package (``src/`` in a checkout).
SOURCE_ROOT = Path(__file__).resolve().parents[2]

# Proto sources, relative to SOURCE_ROOT; they are package data.
PROTO_FILES: tuple[str, ...] = (
    "kubegpu/kubelet/api/deviceplugin/v1beta1/api.proto",
    "kubegpu/kubelet/api/podresources/v1/api.proto",
    "kubegpu/dra/api/pluginregistration/v1/api.proto",
    "kubegpu/dra/api/dra/v1/api.proto",
    "kubegpu/dra/api/dra/v1beta1/api.proto",
    "kubegpu/dra/api/dra_health/v1alpha1/api.proto",
)

# What protoc writes for each proto: the message module, the gRPC module and their stubs.
GENERATED_SUFFIXES: tuple[str, ...] = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


class ProtogenError(RuntimeError):
    """protoc or one of its plugins is missing or failed."""


def generated_files(root: Path) -> list[Path]:
    """Every file the generator writes under ``root``, in a stable order."""
    files: list[Path] = []
    for proto in PROTO_FILES:
        stem = proto.removesuffix(".proto")
        files.extend(root / f"{stem}{suffix}" for suffix in GENERATED_SUFFIXES)
    return files


def _plugin(name: str) -> Path:
    # The mypy-protobuf plugins are console scripts installed next to the interpreter.
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return beside
    found = shutil.which(name)
    if found is None:
        raise ProtogenError(f"{name} not found; install mypy-protobuf (the [test] extra)")
    return Path(found)


def generate(out_root: Path = SOURCE_ROOT) -> list[Path]:
    """Runs protoc over PROTO_FILES, writing the generated tree under ``out_root``."""
    out_root.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={SOURCE_ROOT}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *PROTO_FILES,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ProtogenError(f"protoc failed ({result.returncode}): {result.stderr.strip()}")
    files = generated_files(out_root)
    missing = [str(path) for path in files if not path.exists()]
    if missing:
        raise ProtogenError(f"protoc did not write {missing}")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubegpu.kubelet.protogen")
    parser.add_argument(
        "--out",
        type=Path,
        default=SOURCE_ROOT,
        help="directory to write the kubegpu/... tree under (default: the package's own src)",
    )
    args = parser.parse_args(argv)
    try:
        files = generate(args.out)
    except ProtogenError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in files:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
