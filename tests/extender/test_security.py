"""HTTPS with a throwaway CA, client-certificate verification (kube-scheduler's extender
tlsConfig), and the refusal to serve plain HTTP off loopback."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kubegpu.config.extender import ExtenderConfig, ExtenderConfigError
from kubegpu.testing.apiserver import FakeApiServer
from tests.extender.cluster import filter_args, gpu_node, running_extender, shared_pod


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if usage == ExtendedKeyUsageOID.SERVER_AUTH:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    ca_key = _key()
    ca = _cert("kubegpu-test-ca", ca_key, None, ca_key, ca=True)
    _write(tmp_path / "ca", ca, ca_key)
    server_key, client_key = _key(), _key()
    server = _cert("extender", server_key, ca, ca_key, usage=ExtendedKeyUsageOID.SERVER_AUTH)
    client = _cert("kube-scheduler", client_key, ca, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    _write(tmp_path / "server", server, server_key)
    _write(tmp_path / "client", client, client_key)
    return tmp_path


def client_context(pki: Path, *, with_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if with_cert:
        context.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    return context


async def test_serves_https_and_requires_a_client_certificate(pki: Path) -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a"))
        async with running_extender(
            server,
            tls_cert_file=pki / "server.crt",
            tls_key_file=pki / "server.key",
            client_ca_file=pki / "ca.crt",
        ) as ext:
            assert ext.url.startswith("https://127.0.0.1:")
            body = filter_args(shared_pod("p", 1024, 100), ["node-a"])
            async with aiohttp.ClientSession() as http:
                async with http.post(
                    f"{ext.url}/filter", json=body, ssl=client_context(pki, with_cert=True)
                ) as response:
                    assert response.status == 200
                    assert (await response.json())["NodeNames"] == ["node-a"]
                with pytest.raises(aiohttp.ClientError):
                    async with http.post(
                        f"{ext.url}/filter", json=body, ssl=client_context(pki, with_cert=False)
                    ) as response:
                        await response.read()
                with pytest.raises(aiohttp.ClientError):  # plain HTTP to a TLS port
                    async with http.post(
                        ext.url.replace("https", "http") + "/filter", json=body
                    ) as response:
                        await response.read()


async def test_the_metrics_listener_is_plain_http_beside_the_mutual_tls_verbs(pki: Path) -> None:
    # What the default-scheduler overlay runs: the verbs behind client certificates, and the
    # read-only endpoints in plain HTTP for Prometheus and the kubelet's probes.
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a"))
        async with running_extender(
            server,
            tls_cert_file=pki / "server.crt",
            tls_key_file=pki / "server.key",
            client_ca_file=pki / "ca.crt",
            metrics_port=0,
        ) as ext:
            assert ext.metrics_url is not None and ext.metrics_url.startswith("http://")
            body = filter_args(shared_pod("p", 1024, 100), ["node-a"])
            async with aiohttp.ClientSession() as http:
                for path in ("/healthz", "/readyz", "/metrics"):
                    async with http.get(f"{ext.metrics_url}{path}") as response:
                        assert response.status == 200, path
                # No client certificate and no TLS: the verbs are not there at all ...
                async with http.post(f"{ext.metrics_url}/filter", json=body) as response:
                    assert response.status == 404
                # ... and the verbs' listener still demands a certificate.
                with pytest.raises(aiohttp.ClientError):
                    async with http.post(
                        f"{ext.url}/filter", json=body, ssl=client_context(pki, with_cert=False)
                    ) as response:
                        await response.read()


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"host": "0.0.0.0"}, "refusing plain HTTP on 0.0.0.0"),
        ({"host": "10.0.0.5"}, "refusing plain HTTP"),
        ({"tls_cert_file": Path("a.crt")}, "go together"),
        ({"client_ca_file": Path("ca.crt")}, "needs tls-cert-file"),
        ({"policy": "fastest"}, "policy 'fastest' unknown"),
    ],
)
def test_bad_settings_are_refused_with_the_setting_named(
    settings: dict[str, object], problem: str
) -> None:
    with pytest.raises(ExtenderConfigError, match=problem):
        ExtenderConfig(**settings).validate()  # type: ignore[arg-type]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_plain_http_is_allowed_on_loopback(host: str) -> None:
    ExtenderConfig(host=host).validate()


def test_plain_http_elsewhere_needs_the_explicit_flag() -> None:
    ExtenderConfig(host="0.0.0.0", allow_insecure_http=True).validate()


def test_the_command_exits_2_on_plain_http_off_loopback() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kubegpu", "extender", "--host", "0.0.0.0", "--leader-lease=none"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "refusing plain HTTP on 0.0.0.0" in result.stderr
