"""Run events: how a run process reports (docs/sidecar.md) and how its parents read it.

Events are JSON lines ``{"seq", "type", "payload", "ts"}`` with a per-run ``seq`` from 1; the last is
always ``run_finished``. :class:`EventSink` writes them (run side); :func:`parse_event_line` and
:func:`describe_exit` are the parents' side (the launcher serves the sidecar and the agent alike).
The event types are listed in docs/events.md.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from ...constants import PROGRESS_EVENT_MIN_INTERVAL_S


@dataclass(frozen=True)
class NewEvent:
    """An event the store appends to a run (server/sidecar/store.py): ``source_seq`` is the run child's ``seq`` (None for the server's own)."""

    type: str
    payload: Mapping[str, Any]
    ts: float | None = None
    source_seq: int | None = None


class EventSink:
    """Numbers events and writes them as JSON lines to the parent's pipe and to events.jsonl.

    Thread-safe (nodes may report from helper threads). A broken pipe (the parent died) is not an
    error for the run: the events still go to events.jsonl and the stop flag is raised by the stdin
    watcher. Progress events are thinned to ~20/s per node; the last one of a node always goes out.
    """

    def __init__(self, pipe: BinaryIO | None, log_path: Path | None, console: TextIO | None = None) -> None:
        self._pipe = pipe
        self._console = console  # the run's output.log: one readable line per milestone
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
        self._say(type_, payload)

    def _say(self, type_: str, payload: dict[str, Any]) -> None:
        line = console_line(type_, payload)
        if line is None or self._console is None:
            return
        try:
            self._console.write(f"[xpufleet] {line}\n")
            self._console.flush()
        except (OSError, ValueError):
            self._console = None

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


def console_line(type_: str, payload: dict[str, Any]) -> str | None:
    """The readable form of a milestone event for the run's log, or ``None`` for the others
    (progress and samples stay in events.jsonl: a log is for reading)."""
    node = f"node {payload.get('node')} ({payload.get('class_type')})"
    if type_ == "run_started":
        return f"run {payload.get('run_id')} started on {', '.join(map(str, payload.get('devices') or [])) or 'cpu'}"
    if type_ == "node_started":
        return f"{node} started"
    if type_ == "node_finished":
        return f"{node} finished"
    if type_ == "node_error":
        return f"{node} failed: {payload.get('message')}"
    if type_ == "metric":
        epoch = f" epoch {payload['epoch']}" if payload.get("epoch") is not None else ""
        return f"{payload.get('name')}{epoch} = {payload.get('value')}"
    if type_ == "run_finished":
        error = f": {payload.get('error')}" if payload.get("error") else ""
        return f"run {payload.get('status')}{error}"
    return None


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
        return json.dumps(finite(obj), separators=(",", ":"), default=_default)


def _default(value: Any) -> Any:
    if hasattr(value, "item"):
        try:
            return value.item()
        except Exception:
            pass
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def finite(value: Any) -> Any:
    """``value`` with every NaN and infinity (a diverged loss) replaced by None, so it is plain JSON."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
