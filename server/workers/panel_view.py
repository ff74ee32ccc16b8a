"""More of the Workers panel's data (docs/architecture.md, "Workers panel"): this server's own machine as a
row like a worker's, each provider's recently finished runs, the rule by which each card admits runs, and a
pool's waiting runs and instance states.

The admission rule is the server's (server/memory/admission.py picks memory or slots per card,
server/ledger/fit.py is the memory rule): the panel shows what this module says, never its own guess.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ...constants import LOCAL_PROVIDER, TERMINAL_STATUSES

RECENT_RUNS = 5  # finished runs listed per worker (newest first), besides every running one
WAITING_SHOWN = 10  # queued runs listed per pool (the count says how many in all)
_TERMINAL = tuple(sorted(TERMINAL_STATUSES))


def admission_rule(*, mode: str, slots_used: int, slot_limit: int | None,
                   memory: Mapping[str, Any] | None) -> dict[str, Any]:
    """How one card takes runs, as the scheduler decides it (pure).

    ``by``: ``"slots"`` (an exclusive card, or a shared one that still admits by slot) or ``"memory"`` (a card
    shared by memory: a run starts when its budget + the CUDA context fits). ``runs``: how many runs are on the
    card now. ``text``: the rule in one English sentence (the panel builds its own translated one from the
    figures; the CLI and tests read this one).
    """
    if mode == "shared" and memory is not None and memory.get("admits_by_memory"):
        runs = len(memory.get("runs") or [])
        free = memory.get("free_for_budgets_gib")
        reserved = round(float(memory.get("reserved_gib") or 0) + float(memory.get("running_gib") or 0), 3)
        context = float(memory.get("context_gib") or 0)
        out: dict[str, Any] = {"by": "memory", "runs": runs, "reserved_gib": reserved,
                               "free_for_budgets_gib": free, "context_gib": context}
        if free is None:  # MPS (no total) or not reported yet: the ledger's own words say which
            out["text"] = str(memory.get("note") or "shared by memory; its memory is not known yet")
            return out
        ctx = f" + {context:.1f} GiB CUDA context" if context else ""
        out["text"] = (f"shared by memory: a run starts when its budget{ctx} fits; {free:.1f} GiB free for a new "
                       f"budget, {reserved:.1f} GiB reserved by {runs} run{'s' if runs != 1 else ''}")
        return out
    limit = slot_limit if slot_limit is not None else None
    out = {"by": "slots", "runs": slots_used, "used": slots_used, "limit": limit}
    if mode == "shared":  # shared here, exclusive on another provider of the same card: slots still decide
        out["text"] = str((memory or {}).get("note") or "shared here, but it admits runs by slot")
        return out
    out["text"] = (f"exclusive: {limit} run{'s' if limit != 1 else ''} at a time, {slots_used} now"
                   if limit is not None else f"exclusive: {slots_used} run(s) now")
    return out


def run_row(row: Mapping[str, Any], now: float | None = None) -> dict[str, Any]:
    """A run as a worker's row lists it: id, name, status, devices, start, end, duration (pure)."""
    now = time.time() if now is None else now
    devices = row["devices"]
    if isinstance(devices, str):
        devices = json.loads(devices)
    started, finished = row["started_at"], row["finished_at"]
    end = finished if finished is not None else now
    return {"id": row["id"], "name": row["name"], "status": row["status"], "devices": list(devices or []),
            "started_at": started, "finished_at": finished,
            "duration_s": None if started is None else round(max(0.0, end - started), 1),
            "finished_age_s": None if finished is None else round(max(0.0, now - finished), 1)}


def recent_runs(store: Any, provider: str, limit: int = RECENT_RUNS) -> list[dict[str, Any]]:
    """The provider's last ``limit`` finished runs, newest submitted first (this server: ``provider ==
    "local"``). Walked by ``seq`` (the runs_worker index, or the key) so it stops after ``limit`` rows however
    many runs the store holds."""
    where = "placement='local'" if provider == LOCAL_PROVIDER else "worker_id=?"
    params: list[Any] = [] if provider == LOCAL_PROVIDER else [provider]
    marks = ",".join("?" * len(_TERMINAL))
    rows = store.query(
        f"SELECT id, name, status, devices, started_at, finished_at FROM runs WHERE {where} "
        f"AND +status IN ({marks}) AND finished_at IS NOT NULL ORDER BY seq DESC LIMIT ?",  # + : not by status
        (*params, *_TERMINAL, int(limit)))
    now = time.time()
    return [run_row(r, now) for r in rows]


def instance_state(instance: Mapping[str, Any]) -> str:
    """A pool instance as the pool lists it: running (has taken its run), idle (connected, waiting for a run)
    or gone (disconnected: it exits after its run, or never came back) (pure)."""
    if instance.get("one_shot_taken"):
        return "running" if instance.get("connected") else "gone"
    return "idle" if instance.get("connected") else "gone"


def waiting_runs(store: Any, pool: str, limit: int = WAITING_SHOWN) -> list[dict[str, Any]]:
    """Runs queued for ``pool`` (oldest first) with the reason each waits."""
    rows = store.query("SELECT id, name, waiting_reason, created_at FROM runs WHERE status='queued' AND target=? "
                       "ORDER BY seq LIMIT ?", (f"pool:{pool}", int(limit)))
    now = time.time()
    return [{"id": r["id"], "name": r["name"], "waiting_reason": r["waiting_reason"],
             "waiting_s": round(max(0.0, now - r["created_at"]), 1)} for r in rows]


def this_server_environment(devices: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """This machine's environment line (what an agent reports in its hello), without importing torch."""
    import os

    env: dict[str, Any] = {"hostname": platform.node(), "os": f"{platform.system()} {platform.release()}",
                           "python": platform.python_version(), "cpu_count": os.cpu_count(),
                           "simulated": any(d.get("simulated") for d in devices)}
    try:
        from importlib.metadata import version

        env["torch"] = version("torch")
    except Exception:  # noqa: BLE001 - no torch here: the line says nothing about it
        env["torch"] = None
    return env
