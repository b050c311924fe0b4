"""Container images built here, without a registry: an OCI image layout written as a tar that
`ctr images import` takes. Three images: the pod sandbox's pause (Kubernetes' own pause.c from
the k8s.io/kubernetes module, compiled statically), the test workload (Debian's
busybox-static) and kube-scheduler (the static binary e2e/components/build.sh made, named as the
chart names it). kubegpu's own image is built from the Dockerfile by a real builder
(e2e/components/image/build.sh), not here."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
# The chart's scheduler.kubeSchedulerImage.repository; the tag is the suite's version.
KUBE_SCHEDULER_REPOSITORY = "registry.k8s.io/kube-scheduler"
WORKLOAD_IMAGE = "kubegpu.local/e2e-busybox:1"
_BUSYBOX_APPLETS = (
    "sh",
    "env",
    "sleep",
    "cat",
    "echo",
    "ls",
    "printenv",
    "true",
    "tr",
    "grep",
)
# NVIDIA's DRA specs (e2e/third_party) run `bash -c "nvidia-smi -L; ..."` in ubuntu images;
# their image is replaced by this one, which has busybox's shell under bash's name and
# nvidia-smi's stand-in for the fake GPUs (:func:`nvidia_smi`).
_BASH = b'#!/bin/sh\nexec /bin/sh "$@"\n'
# Every cluster of the suite runs this fake node (kubegpu_e2e/kubegpu.py, dra.py, release.py).
FAKE_GPUS = "8xA100-80GB-NVLink"


def nvidia_smi(fake_gpus: str = FAKE_GPUS) -> bytes:
    """nvidia-smi's stand-in: one `nvidia-smi -L` line per GPU device node the container has
    (/dev/nvidiaN, the minor being the card's), named as the fake node's card of that minor,
    as NVML inside a container lists the GPUs whose nodes the runtime gave it; without any,
    "No devices were found" and exit 6, as nvidia-smi. It reads the devices, not kubegpu's
    environment, so it shows what the container can reach."""
    from kubegpu.inventory.spec import resolve_fake_spec

    cases = "".join(
        f'    {gpu.minor_number}) card="{gpu.product_name} (UUID: {gpu.uuid})" ;;\n'
        for gpu in resolve_fake_spec(fake_gpus).inventory
    )
    return (
        "#!/bin/sh\n"
        f"# nvidia-smi's stand-in in the kubegpu e2e workload image: the GPUs of {fake_gpus}\n"
        "# whose device nodes this container has.\n"
        '[ "$1" = "-L" ] || echo "NVIDIA-SMI stand-in  Driver Version: fake  CUDA Version: fake"\n'
        "i=0\n"
        "for node in /dev/nvidia[0-9]*; do\n"
        '  [ -c "$node" ] || continue\n'
        '  case "${node#/dev/nvidia}" in\n'
        f"{cases}"
        '    *) card="unknown GPU (UUID: unknown)" ;;\n'
        "  esac\n"
        '  echo "GPU $i: $card"\n'
        "  i=$((i + 1))\n"
        "done\n"
        '[ "$i" -gt 0 ] || { echo "No devices were found"; exit 6; }\n'
    ).encode()


@dataclass(frozen=True)
class _Blob:
    digest: str
    data: bytes


def _blob(data: bytes) -> _Blob:
    return _Blob("sha256:" + hashlib.sha256(data).hexdigest(), data)


def _layer(files: dict[str, tuple[bytes, int]], links: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in [*files, *links]} - {"."})
        for directory in dirs:
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for path, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size = len(content)
            info.mode = mode
            tar.addfile(info, io.BytesIO(content))
        for path, target in sorted(links.items()):
            info = tarfile.TarInfo(path)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buffer.getvalue()


def write_image(
    out: Path,
    reference: str,
    files: dict[str, tuple[bytes, int]],
    links: dict[str, str],
    entrypoint: list[str],
    user: str = "",
) -> Path:
    """An OCI image layout tar holding one single-layer linux/amd64 image named `reference`."""
    layer = _blob(_layer(files, links))
    config = _blob(
        json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {
                    "Entrypoint": entrypoint,
                    "Env": ["PATH=/usr/local/bin:/bin"],
                    "WorkingDir": "/",
                    **({"User": user} if user else {}),
                },
                "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
            },
            sort_keys=True,
        ).encode()
    )
    manifest = _blob(
        json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": config.digest,
                    "size": len(config.data),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer.digest,
                        "size": len(layer.data),
                    }
                ],
            },
            sort_keys=True,
        ).encode()
    )
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest.digest,
                "size": len(manifest.data),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": reference,
                    "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[1],
                },
            }
        ],
    }
    with tarfile.open(out, "w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index).encode())
        for blob in (layer, config, manifest):
            add("blobs/sha256/" + blob.digest.split(":", 1)[1], blob.data)
    return out


def build_pause(out_dir: Path, pause_source: Path) -> Path:
    binary = out_dir / "pause"
    subprocess.run(
        [
            "gcc",
            "-Os",
            "-static",
            "-DVERSION=3.10-kubegpu-e2e",
            "-o",
            str(binary),
            str(pause_source),
        ],
        check=True,
    )
    return write_image(
        out_dir / "pause.tar",
        PAUSE_IMAGE,
        {"pause": (binary.read_bytes(), 0o755)},
        {},
        ["/pause"],
    )


def build_workload(out_dir: Path, busybox: Path = Path("/bin/busybox")) -> Path:
    links = {f"bin/{applet}": "busybox" for applet in _BUSYBOX_APPLETS}
    return write_image(
        out_dir / "workload.tar",
        WORKLOAD_IMAGE,
        {
            "bin/busybox": (busybox.read_bytes(), 0o755),
            "bin/bash": (_BASH, 0o755),
            "bin/nvidia-smi": (nvidia_smi(), 0o755),
        },
        links,
        ["/bin/sh"],
    )


def build_kube_scheduler(out_dir: Path, binary: Path, version: str) -> Path:
    """kube-scheduler as the chart runs it (/usr/local/bin/kube-scheduler, uid 65532), tagged
    with the suite's Kubernetes version: one layer, the static binary."""
    return write_image(
        out_dir / "kube-scheduler.tar",
        f"{KUBE_SCHEDULER_REPOSITORY}:{version}",
        {"usr/local/bin/kube-scheduler": (binary.read_bytes(), 0o755)},
        {},
        ["/usr/local/bin/kube-scheduler"],
        user="65532:65532",
    )
