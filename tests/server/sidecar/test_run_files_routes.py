"""The run-file routes (server/sidecar/routes/run_files.py) and what an agent serves from a run's folder
(server/agent/files.py): a local run's log and files; a worker run's while its worker is away (the
listing and the log say so, a file is a 409 naming it); paths that lead out refused on both sides.
The connected worker's side runs end to end in tests/server/workers/test_run_files_e2e.py."""

from __future__ import annotations

import json
import os

import pytest

from xpufleet.server.agent.files import LISTING_MAX, OutputsUnavailable, read_output_chunk, run_listing
from xpufleet.server.sidecar.keys import STORE_KEY
from xpufleet.server.workers import protocol


def _worker_run(app, worker: str, run_dir: str | None = None, placement: str = "worker") -> str:
    store = app[STORE_KEY]
    rid = store.create_run(graph={}, options={}, target=worker, requested=[], candidates=[], queue_key=worker,
                           name="mlp_digits")
    assert store.assign(rid, provider=worker, placement=placement, devices=["cuda:0"], run_dir=run_dir)
    return rid


async def test_a_worker_runs_log_and_files_say_plainly_that_its_worker_is_not_connected(sidecar_client):
    client, config = await sidecar_client(validate_local_graphs=False)
    app = client.app
    auth = {"Authorization": f"Bearer {config.token}"}
    rid = _worker_run(app, "gpu-box")
    resp = await client.get(f"/api/runs/{rid}/logs?tail=1000", headers=auth)
    log = await resp.json()
    assert resp.status == 200, log
    assert log["where"] == "worker" and log["worker"] == "gpu-box" and log["connected"] is False
    assert log["text"] == "" and "worker gpu-box is not connected now" in log["message"]
    resp = await client.get(f"/api/runs/{rid}/logs?format=text", headers=auth)
    assert resp.status == 409 and "gpu-box" in (await resp.json())["error"]
    resp = await client.get(f"/api/runs/{rid}/artifacts", headers=auth)
    arts = await resp.json()
    assert resp.status == 200 and arts["connected"] is False and arts["where"] == "worker"
    assert arts["location"] == "on worker gpu-box" and "is not connected now" in arts["message"]
    resp = await client.get(f"/api/runs/{rid}/artifacts/output.log", headers=auth)
    body = await resp.json()
    assert resp.status == 409 and "worker gpu-box is not connected now" in body["error"]
    # a path that leads out is refused before any worker is asked
    for bad, fragment in (("..%2Fsecret", ".."), ("a//b", "empty name"), ("%2Fetc%2Fpasswd", "")):
        resp = await client.get(f"/api/runs/{rid}/artifacts/{bad}", headers=auth)
        body = await resp.json()
        assert resp.status == 400 and fragment in body["error"], (bad, body)
    # without the token: 401, like every other route
    resp = await client.get(f"/api/runs/{rid}/logs")
    assert resp.status == 401
    resp = await client.get(f"/api/runs/{rid}/artifacts/output.log")
    assert resp.status == 401


async def test_a_local_runs_files_are_served_and_paths_out_of_its_folder_refused(sidecar_client, tmp_path):
    client, config = await sidecar_client(validate_local_graphs=False)
    app = client.app
    auth = {"Authorization": f"Bearer {config.token}"}
    run_dir = config.home / "runs" / "r-local"
    rid = _worker_run(app, "local", str(run_dir), placement="local")
    (run_dir / "outputs" / "models").mkdir(parents=True)
    (run_dir / "output.log").write_text("epoch 1 loss 0.5\nepoch 2 loss 0.25\n")
    (run_dir / "outputs" / "models" / "m.safetensors").write_bytes(b"\x00weights")
    (tmp_path / "secret").write_text("not the run's")
    os.symlink(tmp_path / "secret", run_dir / "link")
    resp = await client.get(f"/api/runs/{rid}/logs?tail=18", headers=auth)
    log = await resp.json()
    assert log["text"] == "epoch 2 loss 0.25\n" and log["where"] == "sidecar" and log["connected"] is True
    arts = await (await client.get(f"/api/runs/{rid}/artifacts", headers=auth)).json()
    paths = {a["path"]: a for a in arts["artifacts"]}
    assert set(paths) == {"output.log", "outputs/models/m.safetensors"}  # never the link
    assert all(a["downloadable"] for a in paths.values())
    resp = await client.get(f"/api/runs/{rid}/artifacts/outputs/models/m.safetensors", headers=auth)
    assert resp.status == 200 and await resp.read() == b"\x00weights"
    assert 'filename="m.safetensors"' in resp.headers["Content-Disposition"]
    resp = await client.get(f"/api/runs/{rid}/artifacts/link", headers=auth)
    assert resp.status == 400 and "leads outside" in (await resp.json())["error"]
    resp = await client.get(f"/api/runs/{rid}/artifacts/..%2F..%2Fsecret", headers=auth)
    assert resp.status == 400
    resp = await client.get(f"/api/runs/{rid}/artifacts/outputs/models/m.safetensors")
    assert resp.status == 401


def test_the_agent_reads_only_inside_the_run_folder(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "recorded_outputs").mkdir(parents=True)
    (run_dir / "output.log").write_bytes(b"0123456789")
    (run_dir / "half.tmp").write_bytes(b"being written")
    (tmp_path / "secret").write_text("outside")
    os.symlink(tmp_path / "secret", run_dir / "link")
    os.symlink(tmp_path, run_dir / "up")
    assert read_output_chunk(run_dir, "r1", "output.log", 4, 3, "w", "run") == (b"456", 10, False)
    assert read_output_chunk(run_dir, "r1", "output.log", 7, 100, "w", "run") == (b"789", 10, True)
    for name in ("../secret", "link", "up/secret", "/etc/passwd", "recorded_outputs"):
        with pytest.raises(OutputsUnavailable) as err:
            read_output_chunk(run_dir, "r1", name, 0, 10, "w", "run")
        assert err.value.status == 404 and "has no file" in str(err.value)
    with pytest.raises(OutputsUnavailable):  # the outputs scope stays inside recorded_outputs
        read_output_chunk(run_dir, "r1", "../output.log", 0, 10, "w", "outputs")
    with pytest.raises(OutputsUnavailable) as err:
        read_output_chunk(run_dir, "r1", "output.log", 0, 10, "w", "home")
    assert err.value.status == 400
    data, size, eof = read_output_chunk(run_dir, "r1", "", 0, 1 << 20, "w", "listing")
    listing = json.loads(data)
    assert eof and size == len(data) and listing["truncated"] is False
    assert [f["path"] for f in listing["files"]] == ["output.log"]  # no link, no .tmp, no folder
    assert listing["files"][0]["size"] == 10
    with pytest.raises(OutputsUnavailable):
        run_listing(tmp_path / "gone", "r2", "w")


def test_a_listing_stops_at_its_cap(tmp_path):
    for i in range(LISTING_MAX + 3):
        (tmp_path / f"f{i:05d}").write_bytes(b"")
    listing = json.loads(run_listing(tmp_path, "r", "w"))
    assert len(listing["files"]) == LISTING_MAX and listing["truncated"] is True


def test_read_outputs_scope_is_checked():
    base = {"type": "read_outputs", "request_id": "a", "run_id": "r", "file": "output.log", "offset": 0,
            "length": 10}
    protocol.validate({**base, "scope": "run"})
    protocol.validate(base)
    with pytest.raises(protocol.ProtocolError, match="'scope' must be one of outputs, run, listing"):
        protocol.validate({**base, "scope": "home"})
    with pytest.raises(protocol.ProtocolError, match="without '..'"):
        protocol.validate({**base, "scope": "run", "file": "../x"})
