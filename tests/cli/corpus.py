"""What the bad-input corpora share: the files their command lines name, and running one
``kubegpu`` command line as a real process that leaves nothing behind.

``test_bad_input_corpus`` holds the hand-written cases (a bad file's content, flags that do not
fit together); ``test_generated_corpus`` makes its cases from the click command tree itself.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kubegpu.testing.waiting import wait_until

# A folder name that makes a unix socket path longer than the kernel's 108-byte sun_path.
LONG_DIR = "d" * 120
# Not KUBEGPU_*: no command reads it, and the demo passes its whole environment on.
MARKER = "CORPUS_TEST_CASE"
NOBODY = 65534


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def self_signed(key: ec.EllipticCurvePrivateKey) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corpus")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def make_files(root: Path) -> Path:
    """The files the corpora's command lines name as ``{files}``: good ones a command needs to
    get as far as the option under test, and bad ones."""
    (root / "a-file").write_text("not a folder\n")
    (root / LONG_DIR).mkdir()
    (root / "latin1.yaml").write_bytes("version: v1 # caf\xe9\n".encode("latin-1"))
    (root / "latin1.csv").write_bytes("sn,cpu_milli\ncaf\xe9,1\n".encode("latin-1"))
    (root / "garbage.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64\n")
    (root / "agent-typo.yaml").write_text("version: v1\nflagz: {}\n")
    (root / "dra.yaml").write_text("version: v1\ngpuAllocation: dra\n")
    (root / "dra-typo.yaml").write_text("version: v1\ngpuAllocation: DRA\n")
    (root / "device-plugin.yaml").write_text("version: v1\ngpuAllocation: devicePlugin\n")
    (root / "extender-typo.yaml").write_text(
        "apiVersion: kubegpu.io/v1alpha1\nkind: ExtenderConfig\nsettings:\n  polcy: binpack\n"
    )
    (root / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\n")
    (root / "pods.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\n"
    )
    (root / "no-clusters.yaml").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "contexts: [{name: c, context: {cluster: x, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    (root / "kubeconfig.yaml").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: x, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: x, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    # Certificate files a kubeconfig names that are not there: lightkube opened them only when
    # the first client was made, with a traceback naming neither file.
    (root / "missing-certs.yaml").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: x, cluster: {server: 'https://127.0.0.1:9', "
        "certificate-authority: no-such-ca.crt}}]\n"
        "contexts: [{name: c, context: {cluster: x, user: u}}]\n"
        "users: [{name: u, user: {client-certificate: no-such.crt, client-key: no-such.key}}]\n"
    )
    (root / "missing-client-cert.yaml").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: x, cluster: {server: 'https://127.0.0.1:9', "
        "insecure-skip-tls-verify: true}}]\n"
        "contexts: [{name: c, context: {cluster: x, user: u}}]\n"
        f"users: [{{name: u, user: {{client-certificate: {root}/no-such.crt, "
        f"client-key: {root}/no-such.key}}}}]\n"
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    (root / "server.key").write_bytes(key_pem(server_key))
    (root / "server.crt").write_bytes(self_signed(server_key))
    (root / "other.key").write_bytes(key_pem(ec.generate_private_key(ec.SECP256R1())))
    return root


@dataclass(frozen=True)
class Outcome:
    args: tuple[str, ...]
    returncode: int | None  # None: still running at the deadline, then killed
    output: str
    leftover_processes: bool
    leftover_temp: list[str]


def environment(home: Path, temp: Path) -> dict[str, str]:
    # No kubeconfig anywhere, not in a cluster, no proxy, and a temporary directory of its own
    # so that anything a command leaves there is seen.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KUBEGPU_", "KUBERNETES_"))
        and k not in ("KUBECONFIG", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
    }
    return {**env, "HOME": str(home), "TMPDIR": str(temp), "NO_PROXY": "*", "COLUMNS": "200"}


def marked_processes(marker: str) -> list[int]:
    """Processes that inherited ``MARKER=marker``: the case's own and every descendant, also
    those that started a session of their own (the demo's children do) or were reparented."""
    needle = f"{MARKER}={marker}".encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def setpriv() -> list[str] | None:
    """The command prefix that runs a command as nobody, when this process is root and may
    drop to it; None otherwise."""
    tool = shutil.which("setpriv")
    if os.geteuid() != 0 or tool is None:
        return None
    prefix = [tool, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import kubegpu"], capture_output=True, check=False
    )
    return prefix if probe.returncode == 0 else None


def run_kubegpu(
    args: list[str],
    scratch: Path,
    *,
    timeout_s: float,
    prefix: list[str] | None = None,
) -> Outcome:
    """``kubegpu ARGS`` as a process in its own session, stdout and stderr together; killed
    with everything it started when still running after ``timeout_s``. ``scratch`` gets its
    home and temporary folders (which must stay empty)."""
    home, temp = scratch / "home", scratch / "tmp"
    home.mkdir(parents=True, exist_ok=True)
    temp.mkdir(exist_ok=True)
    if prefix:  # another user runs it: let it use (and be seen to leave files in) both
        for folder in (scratch, home, temp):
            folder.chmod(0o777)
    marker = uuid.uuid4().hex
    process = subprocess.Popen(
        [*(prefix or []), sys.executable, "-m", "kubegpu", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**environment(home, temp), MARKER: marker},
        cwd=scratch,
        start_new_session=True,
        text=True,
        errors="replace",
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
        returncode: int | None = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        returncode = None
    left = marked_processes(marker)

    def gone() -> bool:
        left[:] = marked_processes(marker)
        return not left

    with contextlib.suppress(TimeoutError):  # what is still there is reported below
        wait_until(gone, timeout_s=5, what="the case's processes gone")
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return Outcome(
        tuple(args), returncode, output, bool(left), sorted(p.name for p in temp.iterdir())
    )
