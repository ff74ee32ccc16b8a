"""The run child: ``python -m xpufleet.server.runner RUN_DIR [--events-fd N]``.

One queued run = one process (SPEC Q2, W2), started by the sidecar (target ``local``) or by a worker
agent, so a crash or an out-of-memory kill ends that run only. The parent writes
``RUN_DIR/spec.json``::

    {"run_id", "graph", "options", "devices": [in-run names], "device_aliases": {in-run: machine},
     "placement": "local"|"worker", "simulated": bool, "env": {...}, "execution_facts": {...}}

and starts this module with the run's environment (``CUDA_VISIBLE_DEVICES`` for a worker run), stdin a
pipe, stdout and stderr going to ``RUN_DIR/output.log``, and the write end of a pipe as ``--events-fd``.

Events are JSON lines ``{"seq", "type", "payload", "ts"}`` (``seq`` from 1, per run) written to the
events fd and appended to ``RUN_DIR/events.jsonl`` (so a parent that died can recover what the run
reported). The last event is always ``run_finished`` ``{"status", "error", "final_metrics",
"peak_memory", "execution_facts"}`` (plus ``validation`` for a graph that failed validation).

stdin commands: ``stop`` = cancel (cooperative: TrainingLoop writes its interrupt checkpoint; the run
ends ``cancelled``); ``interrupt`` = the parent is shutting down (same stop; the run ends
``interrupted``). End of file on stdin means the parent is gone: the run stops and ends ``interrupted``.
The exit code is 0 when the run succeeded, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO

from ..constants import BYTES_PER_GB, PROGRESS_EVENT_MIN_INTERVAL_S, VERSION

GIB = BYTES_PER_GB  # one definition of a GiB: constants.py


class EventSink:
    """Numbers events and writes them as JSON lines to the parent's pipe and to events.jsonl.

    Thread-safe (nodes may report from helper threads). A broken pipe (the parent died) is not an
    error for the run: the events still go to events.jsonl and the stop flag is raised by the stdin
    watcher. Progress events are thinned to ~20/s per node; the last one of a node always goes out.
    """

    def __init__(self, pipe: BinaryIO | None, log_path: Path | None) -> None:
        self._pipe = pipe
        self._log = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self.seq = 0
        self.final_metrics: dict[str, Any] = {}
        self.node_errors: set[str] = set()
        self._last_progress: dict[Any, float] = {}
        self._held_progress: dict[Any, dict[str, Any]] = {}

    def emit(self, type_: str, payload: dict[str, Any]) -> None:
        now = time.time()
        if type_ == "progress":
            node = payload.get("node")
            value, total = payload.get("value"), payload.get("max")
            last = self._last_progress.get(node, 0.0)
            if value != total and value not in (0, None) and now - last < PROGRESS_EVENT_MIN_INTERVAL_S:
                self._held_progress[node] = payload  # superseded by the next one, flushed otherwise
                return
            self._last_progress[node] = now
            self._held_progress.pop(node, None)
        elif self._held_progress and type_ in ("node_finished", "node_error", "run_finished"):
            for held in list(self._held_progress.values()):
                self._write("progress", held, now)
            self._held_progress.clear()
        if type_ == "metric" and "name" in payload:
            self.final_metrics[str(payload["name"])] = payload.get("value")
        elif type_ == "node_error" and payload.get("node") is not None:
            self.node_errors.add(str(payload["node"]))
        self._write(type_, payload, now)

    def _write(self, type_: str, payload: dict[str, Any], ts: float) -> None:
        with self._lock:
            self.seq += 1
            line = (_json_line({"seq": self.seq, "type": type_, "payload": payload, "ts": ts}) + "\n").encode()
            if self._log is not None:
                self._log.write(line)
                self._log.flush()
            if self._pipe is not None:
                try:
                    self._pipe.write(line)
                    self._pipe.flush()
                except (BrokenPipeError, OSError):
                    self._pipe = None  # the parent went away; events.jsonl keeps the record

    def close(self) -> None:
        with self._lock:
            for f in (self._pipe, self._log):
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass
            self._pipe = self._log = None


def describe_exit(rc: int) -> str:
    """How a run process ended without reporting a result, from its exit code: ``killed by SIGKILL
    (out of memory?)`` or ``exited with code 3``. Shared by the sidecar and the agent."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        hint = " (out of memory?)" if -rc == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with code {rc} without reporting a result"


def parse_event_line(line: bytes | str) -> dict[str, Any] | None:
    """One event line from a run child, or ``None`` for a blank or malformed line (the parents,
    sidecar and agent, log and skip those rather than fail the run)."""
    if not line.strip():
        return None
    try:
        ev = json.loads(line)
    except ValueError:
        return None
    if not isinstance(ev, dict) or not isinstance(ev.get("seq"), int) or "type" not in ev:
        return None
    return ev


def _json_line(obj: Any) -> str:
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_default)
    except ValueError:  # NaN/inf in a metric: JSON has no such numbers
        return json.dumps(_finite(obj), separators=(",", ":"), default=_default)


def _default(value: Any) -> Any:
    if hasattr(value, "item"):
        try:
            return value.item()
        except Exception:
            pass
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class StopWatcher(threading.Thread):
    """Reads stdin: ``stop`` -> cancel, ``interrupt`` -> interrupted, EOF -> parent gone (interrupted)."""

    def __init__(self, stop_event: threading.Event, stream: Any = None) -> None:
        super().__init__(name="xpufleet-stop-watcher", daemon=True)
        self.stop_event = stop_event
        self.stream = stream if stream is not None else sys.stdin
        self.reason: str | None = None

    def run(self) -> None:
        try:
            for line in self.stream:
                cmd = line.strip().lower()
                if cmd == "stop":
                    self._stop("cancel")
                elif cmd == "interrupt":
                    self._stop("interrupt")
        except (OSError, ValueError):
            pass
        self._stop("parent_gone")

    def _stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.stop_event.set()


STOP_ERRORS = {
    "cancel": None,
    "interrupt": "the server was stopped while this run was executing",
    "parent_gone": "the process that started this run went away (server or agent stopped)",
}


def peak_memory() -> dict[str, Any]:
    """CUDA allocator high-water mark per card of this process; ``measured: false`` without CUDA."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {"measured": False, "reason": "the run did not use torch"}
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {"measured": False, "reason": "the run used no CUDA device (no peak counter on cpu/mps/xpu)"}
        cards = {}
        for i in range(torch.cuda.device_count()):
            peak = torch.cuda.max_memory_allocated(i)
            if peak:
                cards[f"cuda:{i}"] = round(peak / GIB, 4)
        return {"measured": True, "unit": "GiB", "kind": "cuda_max_memory_allocated", "devices": cards}
    except Exception as exc:  # noqa: BLE001 - a broken CUDA state must not hide the run's result
        return {"measured": False, "reason": f"could not read the CUDA peak: {exc}"}


def memory_fractions(budget_gib: float, totals_bytes: list[int]) -> list[float]:
    """The allocator cap per card for a budget of ``budget_gib`` per card (SPEC W2, M): the fraction
    of each card's total that the budget is, at most 1."""
    if budget_gib <= 0:
        raise ValueError(f"budget_gib must be > 0, got {budget_gib}")
    return [min(1.0, budget_gib * GIB / total) if total > 0 else 1.0 for total in totals_bytes]


def apply_memory_budget(spec: dict[str, Any], facts: dict[str, Any]) -> None:
    """Cap the CUDA allocator to the run's budget before any node runs, so a run over its budget
    runs out of memory alone (``torch.cuda.set_per_process_memory_fraction``). Simulated cards have
    no allocator to cap: the fact says so instead of pretending."""
    budget = spec.get("budget_gib")
    if budget is None:
        return
    devices = [d for d in (spec.get("devices") or []) if d.startswith("cuda")]
    if not devices:
        return
    if spec.get("simulated"):
        facts["memory_cap"] = {"applied": False, "budget_gib": budget,
                               "reason": "simulated cards: the run executes on the CPU"}
        return
    import torch

    if not torch.cuda.is_available():
        facts["memory_cap"] = {"applied": False, "budget_gib": budget, "reason": "CUDA is not available"}
        return
    indices = list(range(min(len(devices), torch.cuda.device_count())))
    totals = [torch.cuda.get_device_properties(i).total_memory for i in indices]
    fractions = memory_fractions(float(budget), totals)
    for i, fraction in zip(indices, fractions, strict=True):
        torch.cuda.set_per_process_memory_fraction(fraction, i)
    facts["memory_cap"] = {"applied": True, "budget_gib": budget,
                           "fractions": {f"cuda:{i}": round(f, 6) for i, f in zip(indices, fractions, strict=True)}}


def base_facts(spec: dict[str, Any]) -> dict[str, Any]:
    """Facts recorded for every run (SPEC Q4: visible_devices, device_aliases)."""
    facts: dict[str, Any] = dict(spec.get("execution_facts") or {})
    devices = list(spec.get("devices") or ["cpu"])
    facts.setdefault("visible_devices", devices)
    facts.setdefault("device_aliases", dict(spec.get("device_aliases") or {d: d for d in devices}))
    facts.setdefault("placement", spec.get("placement", "local"))
    if spec.get("simulated"):
        facts.setdefault("simulated_devices", True)
    facts.update({
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "xpufleet": VERSION,
    })
    for var in ("CUDA_VISIBLE_DEVICES", "ZE_AFFINITY_MASK"):
        if var in os.environ:
            facts.setdefault("env", {})[var] = os.environ[var]
    return facts


def run(run_dir: Path, events_fd: int | None = None, stdin: Any = None) -> int:
    """Execute the run described by ``run_dir/spec.json``; return the exit code."""
    run_dir = Path(run_dir)
    pipe = os.fdopen(events_fd, "wb", buffering=0) if events_fd is not None else None
    sink = EventSink(pipe, run_dir / "events.jsonl")
    status, error, extra = "failed", None, {}
    facts: dict[str, Any] = {}
    try:
        spec = json.loads((run_dir / "spec.json").read_text(encoding="utf-8"))
        for key, value in (spec.get("env") or {}).items():
            os.environ.setdefault(str(key), str(value))
        facts = base_facts(spec)
        apply_memory_budget(spec, facts)
        status, error, extra = _execute(spec, run_dir, sink, facts, stdin)
    except Exception as exc:  # noqa: BLE001 - spec unreadable: still end with run_finished
        traceback.print_exc()
        status, error = "failed", f"the run could not start: {type(exc).__name__}: {exc}"
    finally:
        payload = {"status": status, "error": error, "final_metrics": dict(sink.final_metrics),
                   "peak_memory": peak_memory(), "execution_facts": facts, **extra}
        sink.emit("run_finished", payload)
        sink.close()
    return 0 if status == "succeeded" else 1


def _execute(spec: dict[str, Any], run_dir: Path, sink: EventSink, facts: dict[str, Any],
             stdin: Any) -> tuple[str, str | None, dict[str, Any]]:
    from ..nodes import runtime
    from .executor import GraphValidationError, NodeExecutionError, execute_graph, format_errors

    options = dict(spec.get("options") or {})
    devices = list(spec.get("devices") or ["cpu"])
    aliases = dict(spec.get("device_aliases") or {d: d for d in devices})
    placement = spec.get("placement", "local")
    accel = [d for d in devices if d.split(":")[0] in ("cuda", "xpu")]
    stop_event = threading.Event()
    watcher = StopWatcher(stop_event, stdin)
    watcher.start()
    seed = options.get("seed")
    if seed is not None:
        import random

        random.seed(int(seed))
    ctx = runtime.RunContext(
        emit=sink.emit,
        stop_event=stop_event,
        run_dir=run_dir,
        run_id=spec.get("run_id"),
        seed=None if seed is None else int(seed),
        deterministic=bool(options.get("deterministic", False)),
        devices=devices,
        device_aliases=aliases,
        placement=placement,
        ddp_allowed=placement == "worker" and len(accel) >= 2,
        execution_facts=facts,
    )
    sink.emit("run_started", {"run_id": spec.get("run_id"), "pid": os.getpid(), "devices": devices,
                              "device_aliases": aliases, "placement": placement})
    try:
        with runtime.use(ctx):
            execute_graph(spec["graph"], ctx)
    except GraphValidationError as exc:
        return "failed", "the graph failed validation: " + format_errors(exc.response), {"validation": exc.response}
    except NodeExecutionError as exc:
        if exc.node_id not in sink.node_errors:
            sink.emit("node_error", {"node": exc.node_id, "class_type": exc.class_type, "message": str(exc),
                                     "traceback": exc.traceback})
        if isinstance(exc.original, runtime.RunStopped):
            return _stopped(watcher)
        return "failed", str(exc), {}
    except runtime.RunStopped:
        return _stopped(watcher)
    except Exception as exc:  # noqa: BLE001 - anything else is still reported, never a silent death
        traceback.print_exc()
        return "failed", f"{type(exc).__name__}: {exc}", {}
    # A stop that came after the last stop check changes nothing: the graph finished, it succeeded.
    return "succeeded", None, {}


def _stopped(watcher: StopWatcher) -> tuple[str, str | None, dict[str, Any]]:
    reason = watcher.reason or "cancel"
    if reason == "cancel":
        return "cancelled", "cancelled by request", {}
    return "interrupted", STOP_ERRORS[reason], {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xpufleet.server.runner",
                                     description="Execute one queued run (started by the sidecar or an agent).")
    parser.add_argument("run_dir", type=Path, help="the run directory holding spec.json")
    parser.add_argument("--events-fd", type=int, default=None, help="file descriptor to write events to")
    args = parser.parse_args(argv)
    if not (args.run_dir / "spec.json").is_file():
        parser.error(f"{args.run_dir / 'spec.json'} does not exist")
    return run(args.run_dir, args.events_fd)


if __name__ == "__main__":
    sys.exit(main())
