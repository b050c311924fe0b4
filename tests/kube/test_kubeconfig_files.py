"""A kubeconfig's certificates and key are checked at start (``kubegpu.kube.client``): a file
that is not PEM, or a key that does not match its certificate, ends the role with one line
naming it, whether the kubeconfig names files or carries them inline (``*-data``)."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec

from kubegpu.kube import client
from kubegpu.kube.client import KubeconfigError, load_kubeconfig_file
from tests.cli.corpus import key_pem, self_signed


def key_and_cert() -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    return key_pem(key), self_signed(key)


def write_kubeconfig(folder: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    path = folder / "kubeconfig"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def inline(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, bytes]:
    _, ca = key_and_cert()
    key, cert = key_and_cert()
    _, other_cert = key_and_cert()
    files = {"ca.crt": ca, "user.key": key, "user.crt": cert, "other.crt": other_cert}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "junk.crt").write_text("not a certificate\n")
    return files


def test_good_files_and_good_inline_data_load(tmp_path: Path, pki: dict[str, bytes]) -> None:
    by_file = write_kubeconfig(
        tmp_path,
        {"certificate-authority": "ca.crt"},
        {"client-certificate": "user.crt", "client-key": "user.key"},
    )
    assert load_kubeconfig_file(by_file).current_context == "x"
    inline_data = write_kubeconfig(
        tmp_path,
        {"certificate-authority-data": inline(pki["ca.crt"])},
        {
            "client-certificate-data": inline(pki["user.crt"]),
            "client-key-data": inline(pki["user.key"]),
        },
    )
    assert load_kubeconfig_file(inline_data).current_context == "x"


@pytest.mark.parametrize(
    ("cluster", "user", "names"),
    [
        ({"certificate-authority": "junk.crt"}, {"token": "t"}, "certificate-authority junk.crt"),
        (
            {},
            {"client-certificate": "other.crt", "client-key": "user.key"},
            "client-certificate other.crt and client-key user.key",
        ),
        (
            {},
            {"client-certificate": "junk.crt", "client-key": "user.key"},
            "client-certificate junk.crt",
        ),
    ],
)
def test_a_bad_file_is_named(
    tmp_path: Path, pki: dict[str, bytes], cluster: dict[str, Any], user: dict[str, Any], names: str
) -> None:
    path = write_kubeconfig(tmp_path, cluster, user)
    with pytest.raises(KubeconfigError, match=f"kubeconfig {path}: {names}"):
        load_kubeconfig_file(path)


@pytest.mark.parametrize("field", ["certificate-authority-data", "client-key-data"])
def test_bad_inline_data_is_refused_naming_the_context(
    tmp_path: Path, pki: dict[str, bytes], field: str
) -> None:
    cluster = {"certificate-authority-data": inline(pki["ca.crt"])}
    user = {
        "client-certificate-data": inline(pki["user.crt"]),
        "client-key-data": inline(pki["user.key"]),
    }
    if field in cluster:
        cluster[field] = inline(b"not a certificate\n")
    else:
        user[field] = inline(pki["other.crt"])  # not the certificate's key
    path = write_kubeconfig(tmp_path, cluster, user)
    with pytest.raises(KubeconfigError, match="cannot load the certificates or key of context 'x'"):
        load_kubeconfig_file(path)


def test_a_context_with_nothing_inline_loads_no_default_certificate_store(
    tmp_path: Path, pki: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Loading the system's CA bundle (what lightkube's verify_cluster does for a cluster with no
    # CA of its own) cost the extender ~140 ms of its time to Ready, and checks nothing.
    loaded: list[object] = []
    real_load = ssl.SSLContext.load_default_certs

    def counting_load(self: ssl.SSLContext, *args: Any) -> None:
        loaded.append(self)
        real_load(self, *args)

    verified: list[object] = []
    real_verify = client.verify_cluster

    def counting_verify(*args: Any) -> ssl.SSLContext:
        verified.append(args)
        return real_verify(*args)

    monkeypatch.setattr(ssl.SSLContext, "load_default_certs", counting_load)
    monkeypatch.setattr(client, "verify_cluster", counting_verify)
    path = write_kubeconfig(
        tmp_path, {}, {"client-certificate": "user.crt", "client-key": "user.key"}
    )
    load_kubeconfig_file(path)
    assert loaded == []
    assert verified == []
    # Inline data is checked through lightkube's own loader.
    inline_path = write_kubeconfig(
        tmp_path,
        {},
        {
            "client-certificate-data": inline(pki["user.crt"]),
            "client-key-data": inline(pki["user.key"]),
        },
    )
    load_kubeconfig_file(inline_path)
    assert len(verified) == 1
