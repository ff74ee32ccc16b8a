"""Distributed inference Units (issue 14), in one run: routing overhead, router throughput, guard recovery,
and the same recovery done by hand for a plain torchrun-launched pair.

    python bench/bench_units.py [--requests 400] [--seconds 10] [--kills 3]

It starts a real sidecar and two real agents (simulated cards ``cuda:0`` each: the work runs on the
CPU) in a temporary XPUFLEET_HOME, saves an MLP for 8x8 digits with ModelSaver's own function and
serves it as one unit of 2 (pipeline stages on the two agents, gloo over loopback, ``guard: true``):

* routing overhead: ``--requests`` requests of one sample, alternating between rank 0 directly
  (``POST http://rank0/infer``) and the sidecar's router (``POST /api/services/bench/infer``), each over a
  kept-alive connection; p50/p99 of both and their difference (goal: p50 overhead <= 1 ms);
* throughput: 8 concurrent clients through the router for ``--seconds``: requests/s;
* guard recovery (``--kills`` times): a client sends requests one after another; ``kill -9`` of rank 1;
  the time from the kill to the first successful answer of the new generation (goal <= 2 s);
* baseline: the same model server as a plain ``torchrun --nproc-per-node 2`` pair; ``kill -9`` of rank 1;
  restarted by hand the way an operator's script would: notice the death (polling every 0.1 s), end
  what is left of the pair, launch torchrun again, wait for rank 0's health check, send the request.

Figures are printed (and a JSON line), never asserted: the 2 shared cores of this machine make them noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchlib import tests_module  # bench/ (this script's folder) is on sys.path

fh = tests_module("server/fleet_harness.py")  # the e2e suites' sidecar and agents, stopped by PID
wait_until = tests_module("processes.py").wait_until  # the tests' bounded poll
PY = sys.executable
CLIENTS = 8
GOAL_OVERHEAD_MS = 1.0
GOAL_RECOVERY_S = 2.0


def save_model(path: Path) -> None:
    from xpufleet.nodes.io import save_model as save
    from xpufleet.nodes.models import build_model, make_spec

    spec = make_spec("mlp", {"in_features": 64, "out_features": 10, "hidden": [64, 32], "activation": "relu",
                             "dropout": 0.0, "batch_norm": False}, {"task": "classification", "num_classes": 10}, [64])
    path.parent.mkdir(parents=True, exist_ok=True)
    save(build_model(spec, seed=0), path, "safetensors")


class Conn:
    """A kept-alive HTTP connection (one client)."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None) -> None:
        self.host, self.port = host, port
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.c = http.client.HTTPConnection(host, port, timeout=120)

    def post(self, path: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        try:
            self.c.request("POST", path, body, self.headers)
            r = self.c.getresponse()
            return r.status, r.read(), dict(r.getheaders())
        except (OSError, http.client.HTTPException):
            self.c.close()
            self.c = http.client.HTTPConnection(self.host, self.port, timeout=120)
            return -1, b"", {}

    def get(self, path: str) -> int:
        try:
            self.c.request("GET", path, headers=self.headers)
            r = self.c.getresponse()
            r.read()
            return r.status
        except (OSError, http.client.HTTPException):
            self.c.close()
            self.c = http.client.HTTPConnection(self.host, self.port, timeout=120)
            return -1


def api(sc: Any) -> Conn:
    """A kept-alive connection to the sidecar (a ``fleet_harness.SidecarProc``), with its token."""
    return Conn(sc.url.split("//")[1].rsplit(":", 1)[0], sc.port, {"Authorization": f"Bearer {sc.token}"})


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def overhead(sc: Any, unit: dict[str, Any], n: int) -> dict[str, float]:
    body = json.dumps({"inputs": [[0.1] * 64]}).encode()
    direct = Conn(unit["master_addr"], unit["instances"][0]["port"])
    routed = api(sc)
    for _ in range(30):  # warm both paths (connections, caches)
        direct.post("/infer", body)
        routed.post("/api/services/bench/infer", body)
    d_ms, r_ms = [], []
    for _ in range(n):
        t = time.perf_counter()
        assert direct.post("/infer", body)[0] == 200
        d_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        assert routed.post("/api/services/bench/infer", body)[0] == 200
        r_ms.append((time.perf_counter() - t) * 1000)
    return {"direct_p50_ms": pct(d_ms, 50), "direct_p99_ms": pct(d_ms, 99), "router_p50_ms": pct(r_ms, 50),
            "router_p99_ms": pct(r_ms, 99), "overhead_p50_ms": pct(r_ms, 50) - pct(d_ms, 50),
            "overhead_p99_ms": pct(r_ms, 99) - pct(d_ms, 99)}


def throughput(sc: Any, seconds: float) -> dict[str, float]:
    body = json.dumps({"inputs": [[0.1] * 64]}).encode()
    stop = time.monotonic() + seconds
    counts = [0] * CLIENTS
    errors = [0] * CLIENTS

    def client(i: int) -> None:
        c = api(sc)
        while time.monotonic() < stop:
            if c.post("/api/services/bench/infer", body)[0] == 200:
                counts[i] += 1
            else:
                errors[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    return {"clients": CLIENTS, "requests_per_s": sum(counts) / elapsed, "errors": sum(errors)}


def guard_recovery(sc: Any, kills: int) -> list[float]:
    body = json.dumps({"inputs": [[0.1] * 64]}).encode()
    out = []
    for _ in range(kills):
        svc = sc.ok("GET", "/api/services/bench")
        unit = svc["units"][0]
        gen, pid1 = unit["generation"], unit["instances"][1]["pid"]
        c = api(sc)
        assert c.post("/api/services/bench/infer", body)[0] == 200
        t_kill = time.monotonic()
        os.kill(pid1, signal.SIGKILL)
        while True:
            status, _, headers = c.post("/api/services/bench/infer", body)
            if status == 200 and int(headers.get("X-Xpufleet-Generation", "0")) > gen:
                out.append(time.monotonic() - t_kill)
                break
            if time.monotonic() - t_kill > 300:
                raise RuntimeError("no answer from the new generation within 300 s")
        wait_until(lambda: sc.ok("GET", "/api/services/bench")["state"] == "ready", "ready again", 300, 0.05)
    return out


def torchrun_recovery(home: Path, model: Path, kills: int) -> list[float]:
    """The baseline: a torchrun pair of the same model server, restarted by hand after kill -9 of rank 1."""
    body = json.dumps({"inputs": [[0.1] * 64]}).encode()
    out = []
    http_port = fh.free_port()
    env = {**os.environ, "XPUFLEET_HOME": str(home), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "XPUFLEET_UNIT_PROGRAM": json.dumps({"model": {"path": str(model), "max_batch": 64}}),
           "XPUFLEET_UNIT_PORT": str(http_port), "XPUFLEET_UNIT_HOST": "127.0.0.1"}
    workdir = home / "torchrun"
    workdir.mkdir(exist_ok=True)

    def launch() -> subprocess.Popen:
        env["XPUFLEET_UNIT_RENDEZVOUS"] = f"torchrun-{time.monotonic_ns()}"
        return subprocess.Popen([PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "0",
                                 "--master-addr", "127.0.0.1", "--master-port", str(fh.free_port()),
                                 "-m", "xpufleet.server.units.model_server", str(workdir)],
                                env=env, stdout=open(home / "torchrun.out", "ab"), stderr=subprocess.STDOUT,
                                start_new_session=True)

    def rank_pid(proc: subprocess.Popen, rank: str) -> int | None:
        import psutil

        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.environ().get("RANK") == rank and "model_server" in " ".join(child.cmdline()):
                    return child.pid
            except psutil.Error:
                continue
        return None

    def end_pair(proc: subprocess.Popen) -> None:
        """SIGKILL torchrun and its ranks: torch's launcher may start each rank in a session of its own,
        which a kill of torchrun's process group would leave running."""
        import psutil

        ranks = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for rank in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.kill()
        proc.wait(30)
        psutil.wait_procs(ranks, timeout=30)

    def healthy() -> bool:
        return Conn("127.0.0.1", http_port).get("/health") == 200

    proc = launch()
    deadline = time.monotonic() + 300
    while not healthy():
        if time.monotonic() > deadline:
            raise RuntimeError("the torchrun pair did not come up (see torchrun.out)")
        time.sleep(0.1)
    try:
        for _ in range(kills):
            pid1 = rank_pid(proc, "1")
            assert pid1 is not None
            t_kill = time.monotonic()
            os.kill(pid1, signal.SIGKILL)
            while _alive(pid1):  # the operator notices the death
                time.sleep(0.1)
            time.sleep(0.1)  # ... at the next look
            end_pair(proc)  # ends what is left of the pair
            proc = launch()  # and launches it again
            while not healthy():
                time.sleep(0.1)
                if time.monotonic() - t_kill > 300:
                    raise RuntimeError("the relaunched pair did not come up")
            while Conn("127.0.0.1", http_port).post("/infer", body)[0] != 200:
                time.sleep(0.05)
            out.append(time.monotonic() - t_kill)
    finally:
        end_pair(proc)
    return out


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per path for the routing overhead")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of the 8-client throughput run")
    parser.add_argument("--kills", type=int, default=3, help="guard recoveries (and torchrun restarts) measured")
    parser.add_argument("--keep", action="store_true", help="keep the temporary XPUFLEET_HOME")
    args = parser.parse_args()
    fleet = fh.Fleet(Path(tempfile.mkdtemp(prefix="xpufleet-bench-units-")))
    home = fleet.home
    model = home / "outputs" / "models" / "bench.safetensors"
    save_model(model)
    try:
        sc = fleet.sidecar()
        for name in ("a", "b"):
            fleet.agent("--name", name, "--simulate", "cuda:0=24", label=name)
        wait_until(lambda: sum(w["status"] == "Online" for w in sc.ok("GET", "/api/workers")["workers"]) == 2,
                   "two agents online", 300, 0.05)
        sc.ok("POST", "/api/services", {
            "name": "bench", "program": {"model": {"path": str(model)}}, "unit": {"size": 2, "guard": True},
            "target": {"device": "cuda"}, "routing": {"wait_s": 120},
            "restart": {"max_restarts": 100, "backoff_s": 0.0, "backoff_max_s": 0.0}}, 201)
        svc = wait_until(lambda: (s := sc.ok("GET", "/api/services/bench"))["state"] == "ready" and s,
                         "the unit ready", 600, 0.05)
        unit = svc["units"][0]
        results: dict[str, Any] = {"load_avg_1m": os.getloadavg()[0], "cores": os.cpu_count()}
        results.update(overhead(sc, unit, args.requests))
        results.update(throughput(sc, args.seconds))
        guard = guard_recovery(sc, args.kills)
        results["guard_recovery_s"] = [round(v, 3) for v in guard]
        results["guard_recovery_median_s"] = statistics.median(guard)
    finally:
        fleet.close()
    by_hand = torchrun_recovery(home, model, args.kills)
    results["torchrun_by_hand_s"] = [round(v, 3) for v in by_hand]
    results["torchrun_by_hand_median_s"] = statistics.median(by_hand)
    print("units bench (simulated cards: every instance computes on this machine's CPU)")
    print(f"  machine: {results['cores']} cores, load average {results['load_avg_1m']:.1f}")
    print(f"  rank 0 directly: p50 {results['direct_p50_ms']:.2f} ms, p99 {results['direct_p99_ms']:.2f} ms")
    print(f"  through router:  p50 {results['router_p50_ms']:.2f} ms, p99 {results['router_p99_ms']:.2f} ms")
    ok = "meets" if results["overhead_p50_ms"] <= GOAL_OVERHEAD_MS else "misses"
    print(f"  routing overhead: p50 {results['overhead_p50_ms']:.2f} ms ({ok} the {GOAL_OVERHEAD_MS:g} ms goal), "
          f"p99 {results['overhead_p99_ms']:.2f} ms")
    print(f"  throughput: {results['requests_per_s']:.0f} requests/s through the router at {CLIENTS} clients "
          f"({results['errors']} errors)")
    ok = "meets" if results["guard_recovery_median_s"] <= GOAL_RECOVERY_S else "misses"
    print(f"  guard recovery, kill -9 of rank 1 -> first answer: {results['guard_recovery_s']} s "
          f"(median {results['guard_recovery_median_s']:.2f} s, {ok} the {GOAL_RECOVERY_S:g} s goal)")
    print(f"  torchrun pair restarted by hand: {results['torchrun_by_hand_s']} s "
          f"(median {results['torchrun_by_hand_median_s']:.2f} s)")
    print(json.dumps(results))
    if not args.keep:
        shutil.rmtree(fleet.tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
