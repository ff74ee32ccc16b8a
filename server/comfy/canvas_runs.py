"""A canvas Run recorded on the sidecar (docs/canvas.md): ComfyUI's own Run executes the graph in
ComfyUI's process; what the plugin's nodes report there (progress, metrics, warnings, log lines,
artifacts; ``nodes/runtime.py`` hands them to :meth:`CanvasRecorder.report`) also goes to the sidecar of
this ``XPUFLEET_HOME``, as one run with source ``canvas`` per prompt (``POST /api/canvas/runs``).

Nodes never wait on it: a report is appended to a buffer, and one sender thread posts the buffers every
``CANVAS_FLUSH_S``. The prompt's end and its status are ComfyUI's own: the sender sees the prompt leave
ComfyUI's running queue and reads its history entry (success, error with the node's message, or
interrupted). With no sidecar nothing is sent (no request at all); a sidecar that stops answering ends
the recording of that prompt with one log line, and ComfyUI goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...constants import CANVAS_EVENTS_MAX, CANVAS_FLUSH_S, CANVAS_PROGRESS_MIN_S, home_dir

log = logging.getLogger("xpufleet")

_MAX_FAILURES = 3  # consecutive failed posts before a prompt's recording is given up


@dataclass
class _Record:
    """One prompt's recording."""

    prompt_id: str
    number: Any = None  # ComfyUI's queue number
    graph: dict[str, Any] = field(default_factory=dict)  # the API prompt ComfyUI runs
    run_id: str | None = None
    off: bool = False  # nothing (more) is sent for this prompt
    seq: int = 0
    pending: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, float | None] = field(default_factory=dict)
    progress_sent: dict[str, float] = field(default_factory=dict)
    failures: int = 0
    interrupted: bool = False


def prompt_end(server: Any, prompt_id: str) -> tuple[str, str | None] | None:
    """(status, error) of a prompt ComfyUI has finished, from its history; None while it runs."""
    queue = server.prompt_queue
    running, _ = queue.get_current_queue_volatile()
    if any(len(item) > 1 and item[1] == prompt_id for item in running):
        return None
    found = queue.get_history(prompt_id=prompt_id, map_function=lambda h: h.get("status"))
    status = found.get(prompt_id)
    if not status:
        return "interrupted", "ComfyUI kept no history of this prompt (its history was cleared)"
    messages = {m[0]: m[1] for m in status.get("messages") or [] if isinstance(m, list | tuple) and len(m) == 2}
    if status.get("status_str") == "success":
        return "succeeded", None
    if "execution_interrupted" in messages:
        return "cancelled", "cancelled in ComfyUI"
    err = messages.get("execution_error") or {}
    where = f"{err.get('node_type', 'a node')} (node {err.get('node_id', '?')})"
    return "failed", f"{where}: {err.get('exception_message') or 'failed'}".strip()


class CanvasRecorder:
    """One per ComfyUI process: ``report`` from nodes (any thread), one sender thread while prompts are open."""

    def __init__(self, server: Any, home: Callable[[], Path] = home_dir, flush_s: float = CANVAS_FLUSH_S) -> None:
        self.server = server  # ComfyUI's PromptServer instance
        self.home = home
        self.flush_s = flush_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._records: dict[str, _Record] = {}
        self._thread: threading.Thread | None = None

    def report(self, type_: str, payload: dict[str, Any]) -> None:
        """A node's event while ComfyUI executes a prompt (``payload`` carries its ``node``)."""
        prompt_id = getattr(self.server, "last_prompt_id", None)
        if not prompt_id:
            return
        now = time.time()
        with self._lock:
            rec = self._records.get(prompt_id)
            if rec is None:
                rec = self._records[prompt_id] = _Record(prompt_id, *self._queued(prompt_id))
            if rec.off:
                return
            if type_ == "progress":  # the bar moves per batch: at most every CANVAS_PROGRESS_MIN_S, and the last
                node = str(payload.get("node"))
                last = payload.get("value") == payload.get("max")
                if not last and now - rec.progress_sent.get(node, 0.0) < CANVAS_PROGRESS_MIN_S:
                    return
                rec.progress_sent[node] = now
            elif type_ == "metric":
                rec.final[str(payload["name"])] = payload.get("value")
            rec.seq += 1
            rec.pending.append({"type": type_, "payload": payload, "ts": now, "seq": rec.seq})
            if self._thread is None:
                self._thread = threading.Thread(target=self._send_loop, name="xpufleet-canvas-runs", daemon=True)
                self._thread.start()

    # -- the sender thread --

    def _send_loop(self) -> None:
        while True:
            self._wake.wait(self.flush_s)
            self._wake.clear()
            with self._lock:
                records = list(self._records.values())
                if not records:
                    self._thread = None
                    return
            for rec in records:
                try:
                    done = self._flush(rec)
                except Exception as exc:  # a recording is a view: never let it reach ComfyUI's prompt
                    log.warning("xpufleet: recording ComfyUI prompt %s on the sidecar stopped: %s", rec.prompt_id, exc)
                    done = True
                if done:
                    with self._lock:
                        self._records.pop(rec.prompt_id, None)

    def _client(self) -> Any:
        from ..cli.client import Client
        from .proxy import find_sidecar

        found = find_sidecar(self.home())
        return None if found is None else Client(found.url, found.token, timeout=10.0, fingerprint=found.fingerprint)

    def _flush(self, rec: _Record) -> bool:
        """Send what ``rec`` holds; True when the prompt's recording is over."""
        from ..cli.client import ApiError, SidecarUnreachable

        end = prompt_end(self.server, rec.prompt_id)
        client = None if rec.off else self._client()
        if client is None:
            rec.off = True  # no sidecar: nothing is recorded (and no request made)
            return end is not None
        try:
            if rec.run_id is None:
                rec.run_id = self._create(client, rec)
            with self._lock:
                batch = rec.pending[:CANVAS_EVENTS_MAX]
            last = end is not None and len(batch) == len(rec.pending)
            if not batch and not last:
                return False
            body: dict[str, Any] = {"events": batch}
            if last:
                status, error = end
                body["finished"] = {"status": status, "error": error, "final_metrics": dict(rec.final)}
            answer = client.request("POST", f"/api/canvas/runs/{urllib.parse.quote(rec.run_id)}/events", body)
        except (ApiError, SidecarUnreachable) as exc:
            rec.failures += 1
            gone = isinstance(exc, ApiError) and exc.status in (400, 404, 409, 413)
            if gone or rec.failures >= _MAX_FAILURES:
                log.info("xpufleet: ComfyUI prompt %s is no longer recorded on the sidecar: %s", rec.prompt_id, exc)
                with self._lock:
                    rec.off, rec.pending = True, []
                return end is not None
            return False
        rec.failures = 0
        with self._lock:
            del rec.pending[:len(batch)]
        if answer.get("cancel_requested") and end is None and not rec.interrupted:
            self._interrupt(rec)
        if len(rec.pending) >= CANVAS_EVENTS_MAX:
            self._wake.set()  # more than one request's worth waits: send the rest now
        return last

    def _queued(self, prompt_id: str) -> tuple[Any, dict[str, Any]]:
        """(number, prompt) of the prompt ComfyUI is running: read when its first report comes, since a short
        prompt may have left the queue before the sender's first pass."""
        running, _ = self.server.prompt_queue.get_current_queue_volatile()
        for item in running:
            if len(item) > 2 and item[1] == prompt_id:
                return item[0], item[2]
        return None, {}

    def _create(self, client: Any, rec: _Record) -> str:
        body = {"prompt_id": rec.prompt_id, "graph": rec.graph, "comfy_pid": os.getpid(),
                "name": f"ComfyUI prompt {rec.number}" if rec.number is not None else "ComfyUI prompt"}
        return client.request("POST", "/api/canvas/runs", body)["id"]

    def _interrupt(self, rec: _Record) -> None:
        """A cancel asked on the sidecar (Runs panel, CLI): stop ComfyUI's prompt as its Cancel button does."""
        rec.interrupted = True
        if getattr(self.server, "last_prompt_id", None) != rec.prompt_id:
            return
        mm = sys.modules.get("comfy.model_management")
        with contextlib.suppress(Exception):
            mm.interrupt_current_processing(True)
            log.info("xpufleet: ComfyUI prompt %s interrupted: its run was cancelled on the sidecar", rec.prompt_id)
