"""``xpufleet predict``: locally (a real subprocess) and through a sidecar's /api/predict (a real
aiohttp server in a subprocess, token checked), plus the exit codes scripts rely on."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import processes  # tests/processes.py, registered by tests/conftest.py
import pytest

from xpufleet.server.cli.predict import EXIT_BAD_INPUT, EXIT_UNREACHABLE, load_workflow, main

GiB = 1024**3
REPO = Path(__file__).resolve().parents[2]


def _env(home: Path, models: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["XPUFLEET_HOME"] = str(home)
    env["XPUFLEET_MODEL_DIRS"] = str(models)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _cli(args, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "xpufleet.server.cli.predict", "predict", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def wf_file(tmp_path, template, sparse):
    models = tmp_path / "models"
    sparse(models / "checkpoints/sd3.5_large_fp8_scaled.safetensors", 14 * GiB)
    sparse(models / "controlnet/sd3.5_large_controlnet_canny.safetensors", 4 * GiB)
    path = tmp_path / "workflow.json"
    path.write_text(json.dumps(template("sd3.5_large_canny_controlnet_example.json")))
    home = tmp_path / "home"
    home.mkdir()
    return path, models, home


def test_local_predict_json_and_text(wf_file):
    path, models, home = wf_file
    p = _cli([str(path), "--json", "--platform", "intel", "--topology"], _env(home, models))
    assert p.returncode == 0, p.stderr
    a = json.loads(p.stdout)
    assert a["explanation"]["platform"] == "intel"
    assert a["explanation"]["models"]["m_total_gb"] == pytest.approx(18.0)
    assert a["explanation"]["models"]["m_peak_gb"] == pytest.approx(18.0)  # topology: checkpoint + ControlNet
    assert a["explanation"]["options"] == {"topology": True}
    assert {m["status"] for m in a["models"]} == {"found"}
    assert 0 <= a["p_success"] <= 100
    p = _cli([str(path)], _env(home, models))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("Success rate: ")
    assert "sd3.5_large_fp8_scaled.safetensors" in p.stdout and "found" in p.stdout


def test_bad_input_exit_codes(tmp_path, wf_file, capsys, monkeypatch):
    path, models, home = wf_file
    monkeypatch.setenv("XPUFLEET_HOME", str(home))
    monkeypatch.setenv("XPUFLEET_MODEL_DIRS", str(models))
    monkeypatch.delitem(sys.modules, "folder_paths", raising=False)
    assert main(["predict", str(tmp_path / "missing.json")]) == EXIT_BAD_INPUT
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    assert main(["predict", str(bad)]) == EXIT_BAD_INPUT
    assert "is not JSON" in capsys.readouterr().err
    notwf = tmp_path / "notwf.json"
    notwf.write_text('{"hello": 1}')
    assert main(["predict", str(notwf)]) == EXIT_BAD_INPUT
    assert "not a ComfyUI workflow" in capsys.readouterr().err
    evil = tmp_path / "evil.json"
    evil.write_text(json.dumps({"1": {"class_type": "VAELoader", "inputs": {"vae_name": "/etc/passwd"}}}))
    assert main(["predict", str(evil)]) == EXIT_BAD_INPUT
    assert "absolute path" in capsys.readouterr().err
    assert main(["predict", str(path), "--worker", "gpu-box"]) == EXIT_BAD_INPUT
    assert "--worker needs --device" in capsys.readouterr().err
    assert main(["predict", str(path), "--device", "cuda:5"]) == EXIT_BAD_INPUT
    assert "no device 'cuda:5'" in capsys.readouterr().err
    # no sidecar running (no runtime.json): a clear failure, exit 3
    assert main(["predict", str(path), "--worker", "gpu-box", "--device", "cuda:0"]) == EXIT_UNREACHABLE
    assert "no sidecar" in capsys.readouterr().err


# The stand-in sidecar runs in its own process (the CLI under test blocks on its HTTP call), so its
# asyncio.run is its own; the fixture below stops it by its PID.
SERVER = textwrap.dedent("""
    import asyncio, json, sys
    from aiohttp import web
    from xpufleet.server.sidecar.routes.predictor import add_sidecar_routes

    TOKEN = sys.argv[1]
    CARDS = [{"worker": "gpu-box", "device": "cuda:0", "total_gib": 24.0, "free_gib": 10.0, "kind": "cuda",
              "uuid": "GPU-1", "simulated": False, "ram_free_gib": 16.0, "commit_used_gib": 8.0,
              "commit_limit_gib": 40.0}]

    @web.middleware
    async def auth(request, handler):
        if request.headers.get("Authorization") != "Bearer " + TOKEN:
            return web.json_response({"error": "missing or wrong token"}, status=401)
        return await handler(request)

    async def main():
        app = web.Application(middlewares=[auth])
        add_sidecar_routes(app, lambda: CARDS)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(site._server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


@pytest.fixture
def sidecar(tmp_path, wf_file):
    _path, models, home = wf_file
    script = tmp_path / "sidecar.py"
    script.write_text(SERVER)
    proc = subprocess.Popen([sys.executable, str(script), "s3cret"], env=_env(home, models),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # the port, once listening (or EOF if it died)
        assert line.strip().isdigit(), proc.stderr.read()
        yield f"http://127.0.0.1:{int(line)}", home
    finally:
        processes.stop_process(proc, grace_s=10)


def test_predict_on_a_worker_through_the_sidecar(sidecar, wf_file):
    url, home = sidecar
    path, models, _ = wf_file
    (home / "runtime.json").write_text(json.dumps({"url": url, "token": "s3cret"}))
    p = _cli([str(path), "--worker", "gpu-box", "--device", "cuda:0", "--json"], _env(home, models))
    assert p.returncode == 0, p.stderr
    a = json.loads(p.stdout)
    assert a["snapshot"]["source"] == "heartbeat" and a["snapshot"]["worker"] == "gpu-box"
    assert a["explanation"]["inputs"]["vram_free_gb"] == 10.0
    assert a["explanation"]["models"]["m_total_gb"] == pytest.approx(18.0)
    # an unknown card: the sidecar's 404 becomes exit 2 with its message
    p = _cli([str(path), "--worker", "gpu-box", "--device", "cuda:3"], _env(home, models))
    assert p.returncode == EXIT_BAD_INPUT and "no card gpu-box/cuda:3" in p.stderr
    # a wrong token is refused
    (home / "runtime.json").write_text(json.dumps({"url": url, "token": "wrong"}))
    p = _cli([str(path), "--worker", "gpu-box", "--device", "cuda:0"], _env(home, models))
    assert p.returncode == EXIT_UNREACHABLE and "wrong token" in p.stderr


def test_sidecar_not_reachable(tmp_path, wf_file, capsys, monkeypatch):
    import socket

    path, _models, home = wf_file
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("XPUFLEET_HOME", str(home))
    code = main(["predict", str(path), "--server", f"http://127.0.0.1:{port}", "--worker", "w", "--device", "cuda:0"])
    assert code == EXIT_UNREACHABLE and "not reachable" in capsys.readouterr().err


def _png_with_text(chunks: dict[str, str]) -> bytes:
    def chunk(ctype: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + ctype + data + struct.pack(">I", zlib.crc32(ctype + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    body = chunk(b"IHDR", ihdr)
    for k, v in chunks.items():
        body += chunk(b"tEXt", k.encode("latin-1") + b"\x00" + v.encode("utf-8"))
    body += chunk(b"IDAT", zlib.compress(b"\x00\x00")) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def test_workflow_from_a_comfyui_png(tmp_path, template):
    wf = template("sd3.5_large_canny_controlnet_example.json")
    png = tmp_path / "ComfyUI_00001_.png"
    png.write_bytes(_png_with_text({"prompt": json.dumps({"1": {"class_type": "X", "inputs": {}}}),
                                    "workflow": json.dumps(wf)}))
    assert load_workflow(str(png)) == wf
    empty = tmp_path / "plain.png"
    empty.write_bytes(_png_with_text({}))
    with pytest.raises(ValueError, match="no ComfyUI workflow"):
        load_workflow(str(empty))
