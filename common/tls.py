"""TLS between machines (docs/workers.md): the sidecar's certificate, its SHA-256 fingerprint, and clients that pin it.

* ``xpufleet start --tls`` serves HTTPS with a certificate generated once under
  ``$XPUFLEET_HOME/tls/`` (an ECDSA P-256 key, mode 0600; a self-signed certificate naming localhost, the
  loopback addresses, this machine's names and the bound address), or the one given with
  ``--tls-cert/--tls-key``.
* The fingerprint is the SHA-256 of the certificate's DER bytes, written ``sha256:AB:CD:...``. The join
  command carries it (``--fingerprint``); the agent pins it: the TLS handshake is checked against that
  digest (``aiohttp.Fingerprint``), never against a certificate authority, so a self-signed certificate
  is trusted exactly and nothing else is. A mismatch ends the connection before any byte of the request
  is sent.
* Same-machine clients (the CLI, the ComfyUI proxy, a local agent) read the fingerprint from the
  runtime file beside the session token.
"""

from __future__ import annotations

import datetime
import hashlib
import http.client
import ipaddress
import os
import re
import socket
import ssl
import urllib.request
from pathlib import Path
from typing import Any

from . import atomic

TLS_DIRNAME = "tls"
CERT_NAME = "cert.pem"
KEY_NAME = "key.pem"
CERT_DAYS = 825  # what browsers accept for a self-signed leaf; regenerated when expired
_HEX = re.compile(r"^[0-9a-f]{64}$")


class TLSConfigError(ValueError):
    """A certificate, key or fingerprint that cannot be used (the text says what to fix)."""


# --- fingerprints (pure) ------------------------------------------------------------------------------


def fingerprint_of_hex(hexdigest: str) -> str:
    """``sha256:AB:CD:...`` of a hex SHA-256 digest."""
    digest = hexdigest.upper()
    return "sha256:" + ":".join(digest[i:i + 2] for i in range(0, 64, 2))


def fingerprint_of_der(der: bytes) -> str:
    """``sha256:AB:CD:...`` of a DER certificate."""
    return fingerprint_of_hex(hashlib.sha256(der).hexdigest())


def parse_fingerprint(text: str) -> bytes:
    """The 32 digest bytes of ``sha256:AB:CD:..`` (colons, case and the prefix optional)."""
    raw = str(text).strip().lower()
    if raw.startswith("sha256:"):
        raw = raw[len("sha256:"):]
    raw = raw.replace(":", "").replace(" ", "")
    if not _HEX.match(raw):
        raise TLSConfigError(f"invalid certificate fingerprint {text!r}: give the SHA-256 the server prints, "
                             f"e.g. sha256:AB:CD:... (64 hex digits)")
    return bytes.fromhex(raw)


def normalize_fingerprint(text: str) -> str:
    """One spelling of a fingerprint (``sha256:`` and upper-case pairs)."""
    return fingerprint_of_hex(parse_fingerprint(text).hex())


def cert_fingerprint(cert_path: Path) -> str:
    """The fingerprint of the first certificate in a PEM file."""
    try:
        pem = Path(cert_path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise TLSConfigError(f"cannot read the certificate {cert_path}: {exc}") from None
    m = re.search(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", pem, re.S)
    if m is None:
        raise TLSConfigError(f"{cert_path} holds no PEM certificate")
    return fingerprint_of_der(ssl.PEM_cert_to_DER_cert(m.group(0)))


# --- the server's certificate ---------------------------------------------------------------------------


def _names(bind_host: str) -> tuple[list[str], list[str]]:
    dns = {"localhost"}
    ips = {"127.0.0.1", "::1"}
    for name in (socket.gethostname(), socket.getfqdn(), bind_host):
        if not name or name in ("0.0.0.0", "::", "*"):
            continue
        try:
            ipaddress.ip_address(name)
            ips.add(name)
        except ValueError:
            dns.add(name.lower())
    return sorted(dns), sorted(ips)


def generate_certificate(folder: Path, bind_host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate and its key in ``folder`` (kept and reused while valid)."""
    cert_path, key_path = Path(folder) / CERT_NAME, Path(folder) / KEY_NAME
    if cert_path.is_file() and key_path.is_file() and _still_valid(cert_path):
        return cert_path, key_path
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        raise TLSConfigError("generating a certificate needs the 'cryptography' package (pip install cryptography); "
                             "or give your own with --tls-cert FILE --tls-key FILE") from None
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    dns, ips = _names(bind_host)
    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"XPU Fleet sidecar on {socket.gethostname()}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(n) for n in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_bytes = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    atomic.write_bytes(key_path, key_bytes, mode=atomic.PRIVATE)
    atomic.write_bytes(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _still_valid(cert_path: Path) -> bool:
    try:
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except Exception:  # noqa: BLE001 - unreadable or no cryptography: make a new one (or fail there)
        return False
    end = getattr(cert, "not_valid_after_utc", None) or cert.not_valid_after.replace(tzinfo=datetime.timezone.utc)
    return end > datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)


def server_context(cert_path: Path, key_path: Path) -> ssl.SSLContext:
    """The sidecar's TLS context (TLS 1.2 or later)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert_path), str(key_path))
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"cannot use the certificate {cert_path} with the key {key_path}: {exc}") from None
    return ctx


# --- clients that pin the fingerprint ---------------------------------------------------------------------


def aiohttp_ssl(fingerprint: str | None) -> Any:
    """What ``aiohttp`` takes as ``ssl=``: a pinned fingerprint, or True (default verification)."""
    if not fingerprint:
        return True
    import aiohttp

    return aiohttp.Fingerprint(parse_fingerprint(fingerprint))


def fingerprint_mismatch_text(pinned: str, seen: bytes | str) -> str:
    """The reason an agent or client shows when the server's certificate is not the pinned one."""
    seen_text = fingerprint_of_hex(seen.hex()) if isinstance(seen, bytes) else seen
    return (f"the server's TLS certificate does not match the pinned fingerprint: pinned {normalize_fingerprint(pinned)}, "
            f"the server presents {seen_text}; use the join command the server prints (its --fingerprint), or "
            f"check that nothing sits between this machine and the server")


class PinMismatch(ssl.SSLError):
    """The server's certificate is not the pinned one (``seen``: its fingerprint)."""

    def __init__(self, pinned: str, seen: str) -> None:
        super().__init__(fingerprint_mismatch_text(pinned, seen))
        self.pinned = pinned
        self.seen = seen


def _unverified_context() -> ssl.SSLContext:
    # The certificate is checked against the pinned digest right after the handshake, instead of
    # against a certificate authority (a self-signed certificate has none).
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


class PinnedHTTPSConnection(http.client.HTTPSConnection):
    """An ``http.client`` HTTPS connection that refuses a server whose certificate digest differs."""

    def __init__(self, *args: Any, fingerprint: str, **kwargs: Any) -> None:
        kwargs["context"] = _unverified_context()
        super().__init__(*args, **kwargs)
        self._pin = parse_fingerprint(fingerprint)
        self._pin_text = fingerprint

    def connect(self) -> None:
        super().connect()
        der = self.sock.getpeercert(binary_form=True) or b""
        if hashlib.sha256(der).digest() != self._pin:
            seen = fingerprint_of_der(der)
            self.sock.close()
            raise PinMismatch(self._pin_text, seen)


class PinnedHTTPSHandler(urllib.request.HTTPSHandler):
    """``urllib`` handler for :class:`PinnedHTTPSConnection`."""

    def __init__(self, fingerprint: str) -> None:
        super().__init__(context=_unverified_context())
        self.fingerprint = fingerprint

    def https_open(self, req: urllib.request.Request) -> Any:
        fp = self.fingerprint

        def factory(host: str, **kw: Any) -> PinnedHTTPSConnection:
            kw.pop("context", None)
            return PinnedHTTPSConnection(host, fingerprint=fp, **kw)

        return self.do_open(factory, req)


def urlopen(req: urllib.request.Request, timeout: float, fingerprint: str | None = None) -> Any:
    """``urllib.request.urlopen`` that pins ``fingerprint`` for https URLs (plain when None)."""
    if fingerprint and req.full_url.startswith("https://"):
        return urllib.request.build_opener(PinnedHTTPSHandler(fingerprint)).open(req, timeout=timeout)
    return urllib.request.urlopen(req, timeout=timeout)
