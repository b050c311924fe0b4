"""Server TLS contexts from PEM files, with every failure naming the file and option at fault.

``ssl`` reports a missing file as ``FileNotFoundError`` and everything else (not PEM, a key for
another certificate, an encrypted key) as ``SSLError: [SSL] PEM lib``, naming neither file nor
setting. Servers build their context here before any other I/O, so bad files end the process
at start with a line a person can act on, rather than a traceback after the listener or the
API connection is already up.
"""

from __future__ import annotations

import ssl
from pathlib import Path


class TlsFileError(ValueError):
    """A certificate, key or CA file cannot be used; the message names it and the option."""


def _read(option: str, path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TlsFileError(f"{option} {path}: cannot read ({exc.strerror or exc})") from None
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise TlsFileError(f"{option} {path}: not a PEM file (it is not ASCII text)") from None


def _check_certificates(option: str, path: Path, text: str) -> None:
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        probe.load_verify_locations(cadata=text)
    except (ssl.SSLError, ValueError):
        raise TlsFileError(
            f"{option} {path}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)"
        ) from None


def server_context(
    cert_file: Path,
    key_file: Path,
    client_ca_file: Path | None = None,
    *,
    options: tuple[str, str, str] = ("tls-cert-file", "tls-key-file", "client-ca-file"),
) -> ssl.SSLContext:
    """A TLS 1.2+ server context serving ``cert_file`` with ``key_file``; with
    ``client_ca_file``, clients must present a certificate it signed. ``options`` are the names
    the messages use for the three files (flag names, or settings keys)."""
    cert_option, key_option, ca_option = options
    _check_certificates(cert_option, cert_file, _read(cert_option, cert_file))
    key_text = _read(key_option, key_file)
    if "PRIVATE KEY-----" not in key_text:
        raise TlsFileError(f"{key_option} {key_file}: no PEM private key in it")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(cert_file), str(key_file), password=_no_password)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise TlsFileError(
                f"{key_option} {key_file} is not the key of the certificate in "
                f"{cert_option} {cert_file}"
            ) from None
        raise TlsFileError(
            f"{key_option} {key_file}: cannot use it with {cert_option} {cert_file} "
            f"({exc.reason or exc})"
        ) from None
    except _EncryptedKey:
        raise TlsFileError(
            f"{key_option} {key_file}: the key is encrypted; give an unencrypted key"
        ) from None
    if client_ca_file is not None:
        _check_certificates(ca_option, client_ca_file, _read(ca_option, client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=str(client_ca_file))
    return context


class _EncryptedKey(Exception):
    pass


def _no_password() -> str:
    # Called by OpenSSL only for an encrypted key; without it ssl would prompt on the terminal.
    raise _EncryptedKey
