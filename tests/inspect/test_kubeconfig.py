"""Kubeconfig resolution in kubectl's order: flag, $KUBECONFIG (merged), ~/.kube/config,
in-cluster."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from kubegpu.kube.cluster_reader import ClusterError, make_client, resolve_kubeconfig
from kubegpu.testing.kubeconfig import kubeconfig_dict, write_kubeconfig


def server_of(path_or_none: object) -> str:
    config = resolve_kubeconfig(**path_or_none)  # type: ignore[arg-type]
    single = config.get()
    assert single is not None
    return str(single.cluster.server)


def named(path: Path, name: str, server: str, *, current: bool = True) -> Path:
    doc = kubeconfig_dict(server)
    for section in ("clusters", "users", "contexts"):
        for item in doc[section]:
            item["name"] = name
    doc["contexts"][0]["context"].update(cluster=name, user=name)
    doc["current-context"] = name if current else ""
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_flag_wins_over_the_environment_and_home(tmp_path: Path) -> None:
    flag = write_kubeconfig(tmp_path / "flag", "http://flag:1")
    env = write_kubeconfig(tmp_path / "env", "http://env:1")
    home = tmp_path / "home"
    write_kubeconfig(home / ".kube" / "config", "http://home:1")
    kwargs = {"explicit": flag, "environ": {"KUBECONFIG": str(env)}, "home": home}
    assert server_of(kwargs) == "http://flag:1"


def test_kubeconfig_env_wins_over_home(tmp_path: Path) -> None:
    env = write_kubeconfig(tmp_path / "env", "http://env:1")
    home = tmp_path / "home"
    write_kubeconfig(home / ".kube" / "config", "http://home:1")
    assert server_of({"environ": {"KUBECONFIG": str(env)}, "home": home}) == "http://env:1"


def test_several_kubeconfig_files_merge_first_one_wins(tmp_path: Path) -> None:
    first = named(tmp_path / "a", "alpha", "http://alpha:1", current=False)
    second = named(tmp_path / "b", "beta", "http://beta:1")
    missing = tmp_path / "missing"
    env = {"KUBECONFIG": os.pathsep.join(map(str, (missing, first, second)))}
    config = resolve_kubeconfig(environ=env, home=tmp_path)
    # current-context comes from the first file that sets one (the second here) ...
    current = config.get()
    assert current is not None and current.cluster.server == "http://beta:1"
    # ... and contexts of every file are there.
    alpha = config.get(context_name="alpha")
    assert alpha is not None and alpha.cluster.server == "http://alpha:1"


def test_home_config_is_used_when_kubeconfig_is_unset(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_kubeconfig(home / ".kube" / "config", "http://home:1")
    assert server_of({"environ": {}, "home": home}) == "http://home:1"


def test_in_cluster_service_account_is_the_last_resort(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("t0ken")
    (account / "namespace").write_text("gpu-ops")
    (account / "ca.crt").write_text("")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # lightkube reads these from os.environ itself
    config = resolve_kubeconfig(environ=env, home=tmp_path / "nohome", service_account=account)
    single = config.get()
    assert single is not None and single.cluster.server == "https://10.96.0.1:443"


def test_no_configuration_anywhere_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="no kubeconfig found"):
        resolve_kubeconfig(environ={}, home=tmp_path, service_account=tmp_path / "none")


def test_an_unknown_context_is_a_clear_error(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", "http://x:1")
    with pytest.raises(ClusterError, match="kubeconfig"):
        make_client(path, context="nope")
