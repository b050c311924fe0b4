"""Listen addresses as narrow as each role allows: every ``kubegpu`` listener defaults to
loopback (or to off), and the manifests that need one to face the pod network say so.

The peer webhook is called by the API server through its Service, so the chart and the
kustomize component pass ``--host=0.0.0.0``; its own default is loopback, so that a webhook
started by hand with plain HTTP (loopback only) or with TLS does not listen on every address
unasked.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import click

from kubegpu.cli.main import cli
from tests.deploy.manifests import container, find_prefixed, render

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "deploy" / "helm" / "kubegpu" / "templates" / "peer-compat.yaml"


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _leaf_commands() -> list[tuple[str, click.Command]]:
    found = []
    context = click.Context(cli)
    for name in cli.list_commands(context):
        command = cli.get_command(context, name)
        assert command is not None
        if isinstance(command, click.Group):
            sub = click.Context(command)
            found += [
                (f"{name} {n}", command.get_command(sub, n)) for n in command.list_commands(sub)
            ]
        else:
            found.append((name, command))
    return [(name, command) for name, command in found if command is not None]


def test_every_listen_option_defaults_to_loopback_or_off() -> None:
    checked, wide = [], []
    for name, command in _leaf_commands():
        for param in command.params:
            if not isinstance(param, click.Option) or param.name is None:
                continue
            if not re.search(r"(^|_)(host|listen)$", param.name):
                continue
            default = param.default
            if not isinstance(default, str) or not default:
                continue  # unset: that listener is off unless asked for
            host = default.rpartition(":")[0] if param.name.endswith("listen") else default
            checked.append(f"{name} {param.opts[0]}")
            if not _loopback(host):
                wide.append(f"kubegpu {name} {param.opts[0]} defaults to {default}")
    assert "peer-webhook --host" in checked and "exporter --listen" in checked
    assert not wide, "\n".join(wide)


def test_the_peer_webhook_manifests_listen_on_the_pod_network() -> None:
    objects = render("examples/peer-compat")
    webhook = find_prefixed(objects, "Deployment", "kubegpu-peer-webhook")
    args = container(webhook, "webhook")["args"]
    assert args[0] == "peer-webhook"
    assert "--host=0.0.0.0" in args
    # The chart's template is Go text, not YAML: its container's arguments, line by line.
    text = TEMPLATE.read_text(encoding="utf-8")
    block = text[text.index("- peer-webhook") : text.index("ports:", text.index("- peer-webhook"))]
    chart_args = [line.strip()[2:] for line in block.splitlines() if line.strip().startswith("- ")]
    assert "--host=0.0.0.0" in chart_args
    assert [a for a in chart_args if not a.startswith("--scheduler-name")] == [
        a for a in args if not a.startswith("--scheduler-name")
    ]
