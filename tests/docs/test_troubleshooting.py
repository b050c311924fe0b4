"""Every user-facing error message of the components scanned has an entry in troubleshooting.md."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubegpu.docgen.messages import Message, find_messages, normalise, stable_fragment

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "kubegpu"
GUIDE = REPO / "docs" / "troubleshooting.md"


@dataclass(frozen=True)
class Scope:
    name: str
    paths: tuple[str, ...]  # files or folders under src/kubegpu
    exceptions: tuple[str, ...]
    logs: bool = False
    hint_tables: bool = False
    exclude: tuple[str, ...] = ()

    def files(self) -> list[Path]:
        found: list[Path] = []
        for rel in self.paths:
            path = SRC / rel
            found += sorted(path.glob("*.py")) if path.is_dir() else [path]
        return [f for f in found if f.name not in self.exclude]

    def messages(self) -> list[Message]:
        return find_messages(
            self.files(), self.exceptions, logs=self.logs, hint_tables=self.hint_tables
        )


SCOPES = (
    Scope("node agent config", ("config",), ("ConfigError", "ValueError")),
    Scope(
        "node agent",
        # probes.py: the health endpoints, the DRA driver's too.
        ("kubelet", "probes.py", "cli/device_plugin.py", "roles/node_agent.py"),
        (
            "AllocationError",
            "AllocationRefused",
            "PlanError",
            "MigLayoutError",
            "LedgerError",
            "ProbeServerError",
            "ExporterServerError",
        ),
        logs=True,
        exclude=("protogen.py",),  # a developer tool, not the agent
    ),
    Scope(
        "GPU backends",
        ("inventory",),
        ("InventoryError", "FakeSpecError", "FakeControlError"),
        logs=True,
        hint_tables=True,
    ),
    Scope("health environment", ("core/health.py",), ("ValueError",)),
    Scope("preferred allocation", ("placement/topology.py",), ("PreferenceError",)),
    Scope("MPS supervision", ("enforcement",), (), logs=True),
    Scope("extender settings", ("config/extender.py",), ("ExtenderConfigError",)),
    Scope("TLS files", ("tls.py",), ("TlsFileError",)),
    Scope("kubeconfig", ("kube/client.py",), ("KubeconfigError",)),
    Scope("pod requests", ("sharing/resources.py",), ("RequestError", "ValueError")),
    Scope("extender wire format", ("extender/wire.py",), ("WireError",)),
    Scope("annotations", ("sharing/annotations.py",), ("AnnotationError",)),
    Scope("cluster view", ("kube",), (), logs=True),
    Scope(
        "DRA driver",
        (
            "dra",
            "roles/dra_driver.py",
            "socket_claim.py",
            "kube/resource_claims.py",
            "kube/gpu_config.py",
        ),
        (
            "CheckpointError",
            "ConfigRefused",
            "GpuConfigError",
            "_Malformed",
            "PrepareError",
            "SlicePublishError",
            "SocketInUse",
            "ClaimLookupError",
        ),
        logs=True,
    ),
    # Not RuntimeError: the exporter raises it only for a programming error (a HealthFeed
    # watched twice), which no configuration can cause.
    Scope(
        "exporter",
        ("exporter", "cli/exporter.py", "roles/exporter.py"),
        ("ValueError", "BadParameter", "ExporterServerError"),
        logs=True,
    ),
    Scope(
        "inspect",
        ("inspect",),
        ("ClusterError", "UsageParseError", "ValueError", "BadParameter"),
        logs=True,
    ),
    Scope(
        "demo",
        ("demo",),
        # Child.failure() builds the ComponentError a child's exit or timeout raises.
        ("DemoError", "ScenarioError", "ComponentError", "failure", "UsageError"),
        logs=True,
    ),
)


@pytest.mark.parametrize("scope", SCOPES, ids=lambda s: s.name)
def test_every_message_of_the_scope_has_an_entry_in_the_guide(scope: Scope) -> None:
    guide = normalise(GUIDE.read_text(encoding="utf-8"))
    messages = scope.messages()
    assert messages, f"no messages found in {scope.paths}: has the code moved?"
    missing = [m for m in messages if normalise(m.fragment) not in guide]
    assert not missing, (
        "docs/troubleshooting.md has no entry for these messages (add the message, when it "
        "happens and what to do; the fragment shown must appear verbatim):\n"
        + "\n".join(f"  {m.file}:{m.line} {m.kind}: {m.fragment!r}" for m in missing)
    )


def test_the_scanner_finds_the_messages_it_is_meant_to_guard() -> None:
    # If the scanner silently found nothing useful, the test above would pass vacuously.
    by_scope = {s.name: {m.fragment for m in s.messages()} for s in SCOPES}
    assert "the NVML Python bindings are not installed" in by_scope["GPU backends"]
    assert "GPU is lost" in by_scope["GPU backends"]  # from the (message, hint) table
    assert any("no pending pod has a kubegpu decision" in f for f in by_scope["node agent"])
    assert "no GPU matches any resource; advertising nothing" in by_scope["node agent"]
    assert "at least one GPU resource is required" in by_scope["node agent config"]
    assert len(by_scope["node agent"]) >= 15
    assert "NodeNames must hold non-empty strings" in by_scope["extender wire format"]
    assert "gpus is empty" in by_scope["annotations"]
    assert "watch loop failed; relisting" in by_scope["cluster view"]
    assert "not a checkpoint (JSON nested too deeply" in by_scope["DRA driver"]
    assert "cannot read it from the API server" in by_scope["DRA driver"]
    assert "the api pod directory needs API access" in by_scope["exporter"]
    assert "expected KEY=VALUE" in by_scope["inspect"]
    assert any("not a Prometheus metrics page" in f for f in by_scope["inspect"])
    assert any("must be a non-negative integer" in f for f in by_scope["demo"])
    assert any("exited with code" in f for f in by_scope["demo"])  # Child.failure()


@pytest.mark.parametrize(
    ("source", "percent", "expected"),
    [
        ('f"unknown device id {d!r} for resource {r}"', False, "unknown device id"),
        ('f"{where}: a GPU share needs both {m} (MiB) and "', False, "a GPU share needs both"),
        ('"node %s: cannot watch %s: %s"', True, "cannot watch"),
        ('"plain text without values"', False, "plain text without values"),
        ('f"{a}: {b}"', False, None),
        ('"x" + f"{y} is shared twice"', False, "is shared twice"),
    ],
    ids=["fstring", "fstring-prefix-placeholder", "percent", "constant", "nothing", "concat"],
)
def test_the_stable_fragment_is_the_longest_literal_run(
    source: str, percent: bool, expected: str | None
) -> None:
    node = ast.parse(source, mode="eval").body
    assert stable_fragment(node, percent_style=percent) == expected


def test_hints_passed_by_keyword_are_found_too(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n"
        "    raise InventoryError(f'cannot open {x}', hint='is the driver loaded at all?')\n",
        encoding="utf-8",
    )
    found = {m.fragment for m in find_messages([module], ("InventoryError",))}
    assert found == {"cannot open", "is the driver loaded at all?"}
