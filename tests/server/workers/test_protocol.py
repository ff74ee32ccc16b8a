"""Agent <-> sidecar message validation (server/protocol.py)."""

from __future__ import annotations

import json

import pytest

from xpufleet.server.workers import protocol


def _hello(**over):
    msg = {
        "type": "hello", "name": "gpu-box", "version": "0.1.0", "protocol": 1,
        "auth": {"kind": "session", "token": "t"}, "node_types": ["Dataset"],
        "devices": [{"name": "cpu", "kind": "cpu", "total_gib": 8.0, "free_gib": 4.0}],
        "runs": [{"run_id": "r1", "last_seq": 3, "status": "running"}],
    }
    msg.update(over)
    return msg


def test_valid_messages_round_trip():
    text = protocol.encode("event", run_id="r1", seq=1, event_type="progress", payload={"value": 1}, ts=1.0)
    assert protocol.decode(text, protocol.AGENT_TO_SIDECAR)["seq"] == 1
    assert protocol.validate(_hello())["name"] == "gpu-box"
    assert protocol.decode(json.dumps({"type": "welcome", "name": "a", "server_version": "0.1.0",
                                       "runs": {"r1": 2}}))["runs"] == {"r1": 2}


@pytest.mark.parametrize(
    ("msg", "needle"),
    [
        (_hello(name="a/b"), "letters, digits"),
        (_hello(auth={"kind": "password", "token": "x"}), "auth.kind"),
        (_hello(devices=[{"name": "cuda:0", "kind": "tpu"}]), "kind 'tpu'"),
        (_hello(devices=[{"name": "cpu", "kind": "cpu"}, {"name": "cpu", "kind": "cpu"}]), "listed twice"),
        (_hello(devices=[{"name": "cuda:0", "kind": "cuda", "free_gib": "lots"}]), "free_gib"),
        ({"type": "event", "run_id": "r", "seq": 0, "event_type": "x", "payload": {}}, "starts at 1"),
        ({"type": "event", "run_id": "r", "seq": True, "event_type": "x", "payload": {}}, "boolean"),
        ({"type": "start_run", "run_id": "r", "graph": {}, "devices": []}, "at least one device"),
        ({"type": "nope"}, "unknown message type"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_messages_name_the_field(msg, needle):
    with pytest.raises(protocol.ProtocolError, match=needle):
        protocol.validate(msg)


def test_direction_is_enforced_and_garbage_is_refused():
    with pytest.raises(protocol.ProtocolError, match="unknown message type 'start_run'"):
        protocol.decode(json.dumps({"type": "start_run", "run_id": "r", "graph": {}, "devices": ["cpu"]}),
                        protocol.AGENT_TO_SIDECAR)
    with pytest.raises(protocol.ProtocolError, match="must be JSON"):
        protocol.decode("{oops")


def test_intervals_come_from_the_environment(monkeypatch):
    monkeypatch.delenv("XPUFLEET_HEARTBEAT_INTERVAL_S", raising=False)
    monkeypatch.delenv("XPUFLEET_WORKER_RESUME_GRACE_S", raising=False)
    assert protocol.heartbeat_interval_s() == 10.0
    assert protocol.resume_grace_s() == 300.0
    monkeypatch.setenv("XPUFLEET_HEARTBEAT_INTERVAL_S", "0.5")
    monkeypatch.setenv("XPUFLEET_WORKER_RESUME_GRACE_S", "garbage")
    assert protocol.heartbeat_interval_s() == 0.5
    assert protocol.heartbeat_late_s() == 1.5
    assert protocol.resume_grace_s() == 300.0


def test_welcome_carries_the_servers_intervals_which_must_be_positive():
    ok = {"type": "welcome", "name": "a", "server_version": "0.1.0", "runs": {},
          "heartbeat_interval_s": 10.0, "resume_grace_s": 300}
    assert protocol.validate(ok)["resume_grace_s"] == 300
    with pytest.raises(protocol.ProtocolError, match="'resume_grace_s' must be more than 0"):
        protocol.validate({**ok, "resume_grace_s": 0})
    with pytest.raises(protocol.ProtocolError, match="heartbeat_interval_s"):
        protocol.validate({**ok, "heartbeat_interval_s": "10"})


@pytest.mark.parametrize("name", ["local", "ANY", "a!b", "-x", "x" * 65, ""])
def test_worker_names_that_cannot_be_used(name):
    assert "invalid worker name" in protocol.worker_name_problem(name)


def test_worker_names_that_can_be_used():
    assert [protocol.worker_name_problem(n) for n in ("gpu-box", "a.b_c", "x" * 64, "localhost")] == [None] * 4


def test_capabilities_and_per_run_memory_are_checked():
    assert protocol.validate(_hello(capabilities=["memory_cap"]))["capabilities"] == ["memory_cap"]
    assert "capabilities" not in protocol.validate(_hello())  # an older agent says nothing: it cannot cap
    with pytest.raises(protocol.ProtocolError, match="every entry of 'capabilities'"):
        protocol.validate(_hello(capabilities=[1]))
    beat = {"type": "heartbeat", "devices": [], "ts": 1.0,
            "runs": [{"run_id": "r1", "last_seq": 2, "status": "running", "memory": {"cuda:1": 3.25}}]}
    assert protocol.validate(beat)["runs"][0]["memory"] == {"cuda:1": 3.25}
    beat["runs"][0]["memory"] = {"cuda:1": "lots"}
    with pytest.raises(protocol.ProtocolError, match="field 'memory' must map devices to GiB"):
        protocol.validate(beat)


# --- remote workers: mounts, one-shot, recorded outputs, a refused certificate (docs/workers.md) -------


def test_hello_carries_mounts_and_one_shot():
    msg = protocol.validate(_hello(mounts={"datasets": "/srv/data"}, one_shot=True,
                                   auth={"kind": "pool", "token": "xfp_x"}))
    assert msg["mounts"] == {"datasets": "/srv/data"} and msg["one_shot"] is True
    for bad, needle in (({"mounts": {"d": "/x"}}, "mount 'd'"), ({"mounts": {"datasets": 3}}, "mount 'datasets'"),
                        ({"mounts": ["x"]}, "'mounts' must be"), ({"one_shot": "yes"}, "one_shot")):
        with pytest.raises(protocol.ProtocolError, match=needle):
            protocol.validate(_hello(**bad))


def test_outputs_messages():
    read = {"type": "read_outputs", "request_id": "q", "run_id": "r", "file": "8/outputs.json", "offset": 0,
            "length": 1024}
    assert protocol.decode(json.dumps(read), protocol.SIDECAR_TO_AGENT)["file"] == "8/outputs.json"
    for over, needle in (({"file": "../x"}, "without '..'"), ({"file": "/etc/passwd"}, "relative"),
                         ({"file": "a\\..\\b"}, "without '..'"), ({"offset": -1}, "0 or more"),
                         ({"length": protocol.OUTPUTS_CHUNK_BYTES + 1}, "'length' must be")):
        with pytest.raises(protocol.ProtocolError, match=needle):
            protocol.validate({**read, **over})
    data = {"type": "outputs_data", "request_id": "q", "ok": True, "size": 3, "offset": 0, "data": "YWJj",
            "eof": True}
    assert protocol.decode(json.dumps(data), protocol.AGENT_TO_SIDECAR)["eof"] is True
    failed = {"type": "outputs_data", "request_id": "q", "ok": False, "error": "no such file", "status": 404}
    assert protocol.validate(failed)["status"] == 404
    with pytest.raises(protocol.ProtocolError, match="'error'"):
        protocol.validate({"type": "outputs_data", "request_id": "q", "ok": False})
    with pytest.raises(protocol.ProtocolError, match="unknown message type 'read_outputs'"):
        protocol.decode(json.dumps(read), protocol.AGENT_TO_SIDECAR)


def test_refused_server_carries_no_secret_field():
    pinned, seen = "sha256:" + ":".join(["AA"] * 32), "sha256:" + ":".join(["BB"] * 32)
    msg = {"type": "refused_server", "name": "box", "version": "0.1.0", "pinned": pinned, "seen": seen}
    assert protocol.decode(json.dumps(msg), protocol.AGENT_TO_SIDECAR)["seen"] == seen
    with pytest.raises(protocol.ProtocolError, match="too long"):
        protocol.validate({**msg, "seen": "x" * 500})
    # only hex pairs: words or a URL in a fingerprint field are refused (issue 29)
    for bad in ("sha256:AA", "re-join with --server http://evil.example", seen.lower()):
        with pytest.raises(protocol.ProtocolError, match="'seen' is not a fingerprint"):
            protocol.validate({**msg, "seen": bad})
    with pytest.raises(protocol.ProtocolError, match="not a worker name"):
        protocol.validate({**msg, "name": "a/b"})
