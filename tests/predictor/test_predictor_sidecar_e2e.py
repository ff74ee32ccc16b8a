"""End to end on loopback: a real sidecar (``xpufleet start --port 0``), a real agent simulating one
card (``xpufleet agent start --simulate cuda:0=24``), then ``GET /api/snapshot``, ``POST
/api/predict`` and ``xpufleet predict --worker`` against them, as a user would run them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

GiB = 1024**3
CLI = [sys.executable, "-m", "xpufleet.server"]


def _xpufleet(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _call(runtime: dict, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(runtime["url"] + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {runtime['token']}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Sidecar + one simulated agent in a temporary XPUFLEET_HOME (one pair for this file's tests);
    both stopped at the end (the sidecar by PID if ``xpufleet stop`` fails)."""
    tmp = tmp_path_factory.mktemp("predictor_e2e")
    home = tmp / "home"
    home.mkdir()
    models = tmp / "models"
    _sparse(models / "checkpoints/sd3.5_large_fp8_scaled.safetensors", 14 * GiB)
    _sparse(models / "controlnet/sd3.5_large_controlnet_canny.safetensors", 4 * GiB)
    env = {**os.environ, "XPUFLEET_HOME": str(home), "XPUFLEET_MODEL_DIRS": str(models)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    started = _xpufleet(env, "start", "--port", "0", timeout=90)
    assert started.returncode == 0, started.stdout + started.stderr
    runtime = json.loads((home / "runtime.json").read_text())
    try:
        agent = _xpufleet(env, "agent", "start", "--name", "simbox", "--simulate", "cuda:0=24", timeout=90)
        assert agent.returncode == 0, agent.stdout + agent.stderr  # returns once connected
        yield env, runtime, home
    finally:
        _xpufleet(env, "agent", "stop", "--name", "simbox", timeout=60)
        stopped = _xpufleet(env, "stop", timeout=120)
        if stopped.returncode != 0 and psutil.pid_exists(runtime["pid"]):
            os.kill(runtime["pid"], signal.SIGKILL)


def test_predict_on_a_simulated_worker_card_through_a_real_sidecar(fleet, tmp_path, template):
    env, runtime, _home = fleet
    wf = template("sd3.5_large_canny_controlnet_example.json")

    code, snap = _call(runtime, "GET", "/api/snapshot")
    assert code == 200, snap
    (card,) = [c for c in snap["cards"] if c["worker"] == "simbox"]
    assert (card["device"], card["vram_free_gb"], card["simulated"], card["source"]) == ("cuda:0", 24.0, True,
                                                                                         "heartbeat")
    # the worker's host RAM and commit charge travel with its cards (P_load needs S_virt)
    assert card["ram_free_gb"] > 0 and card["commit_limit_gb"] > 0
    # this machine: no GPU here, so honest zeros and the reason
    own = snap["snapshot"]
    if own["source"] == "none":
        assert own["vram_free_gb"] == 0 and own["reason"].startswith("no GPU found")

    code, a = _call(runtime, "POST", "/api/predict", {"workflow": wf, "worker": "simbox", "device": "cuda:0"})
    assert code == 200, a
    assert a["simulated"] is True and any("SIMULATED" in w for w in a["warnings"])
    assert a["snapshot"]["worker"] == "simbox" and a["explanation"]["platform"] == "nvidia"
    assert a["explanation"]["models"]["m_total_gb"] == pytest.approx(18.0)  # the sidecar found the sparse files
    assert a["explanation"]["intermediates"]["v_eff_gb"] == pytest.approx(0.9 * 24.0)
    assert a["explanation"]["intermediates"]["s_virt_gb"] == pytest.approx(
        max(0.0, card["commit_limit_gb"] - card["commit_used_gb"]), abs=0.5)
    assert a["complete"] is True and a["p_success"] == 100  # 14 GiB peak fits 21.6 GiB

    code, err = _call(runtime, "POST", "/api/predict", {"workflow": wf, "worker": "simbox", "device": "cuda:5"})
    assert code == 404 and "known cards: simbox/cuda:0" in err["error"]

    path = tmp_path / "wf.json"
    path.write_text(json.dumps(wf))
    p = _xpufleet(env, "predict", str(path), "--worker", "simbox", "--device", "cuda:0")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("Success rate: 100%  Smooth / 轻松")
    assert "simbox/cuda:0" in p.stdout and "[SIMULATED figures]" in p.stdout
    p = _xpufleet(env, "predict", str(path), "--json")  # without --worker: this machine, computed locally
    assert p.returncode == 0, p.stderr
    local = json.loads(p.stdout)
    assert local["snapshot"]["source"] != "heartbeat" and local["snapshot"]["worker"] is None
    assert local["explanation"]["models"]["m_total_gb"] == pytest.approx(18.0)


def test_paths_outside_the_model_folders_are_refused_by_the_sidecar(fleet, tmp_path):
    env, runtime, _home = fleet
    models = Path(env["XPUFLEET_MODEL_DIRS"])
    outside = tmp_path / "outside"
    _sparse(outside / "secret.safetensors", 5 * GiB)
    os.symlink(outside / "secret.safetensors", models / "checkpoints" / "link.safetensors")
    os.symlink(outside, models / "checkpoints" / "dirlink")

    def ask(name: str) -> tuple[int, dict]:
        wf = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": name}}}
        return _call(runtime, "POST", "/api/predict", {"workflow": wf, "worker": "simbox", "device": "cuda:0"})

    for name, text in [("../outside/secret.safetensors", "climbs out"), (str(outside / "secret.safetensors"),
                       "absolute path"), ("..\\outside\\secret.safetensors", "climbs out"),
                       ("C:\\Windows\\x.safetensors", "absolute path"), ("C:x.safetensors", "absolute path"),
                       ("\\\\server\\share\\x.safetensors", "absolute path"), ("a\x00b.safetensors", "NUL byte")]:
        code, body = ask(name)
        assert code == 400 and text in body["error"], (name, code, body)
    for name in ("link.safetensors", "dirlink/secret.safetensors"):  # links leading out: refused, not read
        code, body = ask(name)
        assert code == 200 and body["models"][0]["status"] == "refused" and body["models"][0]["size_gb"] == 0
        assert body["explanation"]["models"]["m_total_gb"] == 0 and body["complete"] is False
    # URL-encoding is not decoded: the name stays one literal file name inside the folder (not found)
    for name in ("..%2Foutside%2Fsecret.safetensors", "%2e%2e/%2e%2e/outside/secret.safetensors"):
        code, body = ask(name)
        assert code == 200 and body["models"][0]["status"] == "missing", body
        assert body["explanation"]["models"]["m_total_gb"] == 0
