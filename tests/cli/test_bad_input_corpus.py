"""Every ``kubegpu`` subcommand, run as a real process with a corpus of bad inputs.

Each case must end with a non-zero exit, no Python traceback, a message that names the option
or file at fault, no process left behind in its process group and nothing left in its temporary
directory. The subcommands come from the click group itself, so a new subcommand without
entries here fails the test instead of going unchecked.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubegpu.cli.main import cli
from tests.cli.corpus import LONG_DIR, make_files, run_kubegpu
from tests.cli.corpus import Outcome as RunOutcome

# About 90 processes, four at a time: well under a minute on two idle cores, more on a busy
# machine; the module-scoped run is charged to the first test that uses it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CASE_TIMEOUT_S = 60


@dataclass(frozen=True)
class Case:
    command: str  # split on spaces; "{files}": the corpus's files, "{busy}": a taken port
    names: str  # the output must contain this: the option or file at fault
    # 2, a usage error, unless the command documents otherwise for this case.
    code: int = 2

    @property
    def args(self) -> list[str]:
        return self.command.split()


SIM = "simulate --nodes {files}/nodes.csv --pods {files}/pods.csv"
FAKE = "--backend fake --fake-gpus 4xT4"
API = "--kubeconfig {files}/kubeconfig.yaml"
EXT = "extender --leader-lease none"
KEY = "--tls-key-file {files}/server.key"
# A DRA driver invocation that is fine but for the option each case spoils (given last wins).
DRA = (
    "--node-name n0 --config {files}/dra.yaml --kubeconfig {files}/kubeconfig.yaml "
    "--kubelet-dir {files}/kd --cdi-dir {files}/cdi --state-dir {files}/state"
)

# subcommand -> (command line, what the message must name[, exit code if not 2])
CORPUS: dict[str, list[tuple[str, str] | tuple[str, str, int]]] = {
    "device-plugin": [
        ("device-plugin --config {files}/latin1.yaml", "latin1.yaml"),
        ("device-plugin --config {files}/agent-typo.yaml", "'flags'"),
        (f"device-plugin {FAKE} --kubelet-dir {{files}}/a-file", "--kubelet-dir"),
        (f"device-plugin {FAKE} --kubelet-dir {{files}}/a-file/below", "--kubelet-dir"),
        (f"device-plugin {FAKE} --kubelet-dir {{files}}/{LONG_DIR}", "--kubelet-dir"),
        ("device-plugin --backend fake --fake-gpus nosuch", "nosuch"),
        (f"device-plugin {FAKE} --health-listen nohost", "nohost"),
        (f"device-plugin {FAKE} --kubeconfig {{files}}/no-clusters.yaml", "no-clusters.yaml"),
        (
            f"device-plugin {FAKE} --gpu-share --node-name n0 --kubelet-dir {{files}}/kd3 "
            "--kubeconfig {files}/missing-certs.yaml",
            "missing-certs.yaml: certificate-authority no-such-ca.crt",
        ),
        (
            f"device-plugin {FAKE} --kubelet-dir {{files}}/kd "
            "--device-list-strategy cdi-annotations --cdi-dir {files}/a-file",
            "--cdi-dir",
        ),
        (f"device-plugin {FAKE} --config {{files}}/dra.yaml", "gpuAllocation"),
    ],
    "dra-driver": [
        (f"dra-driver {FAKE} {DRA} --config {{files}}/latin1.yaml", "latin1.yaml"),
        (f"dra-driver {FAKE} {DRA} --config {{files}}/agent-typo.yaml", "'flags'"),
        (f"dra-driver {FAKE} {DRA} --config {{files}}/device-plugin.yaml", "gpuAllocation"),
        (f"dra-driver {FAKE} {DRA} --config {{files}}/dra-typo.yaml", "gpuAllocation"),
        (f"dra-driver {FAKE} --config {{files}}/dra.yaml {API}", "--node-name"),
        (f"dra-driver {FAKE} {DRA} --kubelet-dir {{files}}/a-file", "--kubelet-dir"),
        (f"dra-driver {FAKE} {DRA} --kubelet-dir {{files}}/a-file/below", "--kubelet-dir"),
        (f"dra-driver {FAKE} {DRA} --kubelet-dir {{files}}/{LONG_DIR}", "--kubelet-dir"),
        (f"dra-driver {FAKE} {DRA} --cdi-dir {{files}}/a-file", "--cdi-dir"),
        (f"dra-driver {FAKE} {DRA} --state-dir {{files}}/a-file/below", "--state-dir"),
        (
            "dra-driver --backend fake --fake-gpus nosuch --node-name n0 --config {files}/dra.yaml "
            "--kubeconfig {files}/kubeconfig.yaml --kubelet-dir {files}/kd2 --cdi-dir {files}/c2 "
            "--state-dir {files}/s2",
            "nosuch",
        ),
        (
            f"dra-driver {FAKE} --node-name n0 --config {{files}}/dra.yaml "
            "--kubeconfig {files}/no-clusters.yaml",
            "no-clusters.yaml",
        ),
        (f"dra-driver {FAKE} {DRA} --kubeconfig {{files}}/missing.yaml", "--kubeconfig"),
        (
            f"dra-driver {FAKE} {DRA} --kubeconfig {{files}}/missing-client-cert.yaml",
            "missing-client-cert.yaml: client-certificate",
        ),
    ],
    "emulate-node": [
        ("emulate-node --fake-gpus 4xT4 --kubelet-dir {files}/a-file", "--kubelet-dir"),
        ("emulate-node --fake-gpus 4xT4 --kubelet-dir {files}/a-file/below", "--kubelet-dir"),
        (f"emulate-node --fake-gpus 4xT4 --kubelet-dir {{files}}/{LONG_DIR}", "--kubelet-dir"),
        ("emulate-node --fake-gpus 4xT4 --timeout 0", "--timeout"),
        ("emulate-node --fake-gpus 4xT4 --timeout nan", "--timeout"),
        ("emulate-node --fake-gpus 4xT4 --allocate -1", "--allocate"),
        (
            f"emulate-node --fake-gpus 4xT4 --once --pod-resources-socket {{files}}/{LONG_DIR}/p",
            "--pod-resources-socket",
        ),
        (
            "emulate-node --fake-gpus 4xT4 --once --pod-resources-socket {files}/a-file/p.sock",
            "--pod-resources-socket",
        ),
        ("emulate-node --fake-gpus nosuch --once", "nosuch"),
    ],
    "simulate": [
        (f"{SIM} --out {{files}}/o1 --inflation -1", "--inflation"),
        (f"{SIM} --out {{files}}/o2 --inflation 0", "--inflation"),
        (f"{SIM} --out {{files}}/o3 --inflation nan", "--inflation"),
        (f"{SIM} --out {{files}}/a-file", "--out"),
        (f"{SIM} --out {{files}}/a-file/below", "--out"),
        (f"{SIM} --out {{files}}/o4 --paper {{files}}/missing.csv", "missing.csv"),
        (f"{SIM} --out {{files}}/o5 --paper {{files}}/latin1.csv", "latin1.csv"),
        (f"{SIM} --out {{files}}/o6 --seeds 1-5000000", "--seeds"),
        (f"{SIM} --out {{files}}/o7 --seeds 51-42", "reversed"),
        (f"{SIM} --out {{files}}/o8 --seeds x", "--seeds"),
        (f"{SIM} --out {{files}}/o9 --policy nosuch", "--policy"),
        (
            "simulate --nodes {files}/latin1.csv --pods {files}/pods.csv --out {files}/o10",
            "latin1.csv",
        ),
        (
            "simulate --nodes {files}/nodes.csv --pods {files}/latin1.csv --out {files}/o11",
            "latin1.csv",
        ),
        (f"{SIM} --out {{files}}/o12 --arrivals {{files}}/a-file", "--arrivals"),
    ],
    "trace": [
        (
            "trace constrain --nodes {files}/nodes.csv --pods {files}/pods.csv "
            "--fraction 0 --seed 1 --out {files}/t1.csv",
            "--fraction",
        ),
        (
            "trace constrain --nodes {files}/nodes.csv --pods {files}/pods.csv "
            "--fraction nan --seed 1 --out {files}/t2.csv",
            "--fraction",
        ),
        (
            "trace constrain --nodes {files}/latin1.csv --pods {files}/pods.csv "
            "--fraction 0.2 --seed 1 --out {files}/t3.csv",
            "latin1.csv",
        ),
        (
            "trace constrain --nodes {files}/nodes.csv --pods {files}/pods.csv "
            "--fraction 0.2 --seed 1 --out {files}/a-file/below.csv",
            "--out",
        ),
        (
            "trace arrivals --nodes {files}/nodes.csv --pods {files}/pods.csv "
            "--seeds 51-42 --out {files}/t4",
            "reversed",
        ),
        (
            "trace arrivals --nodes {files}/nodes.csv --pods {files}/pods.csv "
            "--inflation -1 --out {files}/t5",
            "--inflation",
        ),
    ],
    "labels": [
        (f"labels {FAKE} --sink node --once", "kubeconfig"),
        (f"labels {FAKE} --interval -1", "--interval"),
        (f"labels {FAKE} --poll 0", "--poll"),
        (f"labels {FAKE} --poll nan", "--poll"),
        (f"labels {FAKE} --config {{files}}/latin1.yaml --once", "latin1.yaml"),
        (f"labels {FAKE} --sink nfd --nfd-file {{files}}/a-file/below --once", "a-file/below"),
        ("labels --backend fake --fake-gpus nosuch --once", "nosuch"),
    ],
    "exporter": [
        (f"exporter {FAKE} --pod-directory api", "kubeconfig"),
        (f"exporter {FAKE} --proc {{files}}/missing", "--proc"),
        (f"exporter {FAKE} --pod-log-dir {{files}}/missing", "--pod-log-dir"),
        (f"exporter {FAKE} --interval 0", "--interval"),
        (f"exporter {FAKE} --interval -1", "--interval"),
        (f"exporter {FAKE} --read-timeout 0", "--read-timeout"),
        (f"exporter {FAKE} --listen 127.0.0.1:99999", "--listen"),
        (f"exporter {FAKE} --config {{files}}/latin1.yaml", "latin1.yaml"),
        ("exporter --backend fake --fake-gpus nosuch", "nosuch"),
        (f"exporter {FAKE} --listen 127.0.0.1:{{busy}}", "--listen"),
    ],
    "fake-apiserver": [
        ("fake-apiserver --port 99999", "--port"),
        ("fake-apiserver --port -1", "--port"),
        ("fake-apiserver --port {busy}", "cannot listen on"),
        ("fake-apiserver --port 0 --kubeconfig {files}/a-file/kc", "--kubeconfig"),
        (
            "fake-apiserver --port 0 --tls-cert-file {files}/missing.crt "
            "--tls-key-file {files}/server.key",
            "missing.crt",
        ),
        (
            "fake-apiserver --port 0 --tls-cert-file {files}/garbage.pem "
            "--tls-key-file {files}/server.key",
            "garbage.pem",
        ),
        (
            "fake-apiserver --port 0 --tls-cert-file {files}/server.crt "
            "--tls-key-file {files}/other.key",
            "other.key",
        ),
    ],
    "discover": [
        ("discover --backend fake --fake-gpus nosuch", "nosuch"),
        ("discover --backend fake --fake-gpus {files}/latin1.yaml", "latin1.yaml"),
    ],
    "fake-gpu": [
        # Documented: a socket that is not there means no backend runs (1), not bad usage.
        ("fake-gpu --control {files}/missing.sock status", "missing.sock", 1),
        ("fake-gpu --control {files}/a-file xid --gpu 0", "--xid"),
        ("fake-gpu --control {files}/a-file xid --gpu 0 --xid -1", "--xid"),
        ("fake-gpu --control {files}/a-file status", "a-file"),
    ],
    "inspect": [
        ("inspect", "kubeconfig"),
        ("inspect --kubeconfig {files}/no-clusters.yaml", "no-clusters.yaml"),
        ("inspect --kubeconfig {files}/latin1.yaml", "latin1.yaml"),
        (f"inspect {API} --context nosuch", "nosuch"),
        ("inspect --request-timeout 0", "--request-timeout"),
        (
            "inspect --kubeconfig {files}/missing-certs.yaml",
            "missing-certs.yaml: certificate-authority no-such-ca.crt",
        ),
        (
            "inspect --kubeconfig {files}/missing-client-cert.yaml",
            "no-such.crt: No such file or directory",
        ),
    ],
    "extender": [
        (EXT, "kubeconfig"),
        (f"{EXT} --kubeconfig {{files}}/no-clusters.yaml", "no-clusters.yaml"),
        (f"{EXT} --kubeconfig {{files}}/latin1.yaml", "latin1.yaml"),
        (
            f"{EXT} --kubeconfig {{files}}/missing-client-cert.yaml",
            "missing-client-cert.yaml: client-certificate",
        ),
        (f"extender {API}", "leader-lease"),
        (
            f"{EXT} {API} --tls-cert-file {{files}}/missing.crt {KEY}",
            "missing.crt",
        ),
        (
            f"{EXT} {API} --tls-cert-file {{files}}/garbage.pem {KEY}",
            "garbage.pem",
        ),
        (
            f"{EXT} {API} --tls-cert-file {{files}}/server.crt --tls-key-file {{files}}/other.key",
            "other.key",
        ),
        (
            f"{EXT} {API} --tls-cert-file {{files}}/server.crt --tls-key-file {{files}}/server.key "
            "--client-ca-file {files}/garbage.pem",
            "garbage.pem",
        ),
        ("extender --config {files}/latin1.yaml", "latin1.yaml"),
        ("extender --config {files}/extender-typo.yaml", "'policy'"),
        (f"{EXT} --bind-attempts 0", "--bind-attempts"),
        (f"{EXT} --workload-refresh-seconds 0", "--workload-refresh-seconds"),
        (f"{EXT} --max-body-bytes -1", "--max-body-bytes"),
        (f"{EXT} {API} --workload-file {{files}}/latin1.yaml", "latin1.yaml"),
        (f"{EXT} {API} --policy nosuch", "nosuch"),
        (f"{EXT} {API} --port {{busy}}", "cannot listen there"),
    ],
    "peer-webhook": [
        ("peer-webhook", "--peer-compat"),
        ("peer-webhook --peer-compat hami", "hami"),
        ("peer-webhook --peer-compat volcano --peer-compute-milli 0", "--peer-compute-milli"),
        ("peer-webhook --peer-compat volcano --host 0.0.0.0", "--tls-cert-file"),
        (
            "peer-webhook --peer-compat volcano --tls-cert-file {files}/garbage.pem "
            "--tls-key-file {files}/server.key",
            "garbage.pem",
        ),
        ("peer-webhook --peer-compat volcano --host 127.0.0.1 --port {busy}", "cannot listen on"),
        (f"{EXT} --peer-compat nosuch", "nosuch"),
    ],
    "claim-budget-webhook": [
        ("claim-budget-webhook --host 0.0.0.0", "--tls-cert-file"),
        ("claim-budget-webhook --pending-seconds 0", "--pending-seconds"),
        ("claim-budget-webhook --kubeconfig {files}/latin1.yaml", "latin1.yaml"),
        (
            "claim-budget-webhook --kubeconfig {files}/kubeconfig.yaml "
            "--tls-cert-file {files}/garbage.pem --tls-key-file {files}/server.key",
            "garbage.pem",
        ),
        (
            "claim-budget-webhook --kubeconfig {files}/kubeconfig.yaml --port {busy}",
            "cannot listen on",
        ),
    ],
    "demo": [
        ("demo --summary-json {files}/missing/summary.json", "--summary-json"),
        ("demo --pid-file {files}/missing/pids", "--pid-file"),
        ("demo --policy nosuch", "--policy"),
        ("demo --trace {files}/latin1.csv", "latin1.csv"),
        ("demo --timeout 0", "--timeout"),
        ("demo --work-dir {files}/a-file", "--work-dir"),
        (f"demo --work-dir {{files}}/{LONG_DIR}", "--work-dir"),
    ],
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_files(tmp_path_factory.mktemp("corpus"))


@dataclass(frozen=True)
class Outcome:
    case: Case
    run: RunOutcome

    @property
    def returncode(self) -> int | None:
        return self.run.returncode

    @property
    def output(self) -> str:
        return self.run.output


def run_case(item: Case, files: Path, scratch: Path, busy: int) -> Outcome:
    args = [a.replace("{files}", str(files)).replace("{busy}", str(busy)) for a in item.args]
    return Outcome(item, run_kubegpu(args, scratch, timeout_s=CASE_TIMEOUT_S))


def subcommands() -> list[str]:
    import click

    return cli.list_commands(click.Context(cli))


def test_the_corpus_covers_every_subcommand() -> None:
    missing = [name for name in subcommands() if not CORPUS.get(name)]
    assert not missing, f"subcommands without bad-input cases in CORPUS: {missing}"
    assert not set(CORPUS) - set(subcommands()), "CORPUS names a subcommand that is gone"


@pytest.fixture(scope="module")
def outcomes(files: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Outcome]]:
    cases = [Case(*c) for name in subcommands() for c in CORPUS.get(name, [])]
    scratch = tmp_path_factory.mktemp("runs")
    # "{busy}": a loopback port something already listens on.
    with socket.socket() as taken, ThreadPoolExecutor(max_workers=4) as pool:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        results = list(
            pool.map(
                lambda ic: run_case(ic[1], files, scratch / str(ic[0]), busy), enumerate(cases)
            )
        )
    yield results


def test_every_bad_input_fails_cleanly_naming_the_culprit(outcomes: list[Outcome]) -> None:
    problems: list[str] = []
    for o in outcomes:
        wrong = []
        if o.returncode is None:
            wrong.append(f"still running after {CASE_TIMEOUT_S} s")
        elif o.returncode == 0:
            wrong.append("exit 0")
        if "Traceback" in o.output:
            wrong.append("traceback")
        if o.case.names not in o.output:
            wrong.append(f"does not name {o.case.names!r}")
        if o.run.leftover_processes:
            wrong.append("left processes behind")
        if o.run.leftover_temp:
            wrong.append(f"left {o.run.leftover_temp} in its temporary directory")
        if wrong:
            tail = "\n      ".join(o.output.strip().splitlines()[-4:])
            problems.append(f"kubegpu {o.case.command}: {', '.join(wrong)}\n      {tail}")
    assert not problems, f"{len(problems)} of {len(outcomes)} cases:\n" + "\n".join(problems)


def test_usage_errors_exit_2(outcomes: list[Outcome]) -> None:
    # The corpus is the user's mistakes, not failures of the system: usage errors, exit 2.
    wrong = [
        f"kubegpu {o.case.command}: exit {o.returncode}, not {o.case.code}"
        for o in outcomes
        if o.returncode != o.case.code
    ]
    assert not wrong, "\n".join(wrong)
