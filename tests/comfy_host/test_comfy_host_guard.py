"""Issue 29's first finding against a real ComfyUI (0.3.64) and a real sidecar: what reaches ComfyUI's
/xpufleet/ routes from anyone but the paired page acts on nothing (server/comfy/guard.py, docs/security.md).

Each repro of the probe is here (a sandboxed iframe's ``Origin: null`` text/plain POST of a service
running ``sh -c``, a rebound DNS name reading a join token, curl on this machine), with other shapes
beside them (other routes, another Origin, a missing custom header); the real browser's side is
tests/frontend/test_pairing_frontend.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
import sidecar_harness as harness  # registered by tests/comfy_host/conftest.py

pytestmark = pytest.mark.comfy


def raw(comfyui, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, Any]:
    """One request exactly as given (no header of the harness's own)."""
    req = urllib.request.Request(comfyui.url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, data = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, data = err.code, err.read()
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data.decode(errors="replace")


@pytest.fixture
def fleet(comfyui):
    sc = harness.Sidecar(comfyui.home).start()
    try:
        yield sc
    finally:
        sc.stop()


def service(marker) -> bytes:
    return json.dumps({"name": "pwn", "program": {"command": ["sh", "-c", f"touch {marker}"]}}).encode()


def test_the_probes_repros_are_refused(comfyui, fleet, tmp_path):
    marker = tmp_path / "pwned"
    port = comfyui.port
    # the module's ComfyUI records its canvas runs with this sidecar: none of the attacks may add one
    runs_before = {r["id"] for r in fleet.client.request("GET", "/api/runs")["runs"]}
    attacks = [
        # a sandboxed iframe: Origin null, a simple text/plain POST (no preflight)
        ("POST", "/xpufleet/api/services", service(marker), {"Origin": "null", "Content-Type": "text/plain"}, 403),
        # a page from another loopback origin queueing a run
        ("POST", "/xpufleet/api/runs", json.dumps({"graph": harness.iris_graph(epochs=1)}).encode(),
         {"Origin": "http://127.0.0.2:8000", "Content-Type": "text/plain"}, 403),
        # DNS rebinding: the page's own name, rebound to 127.0.0.1, asking for a join token
        ("POST", "/xpufleet/api/workers/join-tokens", b"{}",
         {"Host": f"rebind.evil.example:{port}", "Content-Type": "application/json", "X-XPUFleet-Request": "1"}, 403),
        # curl on this machine, headers and all, but no pairing
        ("POST", "/xpufleet/api/services", service(marker),
         {"Content-Type": "application/json", "X-XPUFleet-Request": "1"}, 401),
        ("POST", "/xpufleet/api/workers/join-tokens", b"{}", {"Content-Type": "application/json",
                                                               "X-XPUFleet-Request": "1"}, 401),
        # new shapes: another route, another origin, Origin null with every header, no custom header
        ("POST", "/xpufleet/api/sweeps", b"{}", {"Origin": f"http://localhost:{port + 1}",
                                                  "Content-Type": "application/json", "X-XPUFleet-Request": "1"}, 403),
        ("POST", "/xpufleet/api/runs", b"{}", {"Origin": "null", "Content-Type": "application/json",
                                                "X-XPUFleet-Request": "1", "X-XPUFleet-Pairing": "xfp_guess"}, 403),
        ("POST", "/xpufleet/api/runs", b"{}", {"Content-Type": "application/json"}, 403),
        ("POST", "/xpufleet/sidecar/start", b"{}", {"Origin": "null", "Content-Type": "text/plain"}, 403),
        ("POST", "/xpufleet/sidecar/start", b"{}", {"Content-Type": "application/json"}, 403),
        ("GET", "/xpufleet/api/workers", None, {"Sec-Fetch-Site": "cross-site"}, 403),
        ("GET", "/xpufleet/api/runs", None, {}, 401),
        # a guessed pairing: the sidecar checks it
        ("GET", "/xpufleet/api/runs", None, {"X-XPUFleet-Pairing": "xfp_guess"}, 401),
    ]
    for method, path, body, headers, status in attacks:
        got, answer = raw(comfyui, method, path, body, headers)
        assert got == status, (method, path, headers, got, answer)
        assert "xfw_" not in json.dumps(answer) and "join_token" not in json.dumps(answer)
    assert not marker.exists()
    assert fleet.client.request("GET", "/api/services")["services"] == []
    assert {r["id"] for r in fleet.client.request("GET", "/api/runs")["runs"]} == runs_before


def test_curl_with_the_pairing_is_accepted_and_a_revoked_one_is_not(comfyui, fleet, tmp_path):
    cwd = tmp_path
    proc = harness_cli(comfyui, cwd, "pair")
    code = proc.stdout.strip().splitlines()[-1].strip()
    assert proc.returncode == 0 and code.startswith("xfc_"), proc.stdout
    json_headers = {"Content-Type": "application/json", "X-XPUFleet-Request": "1"}
    status, paired = raw(comfyui, "POST", "/xpufleet/api/pairing/redeem",
                         json.dumps({"code": code, "name": "curl"}).encode(), json_headers)
    assert status == 201 and paired["pairing"].startswith("xfp_"), paired
    secret = paired["pairing"]
    status, again = raw(comfyui, "POST", "/xpufleet/api/pairing/redeem", json.dumps({"code": code}).encode(),
                        json_headers)
    assert status == 403  # a code pairs once
    with_pairing = {**json_headers, "X-XPUFleet-Pairing": secret}
    status, queued = raw(comfyui, "POST", "/xpufleet/api/runs",
                         json.dumps({"graph": harness.iris_graph(epochs=1), "options": {"name": "paired"}}).encode(),
                         with_pairing)
    assert status == 201, queued
    status, token = raw(comfyui, "POST", "/xpufleet/api/workers/join-tokens", b"{}", with_pairing)
    assert status == 201, token
    # the sidecar's own token never passes the proxy as a pairing (a pasted token is redeemed instead)
    status, _ = raw(comfyui, "GET", "/xpufleet/api/runs", None, {"X-XPUFleet-Pairing": "xfs_not-the-token"})
    assert status == 403
    listed = harness_cli(comfyui, cwd, "pair", "--list")
    assert paired["id"] in listed.stdout and "curl" in listed.stdout and secret not in listed.stdout
    revoked = harness_cli(comfyui, cwd, "pair", "--revoke", paired["id"])
    assert revoked.returncode == 0, revoked.stderr
    status, answer = raw(comfyui, "GET", "/xpufleet/api/runs", None, {"X-XPUFleet-Pairing": secret})
    assert status == 401 and answer["pairing"] == "refused"


def test_a_pairing_outlives_a_sidecar_restart(comfyui, tmp_path):
    sc = harness.Sidecar(comfyui.home).start()
    try:
        assert comfyui.pair()
        secret = comfyui.pairing
    finally:
        sc.stop()
    sc = harness.Sidecar(comfyui.home).start()
    try:
        status, _ = raw(comfyui, "GET", "/xpufleet/api/runs", None, {"X-XPUFleet-Pairing": secret})
        assert status == 200
    finally:
        sc.stop()


def test_what_works_unpaired_is_this_machines_own(comfyui, fleet):
    for path in ("/xpufleet/version", "/xpufleet/locales/en/main.json", "/xpufleet/sidecar", "/xpufleet/snapshot"):
        status, answer = raw(comfyui, "GET", path, None, {})
        assert status == 200, (path, answer)
    status, answer = raw(comfyui, "GET", "/xpufleet/sidecar", None, {})
    assert fleet.info["token"] not in json.dumps(answer)
    # a worker card's prediction is the fleet's: it needs the pairing
    status, answer = raw(comfyui, "POST", "/xpufleet/predict",
                         json.dumps({"workflow": {"nodes": []}, "worker": "w", "device": "cuda:0"}).encode(),
                         {"Content-Type": "application/json", "X-XPUFleet-Request": "1"})
    assert status == 401 and answer["pairing"] == "missing"


def test_xpufleet_start_prints_a_pairing_code(comfyui, tmp_path):
    home = tmp_path / "home"
    started = comfy_cli(home, tmp_path, "start", "--port", "0")
    try:
        assert started.returncode == 0, started.stderr
        assert "pairing code for a browser" in started.stdout and "xfc_" in started.stdout
    finally:
        comfy_cli(home, tmp_path, "stop")


def harness_cli(comfyui, cwd, *args: str):
    return comfy_cli(comfyui.home, cwd, *args)


def comfy_cli(home, cwd, *args: str):
    import comfy_harness

    return comfy_harness.xpufleet_cli(*args, home=home, cwd=cwd, timeout=120)
