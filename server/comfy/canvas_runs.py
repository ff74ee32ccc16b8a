"""A canvas Run recorded on the sidecar (docs/canvas-runs.md): ComfyUI's own Run executes the graph in
ComfyUI's process; what the plugin's nodes report there (progress, metrics, warnings, log lines,
artifacts; ``nodes/runtime.py`` hands them to :meth:`CanvasRecorder.report`) also goes to the sidecar of
this ``XPUFLEET_HOME``, as one run with source ``canvas`` per prompt (``POST /api/canvas/runs``).

Nodes never wait on it: a report is appended to a buffer, and one sender thread posts the buffers every
``CANVAS_FLUSH_S``. The prompt's end and its status are ComfyUI's own: the sender sees the prompt leave
ComfyUI's running queue and reads its history entry (success, error with the node's message, or
interrupted). With no sidecar nothing is sent (no request at all); a sidecar that stops answering ends
the recording of that prompt with one log line, and ComfyUI goes on.

``POST /xpufleet/canvas/name`` ``{"prompt_id", "name"}`` on ComfyUI's server: the page that queued a prompt
names its run after the workflow (ComfyUI's server does not know it; web/lib/canvas_nodes.mjs).
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

from ...common.errors import ApiError
from ...constants import (
    CANVAS_EVENTS_MAX,
    CANVAS_FLUSH_S,
    CANVAS_PROGRESS_MIN_S,
    MAX_RUN_NAME_CHARS,
    home_dir,
)

log = logging.getLogger("xpufleet")

_MAX_FAILURES = 3  # consecutive failed posts before a prompt's recording is given up
_EARLY_NAMES = 32  # names said before their prompt's first report, kept for the newest prompts only


@dataclass
class _Record:
    """One prompt's recording."""

    prompt_id: str
    number: Any = None  # ComfyUI's queue number
    graph: dict[str, Any] = field(default_factory=dict)  # the API prompt ComfyUI runs
    name: str | None = None  # the workflow's, said by the page that queued the prompt (name_prompt)
    name_sent: bool = True
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
        self._names: dict[str, str] = {}  # prompt id -> name, said before the prompt's first report
        self._thread: threading.Thread | None = None

    def name_prompt(self, prompt_id: str, name: str) -> None:
        """The workflow name of a prompt (the page says it at ``execution_start``); sent with the next post."""
        with self._lock:
            rec = self._records.get(prompt_id)
            if rec is not None:
                rec.name, rec.name_sent = name, rec.run_id is None
                self._wake.set()
                return
            self._names[prompt_id] = name
            while len(self._names) > _EARLY_NAMES:
                self._names.pop(next(iter(self._names)))

    def report(self, type_: str, payload: dict[str, Any]) -> None:
        """A node's event while ComfyUI executes a prompt (``payload`` carries its ``node``)."""
        prompt_id = getattr(self.server, "last_prompt_id", None)
        if not prompt_id:
            return
        now = time.time()
        with self._lock:
            rec = self._records.get(prompt_id)
            if rec is None:
                rec = self._records[prompt_id] = _Record(prompt_id, *self._queued(prompt_id),
                                                         name=self._names.pop(prompt_id, None))
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
        from ...common.client import Client
        from .proxy import find_sidecar

        found = find_sidecar(self.home())
        return None if found is None else Client(found.url, found.token, timeout=10.0, fingerprint=found.fingerprint)

    def _flush(self, rec: _Record) -> bool:
        """Send what ``rec`` holds; True when the prompt's recording is over."""
        from ...common.client import ApiError, SidecarUnreachable

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
            rename = rec.name if not rec.name_sent else None
            if not batch and not last and rename is None:
                return False
            body: dict[str, Any] = {"events": batch}
            if rename is not None:
                body["name"] = rename
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
            rec.name_sent = rec.name_sent or rec.name == rename
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
        name = rec.name
        default = f"ComfyUI prompt {rec.number}" if rec.number is not None else "ComfyUI prompt"
        body = {"prompt_id": rec.prompt_id, "graph": rec.graph, "comfy_pid": os.getpid(), "name": name or default}
        run_id = client.request("POST", "/api/canvas/runs", body)["id"]
        with self._lock:
            rec.name_sent = rec.name == name  # a name said while the run was being made goes with the next post
        return run_id

    def _interrupt(self, rec: _Record) -> None:
        """A cancel asked on the sidecar (Runs panel, CLI): stop ComfyUI's prompt as its Cancel button does."""
        rec.interrupted = True
        if getattr(self.server, "last_prompt_id", None) != rec.prompt_id:
            return
        mm = sys.modules.get("comfy.model_management")
        with contextlib.suppress(Exception):
            mm.interrupt_current_processing(True)
            log.info("xpufleet: ComfyUI prompt %s interrupted: its run was cancelled on the sidecar", rec.prompt_id)


def parse_name_body(body: dict[str, Any]) -> tuple[str, str]:
    """(prompt id, name) of a ``POST /xpufleet/canvas/name`` body; ApiError 400 naming the field."""
    prompt_id, name = body.get("prompt_id"), body.get("name")
    if not isinstance(prompt_id, str) or not 0 < len(prompt_id) <= 100:
        raise ApiError(400, "prompt_id: must be ComfyUI's prompt id (a string of 1-100 characters)")
    if not isinstance(name, str) or not 0 < len(name.strip()) <= MAX_RUN_NAME_CHARS:
        raise ApiError(400, f"name: must be a workflow name of 1-{MAX_RUN_NAME_CHARS} characters")
    return prompt_id, name.strip()


def add_canvas_routes(routes: Any, prefix: str, server: Any) -> CanvasRecorder:
    """The recorder of this ComfyUI (``server``: its PromptServer), made the hosted nodes' sink, and its route."""
    from aiohttp import web

    from ...common.http import read_object
    from ...nodes import runtime
    from .guard import Access, add_route

    recorder = CanvasRecorder(server)
    runtime.set_hosted_sink(recorder.report)

    async def name(request: web.Request) -> web.Response:
        prompt_id, text = parse_name_body(await read_object(request, {"prompt_id", "name"}, max_bytes=4096))
        recorder.name_prompt(prompt_id, text)
        return web.json_response({"prompt_id": prompt_id, "name": text})

    # unpaired: a run's name, said by the page that queued the prompt; whoever can reach ComfyUI's own
    # /prompt could queue (and so name) a prompt anyway (docs/security.md)
    add_route(routes, "POST", f"{prefix}/canvas/name", name,
              Access(paired=False, why="names a canvas run of a prompt queued through ComfyUI's own /prompt"))
    return recorder
