"""``kubegpu simulate --card-choice`` as a real process on a small trace made here."""

from __future__ import annotations

import csv
from pathlib import Path

from tests.simulate.test_command import NODES, simulate, write_pods


def setup(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    return nodes, write_pods(tmp_path / "tiny.csv")


def test_runs_every_card_choice_and_labels_the_rows(tmp_path: Path) -> None:
    nodes, pods = setup(tmp_path)
    out = tmp_path / "out"
    result = simulate(
        "--nodes", str(nodes), "--pods", str(pods), "--policy", "kubegpu,bestfit",
        "--card-choice", "policy,first-fit,steered", "--seeds", "1", "--out", str(out),
        "--no-plot",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with (out / "allocation.csv").open() as handle:
        labels = sorted(row["sc_policy"] for row in csv.DictReader(handle))
    assert labels == [
        "05-BestFit", "05-BestFit first-fit", "05-BestFit steered",
        "07-Kubegpu", "07-Kubegpu first-fit", "07-Kubegpu steered",
    ]  # fmt: skip
    assert "07-Kubegpu first-fit" in result.stdout


def test_policy_card_choice_is_the_default_output(tmp_path: Path) -> None:
    nodes, pods = setup(tmp_path)
    common = ["--nodes", str(nodes), "--pods", str(pods), "--seeds", "1-2", "--no-plot"]
    plain = simulate(*common, "--out", str(tmp_path / "plain"))
    named = simulate(*common, "--card-choice", "policy", "--out", str(tmp_path / "named"))
    assert plain.returncode == named.returncode == 0, plain.stderr + named.stderr
    assert (tmp_path / "plain" / "allocation.csv").read_bytes() == (
        tmp_path / "named" / "allocation.csv"
    ).read_bytes()


def test_unknown_card_choice_exits_2_naming_option_and_value(tmp_path: Path) -> None:
    nodes, pods = setup(tmp_path)
    result = simulate(
        "--nodes", str(nodes), "--pods", str(pods), "--card-choice", "first-fit,best",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert result.returncode == 2
    assert "--card-choice" in result.stderr and "'best'" in result.stderr
    assert "first-fit" in result.stderr and "Traceback" not in result.stderr


def test_steered_with_a_policy_it_cannot_steer_exits_2(tmp_path: Path) -> None:
    nodes, pods = setup(tmp_path)
    result = simulate(
        "--nodes", str(nodes), "--pods", str(pods), "--policy", "kubegpu,fgd",
        "--card-choice", "steered", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert result.returncode == 2
    assert (
        "--card-choice" in result.stderr and "fgd chooses cards by fragmentation" in result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "allocation.csv").exists()


def test_help_documents_the_option() -> None:
    result = simulate("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "--card-choice" in text and "first-fit" in text and "steered" in text
