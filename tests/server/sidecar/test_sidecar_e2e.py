"""End to end: a real sidecar subprocess on loopback; submit, follow, list, events, cancel, security,
bad input, and the OpenAPI document fuzzed route by route."""

from __future__ import annotations

import csv
import http.client
import io
import json
import os
import stat
import time
from pathlib import Path

import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py

from xpufleet.constants import RUN_STOP_GRACE_S

pytestmark = pytest.mark.e2e


LONG = 10**6  # epochs: a run that lasts until it is cancelled


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    sc = harness.Sidecar(tmp_path_factory.mktemp("e2e-home")).start()
    yield sc
    sc.stop()


def raw(sc, method: str, path: str, body: bytes | None = None, token: str | None = "ok",
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], object]:
    """One HTTP request with full control of the headers; returns (status, headers, JSON or text)."""
    host, port = sc.info["host"], sc.info["port"]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    h = {"Host": f"127.0.0.1:{port}"}
    if token == "ok":
        h["Authorization"] = f"Bearer {sc.info['token']}"
    elif token is not None:
        h["Authorization"] = f"Bearer {token}"
    h.update(headers or {})
    try:
        conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        data = resp.read()
        hdrs = {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()
    try:
        payload = json.loads(data) if data else None
    except ValueError:
        payload = data.decode("utf-8", "replace")
    return resp.status, hdrs, payload


def post_json(sc, path: str, obj, **kw):
    return raw(sc, "POST", path, json.dumps(obj).encode(), **kw)


def test_submit_follow_list_and_read_a_run(sidecar, tmp_path):
    graph_file = harness.write_graph(tmp_path / "iris.json", harness.iris_graph(epochs=2))
    proc = sidecar.cli("run", str(graph_file), "--follow", "--name", "e2e-follow", "--device", "cuda", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    assert "run succeeded" in proc.stdout and "train_loss" in proc.stdout and "val_accuracy" in proc.stdout
    assert ("warning (device_fallback): The run is set to device cuda; this server offers cpu, "
            "so the run runs on cpu.") in proc.stderr
    assert "7 XPUTrainingLoop" in proc.stderr  # the progress view names the node it is in
    run_id = proc.stdout.split("run ", 1)[1].split()[0]

    listing = sidecar.cli("runs", check=True).stdout
    assert run_id[:8] in listing and "succeeded" in listing and "e2e-follow" in listing

    c = sidecar.client
    page = c.runs(name="e2e-follow")
    assert page["total"] == 1 and page["runs"][0]["id"] == run_id
    run = c.run(run_id)
    for key in ("id", "status", "error", "worker_id", "devices", "queue_key", "budget_gib", "budget_source",
                "execution_facts", "peak_memory", "warnings", "waiting_reason", "final_metrics"):
        assert key in run
    assert run["status"] == "succeeded" and run["error"] is None and run["seed"] == 3
    assert run["devices"] == ["cpu"] and run["placement"] == "local" and run["queue_key"] == "local/cuda"
    assert [w["kind"] for w in run["warnings"]] == ["device_fallback"]
    assert run["execution_facts"]["visible_devices"] == ["cpu"]
    assert run["execution_facts"]["device_aliases"] == {"cpu": "cpu"}
    assert run["peak_memory"]["measured"] is False
    assert set(run["final_metrics"]) >= {"train_loss", "val_loss", "val_accuracy", "eval_accuracy"}
    assert run["graph"]["7"]["class_type"] == "XPUTrainingLoop"

    # The event log: gapless cursors when paged, run_finished last, nothing after it.
    cursors, types, cursor = [], [], 0
    for _ in range(200):
        page = c.events(run_id, cursor=cursor, limit=3)
        cursors += [e["cursor"] for e in page["events"]]
        types += [e["type"] for e in page["events"]]
        cursor = page["cursor"]
        if page["done"]:
            break
    assert cursors == list(range(1, len(cursors) + 1)) and cursors[-1] == run["cursor"]
    assert types[-1] == "run_finished" and types.count("run_finished") == 1
    assert types[:3] == ["status", "run_warning", "status"]
    assert types.count("node_started") == 8 and "metric" in types and "run_started" in types
    t0 = time.monotonic()
    assert c.events(run_id, cursor=cursor, wait=30) ["events"] == []  # finished: no waiting
    assert time.monotonic() - t0 < 15  # the bug, waiting out the 30 s long-poll, is the only way past 15

    metrics = c.metrics(run_id)
    assert [p["epoch"] for p in metrics["metrics"]["train_loss"]] == [1, 2] and metrics["truncated"] is False
    assert metrics["final"]["train_loss"] == metrics["latest"]["train_loss"]
    status, headers, text = raw(sidecar, "GET", f"/api/runs/{run_id}/metrics.csv")
    assert status == 200 and headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["epoch"] for r in rows if r["name"] == "train_loss"] == ["1", "2"]
    metric_cursors = [p["cursor"] for points in metrics["metrics"].values() for p in points]
    assert sorted(int(r["cursor"]) for r in rows) == sorted(metric_cursors)  # the same points as the JSON

    arts = c.request("GET", f"/api/runs/{run_id}/artifacts")["artifacts"]
    paths = {a["path"]: a for a in arts}
    assert {"spec.json", "events.jsonl", "output.log"} <= set(paths)
    spec = json.loads(c.request("GET", f"/api/runs/{run_id}/artifacts/spec.json", raw=True))
    assert spec["run_id"] == run_id and spec["placement"] == "local"
    for bad in ("../state.db", "..%2Fstate.db", "%2e%2e/runtime.json", "%2E%2E%2F%2E%2E%2Fruntime.json",
                "%2Fetc%2Fpasswd", "spec.json/..%2F..%2Fruntime.json", "%00", "spec.json%00.txt", "nope.txt"):
        status, _, body = raw(sidecar, "GET", f"/api/runs/{run_id}/artifacts/{bad}")
        assert 400 <= status < 500 and "error" in body, bad
    logs = c.request("GET", f"/api/runs/{run_id}/logs")
    log_path = Path(run["run_dir"]) / "output.log"
    assert logs["size"] == log_path.stat().st_size and logs["text"].encode() == log_path.read_bytes()[:logs["next_offset"]]
    assert "XPUTrainingLoop" in logs["text"]  # the run's own output, not an empty file
    tail = c.request("GET", f"/api/runs/{run_id}/logs?tail=10")
    assert tail["offset"] == max(0, logs["size"] - 10) and tail["next_offset"] == logs["size"]

    run_dir = Path(run["run_dir"])
    assert run_dir.is_dir()
    assert c.delete(run_id)["deleted"] == run_id
    assert not run_dir.exists()
    status, _, body = raw(sidecar, "GET", f"/api/runs/{run_id}")
    assert status == 404 and run_id in body["error"]


def test_queue_order_waiting_reason_and_cancel(sidecar):
    c = sidecar.client
    a = sidecar.submit(harness.iris_graph(LONG), name="long-a")
    b = sidecar.submit(harness.iris_graph(LONG), name="long-b")
    queued = sidecar.submit(harness.iris_graph(LONG), name="long-c")
    try:
        sidecar.wait_for(a, "progress")
        sidecar.wait_for(b, "progress")
        run = c.run(queued)
        assert run["status"] == "queued" and run["queue_position"] == 1
        assert run["waiting_reason"] == "waiting for a free slot: cpu on this server is busy (2 of 2 slots used)"
        assert [r["id"] for r in c.runs(status="queued")["runs"]] == [queued]
        assert {r["id"] for r in c.runs(status="running")["runs"]} == {a, b}

        cancelled = c.cancel(queued, "not needed")
        assert cancelled["status"] == "cancelled" and cancelled["error"] == "cancelled: not needed"
        short = sidecar.submit(harness.iris_graph(1), name="after-a")
        assert c.run(short)["status"] == "queued"

        t0 = time.monotonic()
        stopping = c.cancel(a)
        assert stopping["cancel_requested"] and stopping["status"] in ("running", "cancelled")
        done = sidecar.finish(a)
        # a cooperative stop ends it before the grace; the bug (no stop) is killed only after it
        assert time.monotonic() - t0 < RUN_STOP_GRACE_S
        assert done["status"] == "cancelled" and done["error"] == "cancelled by request"
        events = c.events(a, limit=1000)["events"]
        ckpt = [e["payload"] for e in events if e["type"] == "artifact" and e["payload"]["kind"] == "checkpoint"]
        assert ckpt and ckpt[-1]["reason"] == "interrupt" and Path(ckpt[-1]["path"]).is_file()
        finished_a = next(e["ts"] for e in events if e["type"] == "run_finished")

        after = sidecar.finish(short)  # the slot a freed goes to the next queued run
        assert after["status"] == "succeeded"
        assigned = next(e for e in c.events(short)["events"] if e["type"] == "status"
                        and e["payload"]["status"] == "assigned")
        assert assigned["ts"] >= finished_a

        status, _, body = raw(sidecar, "POST", f"/api/runs/{a}/cancel")
        assert status == 409 and "already ended (cancelled)" in body["error"]
        status, _, body = raw(sidecar, "DELETE", f"/api/runs/{b}")
        assert status == 409 and "only a finished run can be deleted" in body["error"]
    finally:
        for rid in (a, b, queued):
            if c.run(rid)["status"] not in ("succeeded", "failed", "cancelled", "interrupted"):
                c.cancel(rid)
        assert sidecar.finish(b)["status"] == "cancelled"


def test_token_host_cors_and_body_cap(sidecar):
    graph = {"graph": harness.iris_graph(1)}
    status, headers, body = post_json(sidecar, "/api/runs", graph, token=None)
    assert status == 401 and "missing token" in body["error"] and headers["www-authenticate"].startswith("Bearer")
    status, _, body = post_json(sidecar, "/api/runs", graph, token="not-the-token")
    assert status == 403 and "wrong token" in body["error"]
    for method, path in (("POST", "/api/runs/x/cancel"), ("DELETE", "/api/runs/x"), ("GET", "/api/runs"),
                         ("GET", "/api/runs/x/events")):
        assert raw(sidecar, method, path, token=None)[0] == 401, (method, path)
        assert raw(sidecar, method, path, token="wrong")[0] == 403, (method, path)
    assert raw(sidecar, "GET", "/api/health", token=None)[0] == 200
    assert raw(sidecar, "GET", "/api/openapi.json", token=None)[0] == 200

    port = sidecar.info["port"]
    status, _, body = raw(sidecar, "GET", "/api/runs", headers={"Host": f"evil.example.com:{port}"})
    assert status == 403 and "Host header" in body["error"]
    status, _, body = raw(sidecar, "GET", "/api/health", token=None, headers={"Host": "attacker.test"})
    assert status == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost"):
        assert raw(sidecar, "GET", "/api/runs?limit=1", headers={"Host": host})[0] == 200, host

    status, headers, _ = raw(sidecar, "GET", "/api/runs?limit=1", headers={"Origin": "https://evil.example.com"})
    assert status == 200 and not any(h.startswith("access-control-") for h in headers)
    status, headers, body = raw(sidecar, "OPTIONS", "/api/runs", headers={
        "Origin": "https://evil.example.com", "Access-Control-Request-Method": "POST"})
    assert status == 405 and not any(h.startswith("access-control-") for h in headers)

    big = b'{"graph": {"1": {"class_type": "' + b"x" * (9 * 1024 * 1024) + b'"}}}'
    status, _, body = raw(sidecar, "POST", "/api/runs", big, headers={"Content-Type": "application/json"})
    assert status == 413 and "larger than" in body["error"]

    home = sidecar.home
    assert stat.S_IMODE(os.stat(home / "runtime.json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700


GOOD = harness.iris_graph(1)


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"", 400, "the body is empty"),
        (b"{", 400, "the body is not valid JSON"),
        (b"\xff\xfe", 400, "not"),
        (b"[]", 400, "the body must be a JSON object"),
        (b"{}", 400, "graph: missing"),
        (json.dumps({"graph": {}}).encode(), 400, "graph: must be a non-empty object"),
        (json.dumps({"graph": {"1": 5}}).encode(), 400, "graph['1']: a node must be an object"),
        (json.dumps({"graph": {"1": {"inputs": {}}}}).encode(), 400, "graph['1'].class_type: missing"),
        (json.dumps({"graph": {"1": {"class_type": "XPULoss", "inputs": []}}}).encode(), 400,
         "graph['1'].inputs: must be an object"),
        (json.dumps({"graph": GOOD, "extra": 1}).encode(), 400, "unknown field(s) extra"),
        (json.dumps({"graph": GOOD, "options": []}).encode(), 400, "options: must be an object"),
        (json.dumps({"graph": GOOD, "options": {"colour": "red"}}).encode(), 400, "options: unknown field(s) colour"),
        (json.dumps({"graph": GOOD, "options": {"seed": -1}}).encode(), 400, "options.seed"),
        (json.dumps({"graph": GOOD, "options": {"seed": "7"}}).encode(), 400, "options.seed"),
        (json.dumps({"graph": GOOD, "options": {"name": 5}}).encode(), 400, "options.name"),
        (json.dumps({"graph": GOOD, "options": {"deterministic": "yes"}}).encode(), 400, "options.deterministic"),
        (json.dumps({"graph": GOOD, "options": {"device": "gpu0"}}).encode(), 400, "options.device"),
        (json.dumps({"graph": GOOD, "options": {"target": {"devices": ["cuda:0"]}}}).encode(), 400,
         "this server does not offer cuda:0 (it offers cpu)"),
        (json.dumps({"graph": GOOD, "options": {"target": "gpu-box"}}).encode(), 400,
         "unknown worker 'gpu-box': no worker with this name has connected since the server started"),
        (json.dumps({"graph": GOOD, "options": {"target": {"memory_gib": -2}}}).encode(), 400,
         "options.target.memory_gib"),
        # a node class that is not the fleet's own makes it a ComfyUI run (docs/comfyui.md)
        (json.dumps({"graph": {"1": {"class_type": "NoSuchNode", "inputs": {}}}}).encode(), 400,
         "this server has no ComfyUI to run workflows: start the sidecar with --comfyui PATH"),
        (json.dumps({"graph": {**GOOD, "7": {**GOOD["7"], "inputs": {**GOOD["7"]["inputs"], "epochs": "many"}}}}).encode(),
         400, "'epochs' of node 7 (XPUTrainingLoop)"),
    ],
)
def test_bad_bodies_get_4xx_with_a_message_naming_the_field(sidecar, body, status, fragment):
    before = sidecar.client.runs(limit=1)["total"]
    got, _, answer = raw(sidecar, "POST", "/api/runs", body, headers={"Content-Type": "application/json"})
    assert got == status and fragment in answer["error"], answer
    if "class_type 'NoSuchNode'" in fragment or "epochs" in fragment:
        assert answer["node_errors"]  # ComfyUI-shaped node errors come with it
    assert sidecar.client.runs(limit=1)["total"] == before  # nothing was queued


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("/api/runs?limit=0", "limit: must be an integer between 1 and 1000"),
        ("/api/runs?limit=ten", "limit: must be an integer"),
        ("/api/runs?offset=-3", "offset: must be an integer >= 0"),
        ("/api/runs?status=bogus", "status: unknown bogus"),
        ("/api/runs/{id}/events?cursor=-1", "cursor: must be an integer >= 0"),
        ("/api/runs/{id}/events?wait=1000", "wait: must be a number between 0 and 60"),
        ("/api/runs/{id}/events?limit=100000", "limit: must be an integer between 1 and 1000"),
        ("/api/runs/{id}/logs?format=xml", "format: use json or text"),
        ("/api/runs?offset=99999999999999999999", "offset: must be an integer >= 0 (at most 2^63-1)"),
        ("/api/runs/{id}/events?cursor=99999999999999999999", "cursor: must be an integer >= 0"),
        ("/api/runs/{id}/logs?offset=99999999999999999999", "offset: must be an integer >= 0"),
        ("/api/runs/nope", "no run 'nope'"),
        ("/api/nothing-here", "no route GET /api/nothing-here"),
    ],
)
def test_bad_queries_get_4xx_naming_the_parameter(sidecar, path, fragment):
    rid = sidecar.client.runs(limit=1)["runs"]
    path = path.replace("{id}", rid[0]["id"] if rid else "x")
    status, _, body = raw(sidecar, "GET", path)
    assert 400 <= status < 500 and fragment in body["error"], body


WRONG_TYPE = {"string": 12345, "integer": "x", "number": "x", "boolean": "x", "object": "x", "array": "x"}


def malformed_bodies(doc: dict, op: dict) -> list[bytes]:
    """Bodies that break the route's own request schema (from the OpenAPI document)."""
    rb = op.get("requestBody")
    if not rb:
        return []

    def resolve(schema):
        while "$ref" in schema:
            schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        return schema

    schema = resolve(rb["content"]["application/json"]["schema"])
    out = [b"not json", b"{", bytes(range(256)), b'{"a":' * 500]
    if schema.get("type") == "object":
        out += [b"[1, 2]", b'"text"', b"42", b"null", b"true"]
        if schema.get("required"):
            out.append(b"{}")
        if schema.get("additionalProperties") is False:
            out.append(json.dumps({"__fuzz_unknown__": 1}).encode())
        for name, prop in (schema.get("properties") or {}).items():
            prop = resolve(prop)
            kind = prop.get("type")
            if isinstance(kind, str) and kind in WRONG_TYPE:
                out.append(json.dumps({name: WRONG_TYPE[kind]}).encode())
            elif "enum" in prop:
                out.append(json.dumps({name: "__not_in_enum__"}).encode())
    return out


def test_openapi_describes_every_route_and_post_routes_reject_malformed_bodies(sidecar):
    status, _, doc = raw(sidecar, "GET", "/api/openapi.json", token=None)
    assert status == 200 and doc["openapi"].startswith("3.")
    paths = doc["paths"]
    for path, methods in {"/api/runs": {"get", "post"}, "/api/runs/{run_id}": {"get", "delete"},
                          "/api/runs/{run_id}/cancel": {"post"}, "/api/runs/{run_id}/events": {"get"},
                          "/api/runs/{run_id}/events/stream": {"get"}, "/api/runs/{run_id}/metrics": {"get"},
                          "/api/runs/{run_id}/metrics.csv": {"get"}, "/api/runs/{run_id}/artifacts": {"get"},
                          "/api/runs/{run_id}/logs": {"get"}, "/api/health": {"get"}}.items():
        assert methods <= set(paths[path]), path
    # A finished run for {run_id}: a malformed body must be refused before anything happens to it.
    rid = sidecar.submit(harness.iris_graph(1), name="fuzz-target")
    sidecar.finish(rid)
    checked: dict[str, int] = {}
    for path, ops in paths.items():
        for method in ("post", "put", "patch"):
            if method not in ops:
                continue
            concrete = path.replace("{run_id}", rid)
            for param in ("name", "path", "device", "worker", "id"):
                concrete = concrete.replace("{" + param + "}", "fuzz-missing")
            for body in malformed_bodies(doc, ops[method]):
                got, _, answer = raw(sidecar, method.upper(), concrete, body,
                                     headers={"Content-Type": "application/json"})
                assert 400 <= got < 500, (method, path, body[:40], got, answer)
                assert isinstance(answer, dict) and isinstance(answer.get("error"), str) and answer["error"], \
                    (path, answer)
                checked[f"{method} {path}"] = checked.get(f"{method} {path}", 0) + 1
    assert checked["post /api/runs"] >= 10 and checked["post /api/runs/{run_id}/cancel"] >= 8
    assert sidecar.client.run(rid)["status"] == "succeeded"  # nothing a fuzzed call did changed it


def test_live_event_stream_ends_with_run_finished(sidecar):
    rid = sidecar.submit(harness.iris_graph(1), name="sse")
    host, port = sidecar.info["host"], sidecar.info["port"]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("GET", f"/api/runs/{rid}/events/stream", headers={
        "Host": f"127.0.0.1:{port}", "Authorization": f"Bearer {sidecar.info['token']}"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
    text = resp.read().decode()  # the server closes the stream after run_finished
    conn.close()
    ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
    kinds = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
    assert ids == list(range(1, len(ids) + 1)) and kinds[-1] == "run_finished"
    assert sidecar.client.run(rid)["status"] == "succeeded"
    # Resuming with Last-Event-ID sends only what comes after it.
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", f"/api/runs/{rid}/events/stream", headers={
        "Host": f"127.0.0.1:{port}", "Authorization": f"Bearer {sidecar.info['token']}",
        "Last-Event-ID": str(ids[-2])})
    tail = conn.getresponse().read().decode()
    conn.close()
    assert [int(line[4:]) for line in tail.splitlines() if line.startswith("id: ")] == [ids[-1]]


def test_a_run_process_that_dies_fails_that_run_only(sidecar):
    rid = sidecar.submit(harness.iris_graph(LONG), name="crash")
    started = sidecar.wait_for(rid, "run_started")
    sidecar.wait_for(rid, "progress")
    pid = started["payload"]["pid"]
    assert sidecar.client.run(rid)["execution_facts"]["pid"] == pid  # known while it runs
    os.kill(pid, 9)  # what the kernel's OOM killer does
    run = sidecar.finish(rid)
    assert run["status"] == "failed"
    assert run["error"] == "the run's process was killed by SIGKILL (out of memory?); see its log"
    assert sidecar.client.health()["status"] == "ok"  # the sidecar is not affected
    after = sidecar.submit(harness.iris_graph(1), name="after-crash")
    assert sidecar.finish(after)["status"] == "succeeded"


def test_two_runs_at_once_long_polled_get_gapless_cursors(sidecar):
    """Events of two concurrent runs, read by long-polls (with wait) in small pages from several
    threads at once: every reader sees 1, 2, 3, ... up to the run's last cursor, nothing twice."""
    import threading

    runs = [sidecar.submit(harness.iris_graph(4), name=f"concurrent-{i}") for i in range(2)]
    seen: dict[tuple[str, int], list[int]] = {}

    def read(run_id: str, limit: int) -> None:
        c = harness.Client(sidecar.info["url"], sidecar.info["token"], timeout=30)
        got, cursor = [], 0
        for _ in range(2000):  # bounded: each page moves on or waits up to 5 s for the next event
            page = c.events(run_id, cursor=cursor, wait=5, limit=limit)
            got += [e["cursor"] for e in page["events"]]
            cursor = page["cursor"]
            if page["done"]:
                break
        seen[(run_id, limit)] = got

    threads = [threading.Thread(target=read, args=(rid, limit)) for rid in runs for limit in (1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for rid in runs:
        run = sidecar.client.run(rid)
        assert run["status"] == "succeeded"
        for limit in (1, 5):
            assert seen[(rid, limit)] == list(range(1, run["cursor"] + 1)), (rid, limit)
    first = [sidecar.client.events(rid, limit=1000)["events"] for rid in runs]
    starts = [next(e["ts"] for e in evs if e["type"] == "run_started") for evs in first]
    ends = [next(e["ts"] for e in evs if e["type"] == "run_finished") for evs in first]
    assert starts[1] < ends[0] and starts[0] < ends[1]  # they really ran at the same time (CPU: 2 slots)
