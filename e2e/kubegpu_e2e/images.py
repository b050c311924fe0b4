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
_BUSYBOX_APPLETS = ("sh", "env", "sleep", "cat", "echo", "ls", "printenv", "true")


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
        {"bin/busybox": (busybox.read_bytes(), 0o755)},
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
