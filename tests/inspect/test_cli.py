"""``kubegpu inspect`` and ``kubectl gpu inspect`` against the fake API server over HTTP."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner, Result

from kubegpu.cli.main import cli
from kubegpu.inspect.command import kubectl_gpu
from kubegpu.inspect.render import load_schema
from kubegpu.kube.list_watch import RawPod
from kubegpu.testing.apiserver import ServerThread, make_pod
from kubegpu.testing.kubeconfig import write_kubeconfig
from tests.inspect import mixed_cluster as mc
from tests.inspect.metrics_server import NodePage, serve_metrics

MIB = 2**20
BIN = Path(sys.executable).parent


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["inspect", *args], catch_exceptions=False)


def inspect_json(kubeconfig: Path, *args: str) -> dict[str, Any]:
    result = run("--kubeconfig", str(kubeconfig), "--no-usage", "-o", "json", *args)
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    jsonschema.validate(doc, load_schema())
    return doc


def by_name(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(i for i in items if i["name"] == name)


def test_json_output_of_the_mixed_cluster_validates_and_holds_the_allocations(
    kubeconfig: Path,
) -> None:
    doc = inspect_json(kubeconfig)
    assert [n["name"] for n in doc["nodes"]] == ["a100", "legacy", "mixed", "sick"]
    a100 = by_name(doc["nodes"], "a100")
    assert a100["address"] == "10.0.0.1"
    cards = a100["cards"]
    assert [p["name"] for p in cards[0]["pods"]] == ["train-a", "train-b"]
    assert cards[0]["allocatedMemoryMiB"] == 20480 + 30720
    assert cards[0]["allocatedComputeMilli"] == 800
    assert [(p["name"], p["mode"]) for p in cards[2]["pods"]] == [("whole-e", "whole")]
    assert cards[2]["allocatedMemoryMiB"] == mc.A100_MIB
    assert [(u["name"], u["reason"]) for u in a100["unplacedPods"]] == [
        ("ghost", "unknown-card"),
        ("whole-d", "no-decision"),
    ]
    assert a100["totals"]["unplacedWholeGpus"] == 1
    legacy = by_name(doc["nodes"], "legacy")
    assert legacy["inventory"] == "missing" and legacy["totals"]["gpus"] == 4
    assert doc["cpuOnlyNodes"] == 1
    assert doc["totals"]["gpus"] == 18
    assert doc["totals"]["allocatedMemoryMiB"] == sum(
        n["totals"]["allocatedMemoryMiB"] for n in doc["nodes"]
    )
    assert {(p["name"], p["state"]) for p in doc["pending"]} == {
        ("binding", "binding"),
        ("queued", "unscheduled"),
    }
    assert {w["kind"] for w in doc["warnings"]} == {
        "overcommitted-card",
        "unknown-card",
        "unhealthy-card-in-use",
        "missing-inventory",
    }


def test_a_pod_created_through_the_api_shows_up_on_its_card(
    apiserver: ServerThread, kubeconfig: Path
) -> None:
    with apiserver.client() as client:
        client.create(RawPod(mc.shared_pod("late", "ml", "sick", 0, 4096, 250)))
    doc = inspect_json(kubeconfig, "--node", "sick")
    card0 = by_name(doc["nodes"], "sick")["cards"][0]
    assert [p["name"] for p in card0["pods"]] == ["late"]
    assert card0["allocatedMemoryMiB"] == 4096


def test_table_output_names_every_card_pod_total_and_warning(kubeconfig: Path) -> None:
    result = run("--kubeconfig", str(kubeconfig), "--no-usage")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in (
        "node a100 (10.0.0.1)",
        "ml/train-a, ml/train-b",
        "ml/whole-d (1 GPU(s), whole GPU(s) on cards not known",
        "no inventory published, 4 GPU(s) advertised",
        "UNHEALTHY",
        "OVERCOMMITTED",
        "cluster: 4 GPU node(s), 18 GPU(s)",
        "pending GPU pods",
        "ml/queued",
        "warnings (4)",
    ):
        assert text in out, text


def test_wide_output_adds_uuids_and_per_pod_shares(kubeconfig: Path) -> None:
    result = run("--kubeconfig", str(kubeconfig), "--no-usage", "-o", "wide")
    assert result.exit_code == 0, result.output
    assert mc.uuid("a100", 0) in result.stdout
    assert "ml/train-a [20Gi, 30%]" in result.stdout


def test_node_filter_shows_only_that_node(kubeconfig: Path) -> None:
    doc = inspect_json(kubeconfig, "--node", "mixed")
    assert [n["name"] for n in doc["nodes"]] == ["mixed"]
    assert doc["filters"] == {"nodes": ["mixed"], "namespace": ""}
    assert doc["totals"]["gpus"] == 4
    assert [w["kind"] for w in doc["warnings"]] == ["overcommitted-card"]


def test_a_node_filter_lists_only_that_nodes_objects_with_the_same_result(
    apiserver: ServerThread, kubeconfig: Path
) -> None:
    whole = inspect_json(kubeconfig)
    apiserver.server.request_log.clear()
    narrow = inspect_json(kubeconfig, "--node", "a100")
    selectors = sorted(
        (r.resource, r.params.get("fieldSelector", ""))
        for r in apiserver.server.request_log
        if r.verb == "list"
    )
    assert selectors == [
        ("nodes", "metadata.name=a100"),
        ("pods", "spec.nodeName="),
        ("pods", "spec.nodeName=a100"),
    ]
    assert narrow["nodes"] == [by_name(whole["nodes"], "a100")]
    # The decided pod still waiting for its binding is found through the unbound list.
    assert [p["name"] for p in narrow["pending"]] == ["binding"]


def test_namespace_filter_shows_only_that_namespaces_pods(kubeconfig: Path) -> None:
    doc = inspect_json(kubeconfig, "-n", "web")
    listed = [p["namespace"] for n in doc["nodes"] for c in n["cards"] for p in c["pods"]] + [
        u["namespace"] for n in doc["nodes"] for u in n["unplacedPods"]
    ]
    assert listed and set(listed) == {"web"}
    # Nodes with none of its pods stay: their cards are what the namespace could still get.
    assert [n["name"] for n in doc["nodes"]] == ["a100", "legacy", "mixed", "sick"]
    # The over-committed T4 still shows both pods' memory.
    assert by_name(doc["nodes"], "mixed")["cards"][3]["allocatedMemoryMiB"] == 10240 + 6144


def test_a_namespace_without_pods_still_shows_every_gpu_node(kubeconfig: Path) -> None:
    result = run("--kubeconfig", str(kubeconfig), "--no-usage", "-n", "nobody-here")
    assert result.exit_code == 0, result.output
    assert "no GPU nodes match" not in result.stdout
    for name in ("a100", "legacy", "mixed", "sick"):
        assert name in result.stdout


def test_used_memory_comes_from_each_nodes_exporter(kubeconfig: Path) -> None:
    card0 = mc.uuid("a100", 0)
    page = NodePage(
        "a100",
        gpu_used_bytes={(0, card0): 45000 * MIB, (1, mc.uuid("a100", 1)): 1000 * MIB},
        gpu_util={(0, card0): 0.9},
        pod_used_bytes={("ml", "train-a", 0, card0): 21000 * MIB},
        pod_over={("ml", "train-a", 0, card0): 1.0},
    )
    with serve_metrics({"a100": page}) as metrics:
        result = run(
            "--kubeconfig",
            str(kubeconfig),
            "-o",
            "json",
            "--exporter-url-template",
            metrics.url + "/{node}/metrics",
            "--exporter-timeout",
            "5",
        )
        assert result.exit_code == 0, result.output
        asked = sorted(metrics.requests)
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, load_schema())
    assert asked == sorted(f"/{n}/metrics" for n in ("a100", "legacy", "mixed", "sick"))
    a100 = by_name(doc["nodes"], "a100")
    assert a100["usage"] == "ok"
    assert [c["usedMemoryMiB"] for c in a100["cards"][:3]] == [45000, 1000, None]
    assert a100["cards"][0]["utilizationRatio"] == 0.9
    train_a = a100["cards"][0]["pods"][0]
    assert (train_a["name"], train_a["usedMemoryMiB"], train_a["overShare"]) == (
        "train-a",
        21000,
        True,
    )
    assert a100["totals"]["usedMemoryMiB"] == 46000
    mixed = by_name(doc["nodes"], "mixed")
    assert mixed["usage"] == "unavailable" and mixed["usageError"] == "HTTP 404"
    assert "over-share" in {w["kind"] for w in doc["warnings"]}


def test_a_pod_without_a_decision_is_shown_on_the_card_the_nodes_kubelet_names(
    kubeconfig: Path,
) -> None:
    card6 = mc.uuid("a100", 6)
    page = NodePage("a100", pod_allocated={("ml", "whole-d", "main", 6, card6): 1.0})
    with serve_metrics({"a100": page}) as metrics:
        result = run(
            "--kubeconfig",
            str(kubeconfig),
            "--exporter-url-template",
            metrics.url + "/{node}/metrics",
            "--exporter-timeout",
            "5",
        )
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()]
    a100 = rows.index(next(r for r in rows if r[:2] == ["node", "a100"]))
    card_row = next(r for r in rows[a100:] if r[:1] == ["6"])
    assert " ".join(card_row).endswith("ml/whole-d (per kubelet)")
    assert "whole GPU(s) on cards not known" not in result.stdout


def test_an_unreachable_exporter_shows_a_question_mark(kubeconfig: Path) -> None:
    with serve_metrics({}, {}) as metrics:
        result = run(
            "--kubeconfig",
            str(kubeconfig),
            "--node",
            "sick",
            "--exporter-url-template",
            metrics.url + "/{node}/metrics",
        )
    assert result.exit_code == 0, result.output
    card_rows = [line for line in result.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(card_rows) == 2 and all(" ? " in row for row in card_rows)
    assert "exporter unavailable: HTTP 404" in result.stdout


def test_a_bad_exporter_url_template_is_a_usage_error(kubeconfig: Path) -> None:
    result = run("--kubeconfig", str(kubeconfig), "--exporter-url-template", "http://{ip}/m")
    assert result.exit_code == 2
    assert "bad placeholder" in result.stderr


def test_the_exporter_url_uses_the_node_agent_pods_ip(
    apiserver: ServerThread, kubeconfig: Path
) -> None:
    # The agent pod on "sick" reports 127.0.0.1 as its IP, so {pod_ip} reaches our server.
    agent = make_pod(
        "agent-sick",
        "default",
        node_name="sick",
        labels={"app.kubernetes.io/name": "kubegpu-node-agent"},
    )
    agent["status"] = {"phase": "Running", "podIP": "127.0.0.1"}
    apiserver.store.put("pods", agent)
    page = NodePage("sick", gpu_used_bytes={(0, mc.uuid("sick", 0)): 512 * MIB})
    with serve_metrics({"sick": page}) as metrics:
        port = metrics.url.rsplit(":", 1)[1]
        doc = json.loads(
            run(
                "--kubeconfig",
                str(kubeconfig),
                "-o",
                "json",
                "--node",
                "sick",
                "--exporter-url-template",
                "http://{pod_ip}:" + port + "/{node}/metrics",
            ).stdout
        )
    assert doc["nodes"][0]["cards"][0]["usedMemoryMiB"] == 512


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_an_unreachable_cluster_exits_1_with_a_message(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{free_port()}")
    result = CliRunner().invoke(cli, ["inspect", "--kubeconfig", str(path)])
    assert result.exit_code == 1
    assert "cannot reach the Kubernetes API server at http://127.0.0.1:" in result.stderr
    assert "Traceback" not in result.output


def test_a_missing_kubeconfig_exits_2_with_a_message(tmp_path: Path) -> None:
    # The user's to fix, so a usage error (2), unlike a cluster that does not answer (1).
    result = CliRunner().invoke(
        cli, ["inspect", "--kubeconfig", str(tmp_path / "nope")], catch_exceptions=False
    )
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_an_error_answer_from_the_api_server_exits_1_with_its_code(
    apiserver: ServerThread, tmp_path: Path
) -> None:
    # A server URL with a wrong path prefix: every request answers a 404 Status.
    path = write_kubeconfig(tmp_path / "kc", apiserver.url + "/not-the-api")
    result = run("--kubeconfig", str(path))
    assert result.exit_code == 1
    assert "answered 404" in result.stderr
    assert "Traceback" not in result.output


def test_the_kubectl_plugin_group_parses_the_same_arguments(kubeconfig: Path) -> None:
    result = CliRunner().invoke(
        kubectl_gpu,
        ["inspect", "--kubeconfig", str(kubeconfig), "--no-usage", "-o", "json", "--node", "sick"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    plugin = json.loads(result.stdout)
    direct = inspect_json(kubeconfig, "--node", "sick")
    plugin.pop("generatedAt")
    direct.pop("generatedAt")
    assert plugin == direct


def plugin_env(kubeconfig: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["KUBECONFIG"] = str(kubeconfig)
    env.pop("KUBEGPU_INSPECT_OUTPUT", None)
    return env


def test_kubectl_gpu_inspect_runs_the_installed_plugin(kubeconfig: Path) -> None:
    import subprocess

    plugin = shutil.which("kubectl-gpu", path=str(BIN))
    assert plugin, "kubectl-gpu is not installed: pip install -e . (pyproject [project.scripts])"
    kubectl = shutil.which("kubectl", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    command = [kubectl, "gpu"] if kubectl else [plugin]
    done = subprocess.run(
        [*command, "inspect", "-o", "json", "--no-usage", "--node", "a100"],
        env=plugin_env(kubeconfig),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    jsonschema.validate(doc, load_schema())
    assert [n["name"] for n in doc["nodes"]] == ["a100"]


@pytest.mark.parametrize("command", ["kubegpu", "kubectl-gpu"])
def test_unreachable_cluster_from_the_installed_scripts_exits_1(
    command: str, tmp_path: Path
) -> None:
    import subprocess

    path = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{free_port()}")
    script = shutil.which(command, path=str(BIN))
    assert script
    done = subprocess.run(
        [script, "inspect"],
        env=plugin_env(path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: cannot reach the Kubernetes API server")
    assert "Traceback" not in done.stderr
