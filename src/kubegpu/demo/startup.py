"""Bringing the demo's cluster up: the API server, the extender and the fake-GPU nodes.

Each component is a real ``kubegpu`` child process; every step waits until the component is
demonstrably serving (its kubeconfig written, ``/readyz`` answering, its devices registered with
the node's kubelet emulator, its inventory published, the extender seeing every node) and fails
naming the component otherwise. Separate from the replay, which starts once this is done.
"""

from __future__ import annotations

import json
import re

import yaml

from kubegpu.demo.processes import Child, kubegpu_command
from kubegpu.demo.run import START_TIMEOUT_S, DemoRun, echo
from kubegpu.demo.scenario import DEMO_LABEL, DemoPod, node_gpu_spec, pod_manifest
from kubegpu.kube import demo_api
from kubegpu.sharing.annotations import INVENTORY_ANNOTATION
from kubegpu.testing.apiserver.objects import make_node
from kubegpu.testing.kubelet import KubeletEmulator
from kubegpu.testing.scheduler import DEFAULT_SCHEDULER_NAME

AGENT_CONFIG = """\
version: v1
sharing:
  gpuShare:
    enabled: true
    slotsPerCard: {slots}
    enforcement: none
    syncIntervalS: 0.5
    reconcileIntervalS: 2
    inventoryIntervalS: 60
    podResourcesSocket: {pod_resources}
"""


def start_api_server(run: DemoRun) -> None:
    kubeconfig = run.root / "kubeconfig"
    child = run.supervisor.start(
        "fake-apiserver",
        kubegpu_command(
            "fake-apiserver",
            "--port",
            "0",
            "--kubeconfig",
            str(kubeconfig),
            log_level=run.options.child_log_level,
        ),
    )
    echo(f"fake API server: pid {child.pid}")
    run.supervisor.wait_for(
        child,
        # The server logs "listening on" before its CLI writes the kubeconfig; "written" comes
        # after the file is complete (it is renamed into place).
        lambda: kubeconfig.exists() and "kubeconfig written to" in child.tail(),
        "serving",
        START_TIMEOUT_S,
    )
    doc = yaml.safe_load(kubeconfig.read_text())
    run.kubeconfig = kubeconfig
    run.api_url = str(doc["clusters"][0]["cluster"]["server"])
    echo(f"  listening on {run.api_url}, kubeconfig {kubeconfig}")


def client_for(run: DemoRun) -> demo_api.Client:
    assert run.kubeconfig is not None
    return demo_api.sync_client(run.kubeconfig)


def register_nodes(run: DemoRun, client: demo_api.Client) -> None:
    """Create the Node objects as kubelets do at registration: create, then report status."""
    for node in run.nodes:
        doc = make_node(
            node.spec.name,
            cpu=node.spec.cpu,
            memory=node.spec.memory,
            labels={DEMO_LABEL: "true", "kubegpu.io/demo-preset": node.spec.preset},
        )
        demo_api.register_node(client, doc)


def start_extender(run: DemoRun) -> Child:
    assert run.kubeconfig is not None
    child = run.supervisor.start(
        "extender",
        kubegpu_command(
            "extender",
            "--port",
            "0",
            "--kubeconfig",
            str(run.kubeconfig),
            "--policy",
            run.options.policy,
            # One extender and one scheduler stand-in for the demo's lifetime: nothing to guard.
            "--leader-lease",
            "none",
            log_level=run.options.child_log_level,
        ),
        env=_no_proxy(),
    )
    echo(f"scheduler extender: pid {child.pid} (policy {run.options.policy})")
    pattern = re.compile(r"kubegpu extender on (https?://\S+?),? policy")

    def listening() -> bool:
        match = pattern.search(child.tail(20000))
        if match:
            run.extender_url = match.group(1)
        return bool(match)

    run.supervisor.wait_for(child, listening, "listening", START_TIMEOUT_S)
    run.supervisor.wait_for(
        child, lambda: _http_ok(f"{run.extender_url}/readyz"), "ready (/readyz)", START_TIMEOUT_S
    )
    echo(f"  serving filter/prioritize/bind on {run.extender_url}")
    return child


def _no_proxy() -> dict[str, str]:
    # Everything is on loopback; a proxy from the user's environment must not be used.
    return {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def _http_ok(url: str) -> bool:
    import urllib.request

    handler = urllib.request.ProxyHandler({})
    try:
        with urllib.request.build_opener(handler).open(url, timeout=2) as response:
            return int(response.status) == 200
    except OSError:
        return False


def start_nodes(run: DemoRun) -> None:
    assert run.kubeconfig is not None
    for node in run.nodes:
        d = node.directory
        d.mkdir(parents=True)
        (d / "gpus.yaml").write_text(node_gpu_spec(node.spec))
        (d / "agent.yaml").write_text(
            AGENT_CONFIG.format(slots=run.options.slots_per_card, pod_resources=d / "pr.sock")
        )
        with run.supervisor.guard.critical():  # a started emulator is one run.close() stops
            node.emulator.start()
        node.agent = run.supervisor.start(
            f"node-agent-{node.spec.name}",
            kubegpu_command(
                "device-plugin",
                "--backend",
                "fake",
                "--fake-gpus",
                str(d / "gpus.yaml"),
                "--fake-control",
                str(d / "ctl.sock"),
                "--kubelet-dir",
                str(d / "dp"),
                "--config",
                str(d / "agent.yaml"),
                "--node-name",
                node.spec.name,
                "--kubeconfig",
                str(run.kubeconfig),
                log_level=run.options.child_log_level,
            ),
            env=_no_proxy(),
        )
        echo(
            f"node {node.spec.name} ({node.spec.preset}): node agent pid {node.agent.pid}, "
            f"kubelet emulator on {node.emulator.kubelet_socket}"
        )


def wait_for_nodes(run: DemoRun, client: demo_api.Client) -> None:
    names = run.names
    for node in run.nodes:
        assert node.agent is not None
        emulator = node.emulator

        def registered(emulator: KubeletEmulator = emulator) -> bool:
            return all(emulator.allocatable(r) > 0 for r in (names.whole_gpu, names.share_slot))

        run.supervisor.wait_for(
            node.agent, registered, "registered with its kubelet", START_TIMEOUT_S
        )

        def published(name: str = node.spec.name) -> bool:
            return INVENTORY_ANNOTATION in demo_api.node_annotations(client, name)

        run.supervisor.wait_for(
            node.agent, published, "publishing its GPU inventory", START_TIMEOUT_S, poll_s=0.2
        )
        whole = emulator.allocatable(names.whole_gpu)
        slots = emulator.allocatable(names.share_slot)
        echo(
            f"  {node.spec.name}: {whole} x {names.whole_gpu}, {slots} x {names.share_slot} "
            "advertised; inventory published"
        )


def wait_for_extender_view(run: DemoRun, extender: Child) -> None:
    """Ask the extender's real /filter about a one-card pod until it sees every node's cards."""
    import urllib.request

    probe = pod_manifest(
        DemoPod("kubegpu-demo-probe", 1, 1, gpus=1), scheduler_name=DEFAULT_SCHEDULER_NAME
    )
    probe["metadata"]["uid"] = "kubegpu-demo-probe"
    node_names = [n.spec.name for n in run.nodes]
    body = json.dumps({"Pod": probe, "Nodes": None, "NodeNames": node_names}).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def sees_all() -> bool:
        request = urllib.request.Request(
            f"{run.extender_url}/filter", body, {"Content-Type": "application/json"}
        )
        try:
            with opener.open(request, timeout=5) as response:
                result = json.loads(response.read())
        except (OSError, ValueError):
            return False
        return sorted(result.get("NodeNames") or []) == sorted(node_names)

    run.supervisor.wait_for(
        extender, sees_all, "seeing every node's GPUs", START_TIMEOUT_S, poll_s=0.2
    )
