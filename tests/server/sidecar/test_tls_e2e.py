"""End to end (docs/workers.md): TLS between machines. A sidecar started with ``--tls`` (a certificate generated under
XPUFLEET_HOME), an agent on "another machine" (its own XPUFLEET_HOME) joined with the join command's
fingerprint through a loopback proxy that records every byte: the run runs, and no token crosses in clear.
The same capture on a plain-HTTP sidecar does see the token (so the capture would have caught it). An
agent pinning another fingerprint refuses the server before sending anything; the server lists the refusal
under rejected connections, and the agent's state says why."""

from __future__ import annotations

import json
import re

import fleet_harness as fh
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def _join(fleet: fh.Fleet, name: str) -> tuple[str, str]:
    out = fleet.cli("workers", "join-token", "--name", name)
    assert out.returncode == 0, out.stderr
    command = out.stdout.split("run:\n")[1].split("\n")[0].strip()
    token = re.search(r"--join (\S+)", command).group(1)
    return command, token


def _state(home, name: str) -> dict:
    return json.loads((home / "agents" / f"{name}.json").read_text())


def test_tls_sidecar_pinned_agent_runs_and_no_secret_crosses_in_clear(fleet, tmp_path):
    sc = fleet.sidecar("--tls")
    assert sc.url.startswith("https://") and sc.fingerprint.startswith("sha256:")
    assert (fleet.home / "tls" / "cert.pem").is_file() and ((fleet.home / "tls" / "key.pem").stat().st_mode & 0o077) == 0
    status = fleet.cli("status")
    assert status.returncode == 0 and sc.fingerprint in status.stdout, status.stdout + status.stderr
    # a same-machine agent needs no arguments: the runtime file gives the URL, the token and the pin
    local = fleet.agent("--name", "here", label="here")
    local.wait_connected()
    assert sc.wait_worker("here", "Online")["auth"] == "session"

    command, token = _join(fleet, "tlsbox")
    assert f"--server {sc.url}" in command and f"--fingerprint {sc.fingerprint}" in command
    proxy = fleet.proxy(sc.port)
    remote = tmp_path / "remote-home"  # another machine: no runtime file, no session token
    remote.mkdir()
    agent = fleet.agent("--name", "tlsbox", "--server", f"https://127.0.0.1:{proxy.port}",
                        "--fingerprint", sc.fingerprint, "--join", token, home=remote, label="tlsbox")
    agent.wait_connected()
    rid = sc.submit(fh.iris_graph(), target="tlsbox")
    run = sc.wait_run(rid, {"succeeded", "failed"})
    assert run["status"] == "succeeded", run["error"]
    credential = json.loads((remote / "agents" / "tlsbox.credential.json").read_text())
    assert credential["fingerprint"] == sc.fingerprint  # later starts pin it without --fingerprint
    assert len(proxy.captured) > 10_000 and proxy.captured[:1] == b"\x16"  # a TLS handshake, then records
    for secret in (token, credential["credential"], sc.token, "XPUDataset", "tlsbox"):
        assert not proxy.seen(secret), f"{secret[:12]}... crossed the network in clear"

    # an agent that pins another certificate refuses the server and sends it nothing secret
    _, token2 = _join(fleet, "wrongpin")
    wrong = "sha256:" + ":".join(["AB"] * 32)
    bad = fleet.agent("--name", "wrongpin", "--server", f"https://127.0.0.1:{proxy.port}",
                      "--fingerprint", wrong, "--join", token2, home=remote, label="wrongpin")
    bad.out.wait_for("refusing the server", timeout=60)
    state = _state(remote, "wrongpin")
    assert state["state"] == "rejected" and "does not match the pinned fingerprint" in state["reason"]
    assert sc.fingerprint in state["reason"]
    shown = fleet.cli("agent", "status", "--name", "wrongpin", env=fleet.env(remote))
    assert "rejected (the server's TLS certificate does not match" in shown.stdout, shown.stdout
    rejected = [r for r in sc.rejected() if r["name"] == "wrongpin"]
    assert rejected and "refused this server's TLS certificate" in rejected[0]["reason"]
    assert wrong in rejected[0]["reason"] and sc.fingerprint in rejected[0]["reason"]
    assert not proxy.seen(token2)
    bad.stop()
    # the join token never reached the server: the right command still joins with it
    good = fleet.agent("--name", "wrongpin", "--server", f"https://127.0.0.1:{proxy.port}",
                       "--fingerprint", sc.fingerprint, "--join", token2, home=remote, label="rightpin")
    good.wait_connected()
    assert sc.wait_worker("wrongpin", "Online")["auth"] == "credential"


def test_plain_http_between_machines_shows_the_token_to_a_capture(fleet, tmp_path):
    """The control: without --tls the same capture sees the join token (plain HTTP stays the loopback
    default; the README says to use --tls between machines)."""
    sc = fleet.sidecar()
    assert sc.url.startswith("http://") and sc.fingerprint is None
    _, token = _join(fleet, "plainbox")
    proxy = fleet.proxy(sc.port)
    remote = tmp_path / "remote-home"
    remote.mkdir()
    agent = fleet.agent("--name", "plainbox", "--server", f"http://127.0.0.1:{proxy.port}", "--join", token,
                        home=remote, label="plainbox")
    agent.wait_connected()
    rid = sc.submit(fh.iris_graph(), target="plainbox")
    assert sc.wait_run(rid, {"succeeded", "failed"})["status"] == "succeeded"
    credential = json.loads((remote / "agents" / "plainbox.credential.json").read_text())["credential"]
    for secret in (token, credential, "XPUDataset", "plainbox"):  # what the TLS test checks, all in clear here
        assert proxy.seen(secret), secret[:12]
    bad = fleet.cli("agent", "start", "--name", "x", "--fingerprint", "nope", env=fleet.env(remote))
    assert bad.returncode == 2 and "invalid certificate fingerprint" in bad.stderr
    bad = fleet.cli("start", "--tls-key", str(tmp_path / "k.pem"))
    assert bad.returncode == 2 and "--tls-key needs --tls-cert" in bad.stderr


def _own_certificate(folder) -> tuple[str, str, str]:
    """A certificate of the user's own (RSA, made here, not by xpufleet): its files and SHA-256 pin."""
    import datetime
    import hashlib
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "own-cert-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "own-cert.pem", folder / "own-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    digest = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest().upper()
    return str(cert_path), str(key_path), "sha256:" + ":".join(digest[i:i + 2] for i in range(0, 64, 2))


def test_a_users_own_certificate_is_served_and_pinned(fleet, tmp_path):
    """--tls-cert/--tls-key: the sidecar serves the user's certificate, prints its SHA-256 fingerprint
    (computed here from the certificate's bytes), and a remote agent pinning it joins and runs."""
    cert, key, expected = _own_certificate(tmp_path)
    sc = fleet.sidecar("--tls-cert", cert, "--tls-key", key)
    assert sc.url.startswith("https://") and sc.fingerprint == expected
    assert not (fleet.home / "tls" / "cert.pem").exists()  # nothing generated
    command, token = _join(fleet, "ownbox")
    assert f"--fingerprint {expected}" in command
    remote = tmp_path / "remote-home"
    remote.mkdir()
    agent = fleet.agent("--name", "ownbox", "--server", sc.url, "--fingerprint", expected, "--join", token,
                        home=remote, label="ownbox")
    agent.wait_connected()
    rid = sc.submit(fh.iris_graph(), target="ownbox")
    run = sc.wait_run(rid, {"succeeded", "failed"})
    assert run["status"] == "succeeded", run["error"]
