"""``kubegpu fake-apiserver``: serve the fake Kubernetes API for a laptop demo.

Writes a kubeconfig that points at it (for our CLI, lightkube or kubectl) and serves until
interrupted. Plain HTTP is allowed on loopback only, unless explicitly allowed, because the fake
has no authentication at all.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import signal
import tempfile
from pathlib import Path

import click

from kubegpu.cli.types import NonEmptyPath, OutputFile
from kubegpu.config.model import MAX_GPUS_PER_NODE
from kubegpu.testing.apiserver.objects import make_node
from kubegpu.testing.apiserver.server import FakeApiServer
from kubegpu.tls import TlsFileError, server_context

MAX_SEED_NODES = 5000


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command("fake-apiserver")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    default=8080,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="0 picks a free port.",
)
@click.option(
    "--seed-nodes",
    default=0,
    show_default=True,
    # Kubernetes' largest supported cluster: more only makes the process grow until killed.
    type=click.IntRange(0, MAX_SEED_NODES),
    help="Create this many Ready nodes (node-0, node-1, ...) at start.",
)
@click.option(
    "--gpus-per-node",
    default=0,
    show_default=True,
    type=click.IntRange(0, MAX_GPUS_PER_NODE),
    help="nvidia.com/gpu capacity of each seeded node.",
)
@click.option(
    "--kubeconfig",
    "kubeconfig_path",
    type=OutputFile(parents=True),
    default=None,
    help="Where to write the kubeconfig [default: a temporary folder, removed at exit].",
)
@click.option(
    "--tls-cert-file",
    type=NonEmptyPath(exists=True, dir_okay=False),
    default=None,
    help="Serve HTTPS with this PEM certificate; needs --tls-key-file.",
)
@click.option(
    "--tls-key-file",
    type=NonEmptyPath(exists=True, dir_okay=False),
    default=None,
    help="The unencrypted PEM private key of --tls-cert-file.",
)
@click.option(
    "--allow-insecure-remote",
    is_flag=True,
    help="Allow plain HTTP on a non-loopback address (no authentication!).",
)
def fake_apiserver(
    host: str,
    port: int,
    seed_nodes: int,
    gpus_per_node: int,
    kubeconfig_path: Path | None,
    tls_cert_file: str | None,
    tls_key_file: str | None,
    allow_insecure_remote: bool,
) -> None:
    """Serve a fake Kubernetes API server (in memory) until interrupted."""
    if bool(tls_cert_file) != bool(tls_key_file):
        raise click.UsageError("--tls-cert-file and --tls-key-file go together")
    if not tls_cert_file and not _is_loopback(host) and not allow_insecure_remote:
        raise click.UsageError(
            f"refusing plain HTTP on {host}: use a loopback address, TLS, or "
            "--allow-insecure-remote"
        )
    if tls_cert_file and tls_key_file:
        try:  # before listening: a bad file is the user's, named, not an ssl traceback
            server_context(Path(tls_cert_file), Path(tls_key_file), options=TLS_OPTIONS)
        except TlsFileError as exc:
            raise click.UsageError(str(exc)) from None
    if kubeconfig_path is not None:
        _check_writable(kubeconfig_path)
    server = FakeApiServer(host, port, tls_cert_file=tls_cert_file, tls_key_file=tls_key_file)
    extended = {"nvidia.com/gpu": str(gpus_per_node)} if gpus_per_node else None
    for i in range(seed_nodes):
        server.store.put("nodes", make_node(f"node-{i}", extended=extended))
    asyncio.run(_serve(server, kubeconfig_path))


TLS_OPTIONS = ("--tls-cert-file", "--tls-key-file", "")


def _check_writable(path: Path) -> None:
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.BadParameter(
            f"cannot make folder {folder}: {exc.strerror or exc}", param_hint="'--kubeconfig'"
        ) from None
    if path.is_dir() or not os.access(folder, os.W_OK):
        raise click.BadParameter(f"cannot write {path}", param_hint="'--kubeconfig'")


async def _serve(server: FakeApiServer, kubeconfig_path: Path | None) -> None:
    try:
        await server.start()
    except OSError as exc:
        raise click.UsageError(
            f"cannot listen on {server.host}:{server.port}: {exc.strerror or exc}"
        ) from None
    # Written by us into a folder of our own: removed at exit, so runs leave nothing behind.
    own_folder = None
    if kubeconfig_path is None:
        own_folder = Path(tempfile.mkdtemp(prefix="kubegpu-fake-"))
        kubeconfig_path = own_folder / "kubeconfig"
    try:
        await _announce_and_wait(server, kubeconfig_path)
    finally:
        if own_folder is not None:
            shutil.rmtree(own_folder, ignore_errors=True)


async def _announce_and_wait(server: FakeApiServer, kubeconfig_path: Path) -> None:
    # Handlers first: a SIGTERM sent as soon as the kubeconfig is announced must still stop
    # the server cleanly and remove what it wrote.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    path = server.write_kubeconfig(kubeconfig_path)
    click.echo(f"fake API server listening on {server.url}")
    click.echo(f"kubeconfig written to {path}")
    click.echo(f"export KUBECONFIG={path}", nl=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
        click.echo("fake API server stopped")
