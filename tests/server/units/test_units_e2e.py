"""End to end (docs/services.md): a real sidecar and three real agents on loopback with simulated
cards (a: cuda:0, b: cuda:0, c: cuda:0 + cuda:1); units of the built-in model server run real
torch.distributed (gloo) pipelines across agent processes; crashes are real SIGKILLs.

The tests share one fleet (starting agents costs their warm parents' preload) and run in order; each
deletes its service, so the next one finds the cards free.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from units_harness import Fleet, save_mlp  # registered by tests/server/units/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

MODEL = "models/units-mlp.safetensors"  # under the fleet's outputs folder (where ModelSaver writes)


def body(name: str, size: int = 2, guard: bool = True, **extra: Any) -> dict[str, Any]:
    out = {"name": name, "program": {"model": {"path": MODEL, "max_batch": 256}}, "unit": {"size": size, "guard": guard},
           "target": {"device": "cuda"}, "routing": {"wait_s": 60, "request_timeout_s": 60},
           "restart": {"max_restarts": 5, "backoff_s": 0.1, "backoff_max_s": 1}}
    out.update(extra)
    return out


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    home = tmp_path_factory.mktemp("units") / "home"
    save_mlp(home / "outputs" / MODEL)
    f = Fleet(home, {"a": "cuda:0=24", "b": "cuda:0=24", "c": "cuda:0=24,cuda:1=24"})
    try:
        f.wait_online()
        yield f
    finally:
        f.stop()


class Client:
    """One kept-alive HTTP connection to the sidecar (a client of the service)."""

    def __init__(self, fleet: Fleet) -> None:
        u = urllib.parse.urlsplit(fleet.sidecar.url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        self.auth = {"Authorization": f"Bearer {fleet.sidecar.token}", "Content-Type": "application/json"}

    def infer(self, service: str, payload: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        self.conn.request("POST", f"/api/services/{service}/infer", json.dumps(payload), self.auth)
        resp = self.conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data or b"null"), dict(resp.getheaders())

    def close(self) -> None:
        self.conn.close()


def samples(n: int, seed: int = 0) -> list[list[float]]:
    import torch

    return torch.randn(n, 64, generator=torch.Generator().manual_seed(seed)).tolist()


def create_ready(fleet: Fleet, spec: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    status, out = fleet.call("POST", "/api/services", spec)
    assert status == 201, out
    return fleet.wait_service(spec["name"], lambda s: s["state"] == "ready", timeout, "ready")


def delete(fleet: Fleet, name: str) -> list[int]:
    pids = [i["pid"] for u in fleet.service(name)["units"] for i in u["instances"] if i["pid"]]
    status, out = fleet.call("DELETE", f"/api/services/{name}")
    assert status == 200, out
    return pids


def until(pred, timeout: float) -> bool:
    """Poll ``pred`` (a client thread's results: no event to wait on) until it holds; bounded."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def gone(pids: list[int], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.1)
    return False


class Loop(threading.Thread):
    """A client sending requests one after another until stopped (or ``limit`` requests)."""

    def __init__(self, fleet: Fleet, service: str, limit: int | None = None, counter: list[int] | None = None,
                 hold: threading.Event | None = None) -> None:
        super().__init__(daemon=True)
        self.fleet = fleet
        self.client = Client(fleet)
        self.service, self.limit, self.counter, self.hold = service, limit, counter, hold
        self.stop = threading.Event()
        self.results: list[tuple[float, float, int, str | None, str | None]] = []
        self.lock = threading.Lock()

    def run(self) -> None:
        x = samples(1, seed=7)
        while not self.stop.is_set():
            if self.counter is not None:
                with self.lock:
                    if self.counter[0] >= self.limit:
                        break
                    self.counter[0] += 1
                    n = self.counter[0]
                # the last quarter waits until the update has finished (bounded): it runs *during* the update
                if self.hold is not None and n > self.limit * 3 // 4:
                    self.hold.wait(600)
            t0 = time.time()
            try:
                status, _, headers = self.client.infer(self.service, {"inputs": x})
            except (OSError, http.client.HTTPException):  # counted as a failed request; reconnect
                status, headers = -1, {}
                self.client.close()
                self.client = Client(self.fleet)
            self.results.append((t0, time.time(), status, headers.get("X-Xpufleet-Unit"),
                                 headers.get("X-Xpufleet-Generation")))
        self.client.close()

    def started(self) -> Loop:
        self.start()
        return self


def unit_of(svc: dict[str, Any]) -> dict[str, Any]:
    (u,) = [u for u in svc["units"] if u["state"] not in ("draining", "stopping")]
    return u


CONTRACT = ("RANK_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LWS_LEADER_ADDRESS",
            "LWS_GROUP_SIZE", "LWS_WORKER_INDEX", "UNIT_ID", "UNIT_GENERATION")


def check_environment(unit: dict[str, Any], generation: int) -> None:
    """Every instance sees the U2 contract, as the instance process itself reported it (os.environ of the
    model server once it arrived at the barrier; a warm-forked process's /proc environ shows its parent's)."""
    for inst in unit["instances"]:
        r = str(inst["rank"])
        want = {"RANK_ID": r, "RANK": r, "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": unit["master_addr"],
                "MASTER_PORT": str(unit["master_port"]), "LWS_LEADER_ADDRESS": unit["master_addr"],
                "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": r, "UNIT_ID": unit["id"],
                "UNIT_GENERATION": str(generation), "XPUFLEET_UNIT_RENDEZVOUS": unit["rendezvous"],
                "CUDA_VISIBLE_DEVICES": inst["device"].split(":")[1]}  # its one card, seen as cuda:0
        assert inst["env"] == want, inst
        assert psutil.pid_exists(inst["pid"])


def test_a_unit_of_two_across_two_agents_answers_like_the_unsplit_model(fleet):
    import torch

    from xpufleet.nodes.io import load_model

    svc = create_ready(fleet, body("pipe"))
    unit = unit_of(svc)
    assert [(i["worker"], i["device"]) for i in unit["instances"]] == [("a", "cuda:0"), ("b", "cuda:0")]
    assert unit["generation"] == 1 and unit["barrier_passed"] and unit["master_addr"] == "127.0.0.1"
    check_environment(unit, 1)
    assert unit["rendezvous"].startswith(f"{unit['id']}-g1-")
    client = Client(fleet)
    x = samples(37)
    status, out, headers = client.infer("pipe", {"inputs": x})
    assert status == 200, out
    assert headers["X-Xpufleet-Unit"] == unit["id"] and headers["X-Xpufleet-Generation"] == "1"
    assert out["pid"] == unit["instances"][0]["pid"] and out["stage"]["layers"][0] == 0  # rank 0 answered
    ref = load_model(fleet.home / "outputs" / MODEL)
    with torch.inference_mode():
        expected = ref(torch.tensor(x))
    diff = (torch.tensor(out["outputs"]) - expected).abs().max().item()
    assert diff <= 1e-5, diff
    status, out, _ = client.infer("pipe", {"inputs": x[:5], "output": "classes"})
    assert out["outputs"] == expected[:5].argmax(-1).tolist()
    client.close()
    # concurrent requests are batched through the pipeline: 16 clients released together by a barrier;
    # whether two meet in one batch depends on this machine's scheduling, so up to 5 rounds are tried
    batched = 0
    for _round in range(5):
        answers: list[Any] = []
        gate = threading.Barrier(16)

        def ask(i: int, gate: threading.Barrier, answers: list[Any]) -> None:
            c = Client(fleet)
            gate.wait(60)
            answers.append(c.infer("pipe", {"inputs": [x[i]]}))

        threads = [threading.Thread(target=ask, args=(i, gate, answers)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(answers) == 16 and all(a[0] == 200 for a in answers)
        assert all(len(out["outputs"]) == 1 for _, out, _ in answers)
        batched = max(a[1]["batch_rows"] for a in answers)
        if batched > 1:
            break
    assert batched > 1
    shown = fleet.cli("services", "show", "pipe")
    assert shown.returncode == 0 and "service pipe: ready" in shown.stdout and "rank 1: b cuda:0" in shown.stdout


def test_guard_kill9_of_rank1_restarts_every_instance_behind_a_barrier(fleet):
    before = unit_of(fleet.service("pipe"))
    old_pids = [i["pid"] for i in before["instances"]]
    loop = Loop(fleet, "pipe").started()
    assert until(lambda: any(r[4] == "1" and r[2] == 200 for r in loop.results), 120)  # generation 1 answers
    os.kill(old_pids[1], signal.SIGKILL)
    after = fleet.wait_service("pipe", lambda s: unit_of(s)["generation"] >= 2 and unit_of(s)["state"] == "ready",
                               300, "generation 2 ready")
    assert until(lambda: any(r[4] == "2" and r[2] == 200 for r in loop.results), 120)  # generation 2 answers
    loop.stop.set()
    loop.join(180)
    unit = unit_of(after)
    new_pids = [i["pid"] for i in unit["instances"]]
    assert set(new_pids).isdisjoint(old_pids) and gone(old_pids)
    assert [i["generation"] for i in unit["instances"]] == [2, 2] and unit["generation"] == 2
    assert all(i["restarts"] == 1 for i in unit["instances"])
    check_environment(unit, 2)
    assert unit["rendezvous"] != before["rendezvous"] and unit["rendezvous"].startswith(f"{unit['id']}-g2-")
    hist = unit["history"]
    failed = next(h for h in hist if h["event"] == "instance_failed" and h["generation"] == 1)
    assert failed["rank"] == 1 and "killed by SIGKILL" in failed["cause"]
    barrier = next(h for h in hist if h["event"] == "barrier_passed" and h["generation"] == 2)
    assert barrier["ts"] > failed["ts"]
    # nothing was routed to the unit between the failure and the barrier all instances reached
    assert barrier["routed"] == failed["routed"]
    statuses = [r[2] for r in loop.results]
    assert statuses and all(s == 200 for s in statuses), statuses
    assert any(r[4] == "1" for r in loop.results) and any(r[4] == "2" for r in loop.results)
    pids = delete(fleet, "pipe")
    assert gone(pids)


def test_guard_off_restarts_rank1_alone(fleet):
    svc = create_ready(fleet, body("solo", guard=False))
    unit = unit_of(svc)
    pid0, pid1 = (i["pid"] for i in unit["instances"])
    os.kill(pid1, signal.SIGKILL)
    after = fleet.wait_service(
        "solo", lambda s: unit_of(s)["instances"][1]["attempt"] == 1 and unit_of(s)["instances"][1]["pid"] not in
        (None, pid1) and unit_of(s)["instances"][1]["state"] in ("running", "arrived"), 300, "rank 1 restarted")
    u = unit_of(after)
    assert u["generation"] == 1 and [i["generation"] for i in u["instances"]] == [1, 1]
    assert u["instances"][0]["pid"] == pid0 and psutil.pid_exists(pid0)  # rank 0 was not touched
    assert u["instances"][1]["restarts"] == 1 and "killed by SIGKILL" in u["instances"][1]["last_exit"]
    assert [h["event"] for h in u["history"]].count("restarting_instance") == 1
    assert not any(h["event"] == "restarting" for h in u["history"])
    assert not psutil.pid_exists(pid1) or psutil.Process(pid1).status() == psutil.STATUS_ZOMBIE
    # The restarted rank cannot rejoin the survivors' process group (the NCCL risk guard exists for):
    # rank 0 finds its group broken at the next request, leaves, and instance 0 failing rebuilds the unit.
    client = Client(fleet)
    status, out, headers = client.infer("solo", {"inputs": samples(2)})
    client.close()
    assert status == 200, out
    assert headers["X-Xpufleet-Generation"] == "2"
    rebuilt = unit_of(fleet.service("solo"))
    assert rebuilt["generation"] == 2 and rebuilt["instances"][0]["pid"] != pid0
    assert any(h["event"] == "instance_failed" and h["rank"] == 0 for h in rebuilt["history"])
    assert gone(delete(fleet, "solo"))


def test_a_rolling_update_under_2000_requests_fails_none(fleet):
    svc = create_ready(fleet, body("roll"))
    old = unit_of(svc)
    old_pids = [i["pid"] for i in old["instances"]]
    counter, updated = [0], threading.Event()
    loops = [Loop(fleet, "roll", limit=2000, counter=counter, hold=updated).started() for _ in range(4)]
    while counter[0] < 200:
        time.sleep(0.02)
    new_body = body("roll")
    new_body["program"]["model"]["max_batch"] = 128  # a new spec version
    status, out = fleet.call("PUT", "/api/services/roll", new_body)
    assert status == 202, out
    done = fleet.wait_service("roll", lambda s: (s["update"] or {}).get("state") not in ("rolling", "rolling_back"),
                              600, "update finished")
    updated.set()
    for loop in loops:
        loop.join(600)
    results = [r for loop in loops for r in loop.results]
    assert len(results) == 2000
    failed = [r for r in results if r[2] != 200]
    assert done["update"]["state"] == "done", done["update"]
    assert failed == []
    (new,) = done["units"]
    assert new["version"] == 2 and new["state"] == "ready" and new["id"] != old["id"]
    assert sorted((i["worker"], i["device"]) for i in new["instances"]) == [("c", "cuda:0"), ("c", "cuda:1")]
    assert {r[3] for r in results} == {old["id"], new["id"]}  # traffic moved from the old unit to the new one
    last_old = max(r[1] for r in results if r[3] == old["id"])
    first_new = min(r[0] for r in results if r[3] == new["id"])
    assert first_new < last_old + 60  # they overlapped or followed closely: make-before-break
    assert gone(old_pids)  # the old unit's processes are gone
    assert done["spec"]["program"]["model"]["max_batch"] == 128
    assert gone(delete(fleet, "roll"))


def test_an_update_whose_new_unit_never_becomes_ready_is_rolled_back(fleet):
    svc = create_ready(fleet, body("back"))
    old = unit_of(svc)
    broken = body("back", restart={"max_restarts": 1, "backoff_s": 0.1, "backoff_max_s": 0.1})
    broken["program"]["model"]["path"] = "models/not-there.safetensors"
    status, out = fleet.call("PUT", "/api/services/back", broken)
    assert status == 202 and out["state"] == "updating", out
    done = fleet.wait_service("back", lambda s: s["update"]["state"] not in ("rolling", "rolling_back"), 300,
                              "update ended")
    upd = done["update"]
    assert upd["state"] == "rolled_back" and upd["from_version"] == 1 and upd["to_version"] == 2, upd
    assert "failed" in upd["reason"] and "not found on this worker" in upd["reason"], upd["reason"]
    assert done["version"] == 1 and done["spec"]["program"]["model"]["path"] == MODEL
    (unit,) = done["units"]
    assert unit["id"] == old["id"] and unit["state"] == "ready"
    assert [i["pid"] for i in unit["instances"]] == [i["pid"] for i in old["instances"]]  # never touched
    client = Client(fleet)
    assert client.infer("back", {"inputs": samples(1)})[0] == 200
    client.close()
    assert gone(delete(fleet, "back"))


def test_the_restart_budget_ends_in_failed_in_the_api_and_the_cli(fleet):
    spec = {"name": "crash", "program": {"command": [sys.executable, "-c", "import sys; sys.exit(3)"]},
            "unit": {"size": 2, "guard": True}, "target": {"device": "cuda"}, "routing": {"wait_s": 0.5},
            "restart": {"max_restarts": 2, "backoff_s": 0.1, "backoff_max_s": 0.2}}
    status, out = fleet.call("POST", "/api/services", spec)
    assert status == 201, out
    svc = fleet.wait_service("crash", lambda s: s["state"] == "failed", 300, "failed")
    unit = unit_of(svc)
    assert unit["state"] == "failed" and unit["generation"] == 3  # the first start and 2 restarts
    assert "the restart budget (2 restart(s) within 600 s) is spent" in unit["failed_reason"]
    assert "exited with code 3" in unit["failed_reason"]
    assert [h["event"] for h in unit["history"]].count("restarting") == 2
    exits = [i["last_exit"] for i in unit["instances"]]
    assert all(exits) and any("exited with code 3" in e for e in exits), exits  # the others: ended by the guard
    status, out = fleet.call("POST", "/api/services/crash/infer", {"inputs": [[0.0]]})
    assert status == 503 and "unit crash-1 is failed" in out["error"]
    shown = fleet.cli("services", "show", "crash")
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "service crash: failed" in shown.stdout and "restart budget" in shown.stdout
    listed = fleet.cli("services", "list", "--json")
    assert json.loads(listed.stdout)["services"][0]["state"] == "failed"
    # its cards were freed: a new unit can take them
    fleet.wait_service("crash", lambda s: True)
    delete(fleet, "crash")


def test_the_readme_example_trains_serves_and_answers(fleet):
    """README "Services (Units)": train samples/mlp_digits.json, serve samples/serve_mlp_digits.json on the
    simulated cards, send samples/serve_mlp_digits.request.json (four validation digits: 1, 4, 8, 6)."""
    examples = Path(__file__).resolve().parents[3] / "samples"
    trained = fleet.cli("run", str(examples / "mlp_digits.json"), "--wait", timeout=900)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    served = fleet.cli("serve", str(examples / "serve_mlp_digits.json"), "--wait", "--timeout", "300", timeout=400)
    assert served.returncode == 0 and "service digits: ready" in served.stdout, served.stdout + served.stderr
    answer = fleet.cli("services", "infer", "digits", str(examples / "serve_mlp_digits.request.json"))
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout)["outputs"] == [1, 4, 8, 6]
    same = fleet.cli("services", "update", "digits", str(examples / "serve_mlp_digits.json"), "--wait")
    assert same.returncode == 0 and "service digits: the spec is unchanged; nothing to update" in same.stdout, \
        same.stdout + same.stderr
    pids = [i["pid"] for u in fleet.service("digits")["units"] for i in u["instances"] if i["pid"]]
    removed = fleet.cli("services", "delete", "digits", timeout=120)
    assert removed.returncode == 0 and "service digits deleted (1 unit(s) stopped)" in removed.stdout, \
        removed.stdout + removed.stderr
    assert len(pids) == 2 and gone(pids)
    listed = fleet.cli("services", "list", "--json")
    assert all(s["name"] != "digits" for s in json.loads(listed.stdout)["services"]), listed.stdout


def test_services_survive_a_sidecar_restart(fleet):
    svc = create_ready(fleet, body("keep"))
    unit = unit_of(svc)
    pids = [i["pid"] for i in unit["instances"]]
    fleet.sidecar.kill9()
    fleet.sidecar.start()  # the same XPUFLEET_HOME; the agents find it through the runtime file
    fleet.wait_online()
    again = fleet.wait_service("keep", lambda s: s["state"] == "ready", 300, "ready after the restart")
    u = unit_of(again)
    assert u["id"] == unit["id"] and u["generation"] == 1  # taken over, not restarted
    assert [i["pid"] for i in u["instances"]] == pids
    assert any(h["event"] == "server_restarted" for h in u["history"])
    client = Client(fleet)
    status, out, headers = client.infer("keep", {"inputs": samples(3)})
    client.close()
    assert status == 200 and headers["X-Xpufleet-Unit"] == unit["id"], out
    listed = fleet.cli("services", "list")
    assert "service keep: ready" in listed.stdout
    exported = fleet.cli("services", "export", "keep", "--format", "lws")
    lws, service = yaml.safe_load_all(exported.stdout)
    assert lws["kind"] == "LeaderWorkerSet" and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert gone(delete(fleet, "keep"))
