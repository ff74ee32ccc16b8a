"""The processes a GPU check starts (docs/gpu-check.md): a real sidecar (``xpufleet start``) and real worker
agents (``xpufleet agent start --foreground``) on 127.0.0.1 in a temporary XPUFLEET_HOME, through the test
suite's own harness (tests/server/sidecar_harness.py), and the HTTP API through the CLI's client.

On a GPU the agent offers the machine's real cards; with ``--device cpu`` (a dry run) it offers simulated
cards instead (``--simulate cuda:0=24``): the same routes, run processes and records, on the CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchlib import tests_module  # bench/ (the scripts' folder) is on sys.path

ROOT = Path(__file__).resolve().parents[1]
WORKER = "gpu-check"
ENV = {"XPUFLEET_HEARTBEAT_INTERVAL_S": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def harness() -> Any:
    """tests/server/sidecar_harness.py (test folders are not packages: benchlib loads it by path)."""
    return tests_module("server/sidecar_harness.py")


def simulate_spec(cards: int) -> str:
    return ",".join(f"cuda:{i}=24" for i in range(cards))


class GpuFleet:
    """A sidecar and its agents; :meth:`stop` ends every process this fleet started (agents first)."""

    def __init__(self, home: Path, device: str) -> None:
        self.home = Path(home)
        self.device = device
        # On a GPU machine the sidecar itself offers the same card (same UUID, one slot) as the agent beside it:
        # a card is admitted by memory only when every provider shares it (docs/memory.md), so the checks that
        # share cuda:0 on the agent share it on this server too.
        env = {**ENV, "XPUFLEET_LOCAL_SHARED_CARDS": "cuda:0"} if device == "cuda" else ENV
        self.sidecar = harness().Sidecar(self.home, env=env)
        self.agents: dict[str, Any] = {}

    def __enter__(self) -> GpuFleet:
        try:
            self.sidecar.start()
        except BaseException:  # a timeout while it starts: stop what did start (__exit__ will not run)
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def client(self) -> Any:
        return self.sidecar.client

    def agent(self, name: str = WORKER, cards: int = 1, *, simulate: bool | None = None, warm: bool = True) -> Any:
        """``xpufleet agent start --foreground --name NAME`` offering ``cards`` CUDA cards: the real ones on a
        GPU, simulated ones in a dry run (or when ``simulate``); ``warm=False``: ``XPUFLEET_WARM_START=0``."""
        h = harness()
        sim = (self.device != "cuda") if simulate is None else simulate
        args = ["--simulate", simulate_spec(cards)] if sim else ["--devices", ",".join(f"cuda:{i}" for i in range(cards))]
        proc = h.AgentProcess(self.sidecar, name, None, *args, env={"XPUFLEET_WARM_START": "1" if warm else "0"})
        self.agents[name] = proc
        h.wait_until(lambda: self._online(name, proc), f"worker {name} online", timeout=90, every=0.2)
        return proc

    def _online(self, name: str, proc: Any) -> bool:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"agent {name} exited {proc.proc.returncode}:\n{proc.text()[-2000:]}")
        try:
            return self.client.request("GET", f"/api/workers/{name}")["status"] == "Online"
        except Exception:  # noqa: BLE001 - not registered yet
            return False

    def stop_agent(self, name: str) -> None:
        proc = self.agents.pop(name, None)
        if proc is not None:
            proc.stop()

    def share(self, card: str = "cuda:0", worker: str = WORKER) -> None:
        """``xpufleet workers mode WORKER CARD shared``: the card admits runs by memory budget."""
        proc = self.sidecar.cli("workers", "mode", worker, card, "shared", timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"workers mode {worker} {card} shared: {proc.stderr or proc.stdout}")

    def submit(self, graph: dict[str, Any], devices: list[str] | None = None, worker: str = WORKER,
               seed: int = 1, **target: Any) -> str:
        """``POST /api/runs`` for ``worker``'s ``devices`` (default ``cuda:0``), deterministic, with ``seed``."""
        options = {"seed": seed, "deterministic": True,
                   "target": {"worker": worker, "devices": devices or ["cuda:0"], **target}}
        return self.client.submit(graph, options)["run_id"]

    def finish(self, run_id: str, timeout: float = 120.0) -> dict[str, Any]:
        return self.sidecar.finish(run_id, timeout=timeout)

    def run(self, run_id: str) -> dict[str, Any]:
        return self.client.run(run_id)

    def events(self, run_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        cursor = 0
        while True:
            page = self.client.events(run_id, cursor=cursor, limit=1000)
            out += page["events"]
            if not page["events"]:
                return out
            cursor = page["cursor"]

    def wait_event(self, run_id: str, event_type: str, timeout: float = 60.0) -> dict[str, Any]:
        return self.sidecar.wait_for(run_id, event_type, timeout)

    def wait(self, check: Any, what: str, timeout: float = 60.0, every: float = 0.2) -> Any:
        return harness().wait_until(check, what, timeout=timeout, every=every)

    def pids(self) -> dict[str, int]:
        """The sidecar's and each agent's pid, by role (``sidecar``, ``agent:NAME``)."""
        out = {"sidecar": self.sidecar.pid}
        out.update({f"agent:{n}": a.proc.pid for n, a in self.agents.items()})
        return out

    def stop(self) -> None:
        for name in list(self.agents):
            self.stop_agent(name)
        self.sidecar.stop()


def first_ts(events: list[dict[str, Any]], event_type: str, name: str | None = None) -> float | None:
    """The time of the first event of ``event_type`` (a ``metric`` called ``name``), None when there is none."""
    for ev in events:
        if ev["type"] == event_type and (name is None or (ev.get("payload") or {}).get("name") == name):
            return float(ev["ts"])
    return None
