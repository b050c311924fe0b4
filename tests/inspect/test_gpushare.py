"""``kubectl inspect gpushare`` (the ``kubectl-inspect-gpushare`` plugin) against the fake API
server holding the mixed cluster: gpushare's columns, kubegpu's figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner, Result

from kubegpu.inspect.gpushare import inspect_gpushare
from tests.inspect import mixed_cluster as mc

BIN = Path(sys.executable).parent


def run(*args: str) -> Result:
    return CliRunner().invoke(inspect_gpushare, list(args), catch_exceptions=False)


def row(output: str, first: str) -> list[str]:
    return next(line.split() for line in output.splitlines() if line.startswith(first + " "))


def test_the_summary_has_gpushares_columns_and_adds_up(kubeconfig: Path) -> None:
    result = run("--kubeconfig", str(kubeconfig))
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0].split()
    assert header[:3] == ["NAME", "IPADDRESS", "GPU0(Allocated/Total)"]
    assert "GPU7(Allocated/Total)" in header
    assert "PENDING(Allocated)" in header  # a100 has pods bound without a decision
    assert header[-2:] == ["GPU", "Memory(GiB)"]
    a100 = row(result.output, "a100")
    assert a100[1] == "10.0.0.1"
    # Card 0: train-a 20 GiB + train-b 30 GiB of 80; card 2 is a whole card.
    assert a100[2:5] == ["50/80", "10/80", "80/80"]
    # The footer adds up the nodes' last column.
    nodes = [line.split()[-1] for line in result.output.splitlines()[1:-2]]
    allocated = sum(float(n.split("/")[0]) for n in nodes)
    total = sum(float(n.split("/")[1]) for n in nodes)
    footer = result.output.splitlines()[-1]
    assert footer.startswith("Allocated/Total GPU Memory In Cluster: ")
    shown_allocated, shown_total = footer.split(": ")[1].split()[0].split("/")
    assert (float(shown_allocated), float(shown_total)) == (allocated, total)


def test_one_node_in_mib_and_details_list_the_pods_per_card(kubeconfig: Path) -> None:
    result = run("--kubeconfig", str(kubeconfig), "a100", "-d", "--unit", "MiB")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["NAME:", "a100"]
    assert lines[1].split() == ["IPADDRESS:", "10.0.0.1"]
    train_a = row(result.output, "train-a")
    assert train_a[:3] == ["train-a", "ml", "20480"]
    assert row(result.output, "infer-c")[2:4] == ["0", "10240"]
    assert any(line.startswith("Total :") and str(8 * mc.A100_MIB) in line for line in lines)
    assert "mixed" not in result.output  # only the node asked for


def test_an_unknown_node_and_an_unreachable_cluster_say_so(kubeconfig: Path) -> None:
    result = run("--kubeconfig", str(kubeconfig), "nosuch")
    assert (result.exit_code, "node nosuch has no GPU" in result.output) == (1, True)
    result = run("--kubeconfig", str(kubeconfig), "--unit", "KiB")
    assert result.exit_code == 2


def test_kubectl_finds_the_plugin_on_path(kubeconfig: Path) -> None:
    # kubectl runs `kubectl-inspect-gpushare` for `kubectl inspect gpushare`.
    done = subprocess.run(
        [str(BIN / "kubectl-inspect-gpushare"), "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("NAME")
