"""TLS (docs/workers.md): fingerprints, the generated certificate, and clients that pin it (urllib and aiohttp)
against a real HTTPS server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import http.server
import ssl
import threading
import urllib.error
import urllib.request

import aiohttp
import pytest

from xpufleet.common import tls


def test_fingerprint_spellings():
    fp = tls.fingerprint_of_der(b"certificate bytes")
    assert fp.startswith("sha256:") and len(fp) == len("sha256:") + 64 + 31
    assert tls.normalize_fingerprint(fp.lower()) == fp
    assert tls.normalize_fingerprint(fp.replace(":", "").replace("sha256", "")) == fp
    assert tls.parse_fingerprint(fp) == bytes.fromhex(fp[7:].replace(":", ""))
    for bad in ("", "sha256:AB", "md5:" + "00" * 16, "zz" * 32):
        with pytest.raises(tls.TLSConfigError, match="invalid certificate fingerprint"):
            tls.parse_fingerprint(bad)
    text = tls.fingerprint_mismatch_text(fp, bytes(32))
    assert fp in text and "sha256:00:00" in text and "--fingerprint" in text


def test_generated_certificate_is_kept_private_and_reused(tmp_path):
    cert, key = tls.generate_certificate(tmp_path / "tls", "127.0.0.1")
    assert (key.stat().st_mode & 0o077) == 0 and ((tmp_path / "tls").stat().st_mode & 0o077) == 0
    fp = tls.cert_fingerprint(cert)
    again = tls.generate_certificate(tmp_path / "tls", "127.0.0.1")
    assert again == (cert, key) and tls.cert_fingerprint(cert) == fp  # reused while valid
    from cryptography import x509

    san = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert {str(i) for i in san.get_values_for_type(x509.IPAddress)} >= {"127.0.0.1", "::1"}
    with pytest.raises(tls.TLSConfigError, match="holds no PEM certificate"):
        tls.cert_fingerprint(key)
    with pytest.raises(tls.TLSConfigError, match="cannot use the certificate"):
        tls.server_context(cert, cert)


@pytest.fixture
def https_server(tmp_path):
    cert, key = tls.generate_certificate(tmp_path / "tls")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = tls.server_context(cert, key).wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}", tls.cert_fingerprint(cert)
    server.shutdown()
    server.server_close()


def test_urllib_pins_the_certificate(https_server):
    url, fp = https_server
    with tls.urlopen(urllib.request.Request(url + "/x"), 10, fp) as resp:
        assert resp.read() == b'{"ok": true}'
    with pytest.raises(urllib.error.URLError) as exc:  # a self-signed certificate without the pin: refused
        tls.urlopen(urllib.request.Request(url + "/x"), 10, None)
    assert isinstance(exc.value.reason, ssl.SSLCertVerificationError)
    wrong = "sha256:" + ":".join(["AB"] * 32)
    with pytest.raises(urllib.error.URLError) as exc:
        tls.urlopen(urllib.request.Request(url + "/x"), 10, wrong)
    assert isinstance(exc.value.reason, tls.PinMismatch) and fp in str(exc.value.reason)


def test_aiohttp_pins_the_certificate(https_server):
    url, fp = https_server

    async def get(pin: str | None) -> int:
        async with aiohttp.ClientSession() as session, session.get(url + "/x", ssl=tls.aiohttp_ssl(pin)) as resp:
            return resp.status

    assert asyncio.run(get(fp)) == 200
    with pytest.raises(aiohttp.ServerFingerprintMismatch):
        asyncio.run(get("sha256:" + ":".join(["AB"] * 32)))
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        asyncio.run(get(None))
    assert tls.aiohttp_ssl(None) is True


def test_the_comfyui_proxy_pins_a_tls_sidecar_and_forwards_pools(tmp_path):
    import os

    from xpufleet.common.runtime_file import write_runtime
    from xpufleet.server.comfy import proxy

    fp = "sha256:" + ":".join(["0F"] * 32)
    write_runtime(tmp_path, {"url": "https://127.0.0.1:1", "token": "xfs_t", "pid": os.getpid(), "version": "x",
                             "tls_fingerprint": fp})
    found = proxy.find_sidecar(tmp_path)
    assert found.fingerprint == fp and isinstance(found.ssl(), aiohttp.Fingerprint)
    assert proxy.upstream_path("pools/spot/revoke") == "/api/pools/spot/revoke"
    assert proxy.upstream_path("runs/r/outputs/8/0_model.safetensors") == "/api/runs/r/outputs/8/0_model.safetensors"
