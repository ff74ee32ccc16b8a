"""A ComfyUI run's process side (docs/workers.md, "Any workflow on a fleet card"): the runner hands a run of
kind ``comfyui`` here instead of the executor. Its host (agent or sidecar) already holds a warm headless
ComfyUI for the run's cards (comfy_instances.py) and wrote its address in ``spec.comfyui``.

The run: follow ``{url}/ws?clientId=<run id>``, ``POST {url}/prompt`` ``{"prompt": graph, "client_id":
run id}``, and turn ComfyUI's messages into the run's events: ``node_started`` (``executing``),
``progress`` ("KSampler (node 3): step 5 of 20"), ``comfy_output`` (``executed``: each file it names is
copied through ``{url}/view`` into the recorded outputs), ``node_error`` (``execution_error``). A stop on
stdin posts ``/interrupt`` (and takes a prompt not started yet off the queue). A closed websocket or an
instance that stops answering fails the run naming the card and the instance's log.

Recorded outputs (the layout the sidecar serves; always uploaded for this kind)::

    recorded_outputs/index.json        {"run_id", "mode": "upload", "kind": "comfyui", "complete",
                                        "nodes": [{"node", "class_type", "outputs", "files", "bytes"}]}
    recorded_outputs/<node>/outputs.json  {"node", "class_type", "outputs": [{"kind", "name", "index",
                                        "file", "bytes", "media_type"}], "ui": <executed's output>}
    recorded_outputs/<node>/<file>

No torch import in this process: it only speaks HTTP to the instance.
"""

from __future__ import annotations

import asyncio
import json
import mimetypes
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from ...common import atomic
from ...constants import COMFYUI_HTTP_TIMEOUT_S, RUN_KIND_COMFYUI
from .outputs import INDEX_NAME, NODE_MANIFEST, outputs_dir, safe_name

STOP_WAIT_S = 25.0  # after /interrupt, how long the run waits for ComfyUI to say it stopped
RECEIVE_POLL_S = 0.25  # the websocket read is cut this often to see a stop request
OOM_TEXTS = ("out of memory", "outofmemory", "allocation on device")
KINDS = {"image": (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff"),
         "video": (".mp4", ".webm", ".mov", ".mkv", ".avi"),
         "audio": (".wav", ".mp3", ".flac", ".ogg", ".opus", ".m4a")}

Emit = Callable[[str, dict[str, Any]], None]
Outcome = tuple[str, "str | None", dict[str, Any]]  # run_finished's status, error and extra fields


def file_kind(name: str) -> str:
    """``image``, ``video``, ``audio`` or ``file`` from a file name's extension."""
    lower = name.lower()
    for kind, exts in KINDS.items():
        if lower.endswith(exts):
            return kind
    return "file"


def output_files(output: Any) -> list[tuple[str, int, dict[str, Any]]]:
    """The files an ``executed`` message's ``output`` names: ``(ui key, index, {filename, subfolder, type})``
    for each dict with a ``filename`` in any of its lists."""
    found: list[tuple[str, int, dict[str, Any]]] = []
    if not isinstance(output, dict):
        return found
    for key, items in output.items():
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            if isinstance(item, dict) and isinstance(item.get("filename"), str) and item["filename"]:
                found.append((str(key), i, item))
    return found


class ComfyOutputs:
    """The recorded outputs of a ComfyUI run (see the module docstring)."""

    def __init__(self, run_dir: Path, run_id: str) -> None:
        self.root = outputs_dir(run_dir)
        self.run_id = run_id
        self.nodes: list[dict[str, Any]] = []
        self.root.mkdir(parents=True, exist_ok=True)

    def begin(self) -> None:
        """The record exists, empty (written once the prompt is queued: its fsync is off the queue's path)."""
        self._write_index(False)

    def _write_index(self, complete: bool) -> None:
        atomic.write_json(self.root / INDEX_NAME, {"run_id": self.run_id, "mode": "upload", "kind": RUN_KIND_COMFYUI,
                                                    "complete": complete, "nodes": self.nodes}, indent=1)

    def folder(self, node: str) -> Path:
        path = self.root / safe_name(node)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def stored_name(self, node: str, filename: str) -> str:
        """A safe name for ``filename``, unique within the node's folder."""
        base = safe_name(Path(filename).name)
        taken = {f for n in self.nodes if n["node"] == node for f in n["files"]}
        stem, dot, ext = base.rpartition(".")
        if not dot:
            stem, ext = base, ""
        name, k = base, 1
        while name in taken or name == NODE_MANIFEST or (self.root / safe_name(node) / name).exists():
            k += 1
            name = f"{stem}_{k}.{ext}" if ext else f"{stem}_{k}"
        return name

    def add(self, node: str, class_type: str, outputs: list[dict[str, Any]], ui: Any) -> dict[str, Any]:
        """One node's files are written: its manifest and the index (a node seen again is extended)."""
        previous = next((n for n in self.nodes if n["node"] == node), None)
        described = list((previous or {}).get("outputs") or []) + outputs
        manifest = {"node": node, "class_type": class_type, "outputs": described, "ui": ui}
        atomic.write_json(self.folder(node) / NODE_MANIFEST, manifest, indent=1)
        files = [o["file"] for o in described]
        entry = {"node": node, "class_type": class_type, "outputs": described,
                 "files": [NODE_MANIFEST, *files], "bytes": sum(int(o["bytes"]) for o in described)}
        self.nodes = [n for n in self.nodes if n["node"] != node] + [entry]
        self._write_index(False)
        return entry

    def finish(self) -> dict[str, Any]:
        """The record is complete; what ``outputs_recorded`` says."""
        self._write_index(True)
        return {"nodes": len(self.nodes), "bytes": sum(n["bytes"] for n in self.nodes), "mode": "upload",
                "kind": RUN_KIND_COMFYUI}


class ComfyRun:
    """One ComfyUI run against its instance (see the module docstring)."""

    def __init__(self, spec: dict[str, Any], run_dir: Path, emit: Emit, stop_event: threading.Event,
                 stopped: Callable[[], Outcome]) -> None:
        self.spec = spec
        self.run_id = str(spec["run_id"])
        self.comfy = dict(spec.get("comfyui") or {})
        self.url = str(self.comfy.get("url") or "").rstrip("/")
        self.graph = spec["graph"]
        self.emit = emit
        self.stop_event = stop_event
        self.stopped = stopped  # the runner's words for a stopped run (cancelled, or interrupted and why)
        self.outputs = ComfyOutputs(run_dir, self.run_id)
        self.prompt_id: str | None = None
        self.current: str | None = None  # the node running now
        self.started_prompt = False
        self.submitted_at = 0.0
        self.first_node_s: float | None = None
        self.interrupt_sent = False
        self.session: Any = None  # the aiohttp session of run()

    # --- words ----------------------------------------------------------------------------------
    @property
    def where(self) -> str:
        """``<worker> <cards>`` (``this server cuda:0`` for the sidecar's own)."""
        host = self.spec.get("worker") or "this server"
        cards = ",".join(self.comfy.get("devices") or []) or self.comfy.get("instance") or "cpu"
        return f"{host} {cards}"

    def class_of(self, node: Any) -> str:
        entry = self.graph.get(str(node)) if isinstance(self.graph, dict) else None
        return str(entry.get("class_type")) if isinstance(entry, dict) else "?"

    def node_words(self, node: Any) -> str:
        return f"node {node} ({self.class_of(node)})"

    def died_text(self) -> str:
        at = f" while running {self.node_words(self.current)}" if self.current is not None else ""
        return f"the ComfyUI on {self.where} died{at}; see its log {self.comfy.get('log') or 'comfyui.log'}"

    def facts(self) -> dict[str, Any]:
        """``execution_facts`` of a ComfyUI run."""
        return {"run_kind": RUN_KIND_COMFYUI,
                "comfyui": {"version": self.comfy.get("version"), "instance": self.comfy.get("instance"),
                            "cold_start": bool(self.comfy.get("started")), "prompt_id": self.prompt_id,
                            "queue_to_first_node_s": self.first_node_s}}

    # --- the run ----------------------------------------------------------------------------------
    async def run(self) -> tuple[str, str | None, dict[str, Any]]:
        """Execute the prompt; ``(status, error, extra)`` for ``run_finished``."""
        import aiohttp

        if not self.url:
            return "failed", "the run has no ComfyUI instance (spec.comfyui is missing)", {}
        timeout = aiohttp.ClientTimeout(total=None, connect=COMFYUI_HTTP_TIMEOUT_S, sock_read=None)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                self.session = session
                try:
                    ws = await session.ws_connect(f"{self.url}/ws?{urlencode({'clientId': self.run_id})}",
                                                  max_msg_size=0, heartbeat=None)
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                    return "failed", self.died_text(), {}
                async with ws:
                    if self.stop_event.is_set():  # stopped before anything was queued
                        return self._stopped()
                    refused = await self._submit(session)
                    if refused is not None:
                        return refused
                    self.outputs.begin()
                    return await self._follow(ws)
        except (aiohttp.ClientError, OSError) as exc:
            if isinstance(exc, aiohttp.ClientResponseError) and exc.status < 500:
                return "failed", f"the ComfyUI on {self.where} answered {exc.status}: {exc.message}", {}
            return "failed", self.died_text(), {}

    async def _submit(self, session: Any) -> tuple[str, str | None, dict[str, Any]] | None:
        """POST the prompt; a refusal (ComfyUI's validation) ends the run."""
        import aiohttp

        self.submitted_at = time.monotonic()
        body = {"prompt": self.graph, "client_id": self.run_id}
        async with session.post(f"{self.url}/prompt", json=body,
                                timeout=aiohttp.ClientTimeout(total=COMFYUI_HTTP_TIMEOUT_S)) as resp:
            text = await resp.text()
            try:
                answer = json.loads(text)
            except ValueError:
                answer = {"error": {"message": text[:2000]}}
            if resp.status != 200:
                return "failed", self._refusal_text(answer), {"validation": answer}
        self.prompt_id = str(answer.get("prompt_id") or "")
        return None

    def _refusal_text(self, answer: Any) -> str:
        """ComfyUI's 400 from /prompt in one line: its error, then each node's."""
        error = answer.get("error") if isinstance(answer, dict) else None
        head = (error.get("message") if isinstance(error, dict) else str(error or "")) or "the prompt was refused"
        details = error.get("details") if isinstance(error, dict) else None
        parts = [f"the ComfyUI on {self.where} refused the workflow: {head}" + (f" ({details})" if details else "")]
        node_errors = answer.get("node_errors") if isinstance(answer, dict) else None
        for node, info in (node_errors or {}).items() if isinstance(node_errors, dict) else []:
            errs = info.get("errors") if isinstance(info, dict) else None
            said = "; ".join(f"{e.get('message', '')}: {e.get('details', '')}".strip(": ")
                             for e in errs or [] if isinstance(e, dict))
            cls = info.get("class_type") if isinstance(info, dict) else None
            parts.append(f"node {node} ({cls or self.class_of(node)}): {said or 'invalid'}")
        return "; ".join(parts)

    async def _follow(self, ws: Any) -> tuple[str, str | None, dict[str, Any]]:
        """Read the websocket until the prompt ends (bounded after a stop by STOP_WAIT_S)."""
        import aiohttp

        stop_deadline: float | None = None
        while True:
            if self.stop_event.is_set() and not self.interrupt_sent:
                await self._interrupt()
                stop_deadline = time.monotonic() + STOP_WAIT_S
                if not self.started_prompt:  # taken off the queue before it ran: it is over
                    return self._stopped()
            if stop_deadline is not None and time.monotonic() > stop_deadline:
                return self._stopped()
            try:
                msg = await ws.receive(timeout=RECEIVE_POLL_S)
            except asyncio.TimeoutError:
                continue
            if msg.type == aiohttp.WSMsgType.BINARY:
                continue  # previews
            if msg.type != aiohttp.WSMsgType.TEXT:
                if self.interrupt_sent:
                    return self._stopped()
                return "failed", self.died_text(), {}
            try:
                data = json.loads(msg.data)
            except ValueError:
                continue
            ended = await self._on_message(data.get("type"), data.get("data") or {})
            if ended is not None:
                return ended

    async def _on_message(self, mtype: Any, data: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]] | None:
        if mtype == "status" or not isinstance(data, dict):
            return None
        if data.get("prompt_id") not in (None, self.prompt_id):
            return None  # another client's prompt on a shared instance
        if mtype == "execution_start":
            self.started_prompt = True
        elif mtype == "execution_cached":
            self.started_prompt = True
            self._first_node()
        elif mtype == "executing":
            node = data.get("node")
            if node is None:  # older ComfyUIs end a prompt this way
                return "succeeded", None, {}
            self.started_prompt = True
            self._first_node()
            self.current = str(node)
            self.emit("node_started", {"node": str(node), "class_type": self.class_of(node)})
        elif mtype == "progress":
            node = str(data.get("node") or self.current or "")
            value, top = data.get("value"), data.get("max")
            self.emit("progress", {"value": value, "max": top, "node": node, "class_type": self.class_of(node),
                                   "text": f"{self.class_of(node)} (node {node}): step {value} of {top}"})
        elif mtype == "executed":
            await self._executed(str(data.get("node")), data.get("output"))
        elif mtype == "execution_success":
            return "succeeded", None, {}
        elif mtype == "execution_error":
            return self._error(data)
        elif mtype == "execution_interrupted":
            return self._stopped()
        return None

    def _first_node(self) -> None:
        if self.first_node_s is None:
            self.first_node_s = round(time.monotonic() - self.submitted_at, 4)

    async def _executed(self, node: str, output: Any) -> None:
        """Copy each file the node wrote through /view; one ``comfy_output`` event."""
        cls = self.class_of(node)
        described: list[dict[str, Any]] = []
        folder = self.outputs.folder(node)
        for key, index, item in output_files(output):
            name = self.outputs.stored_name(node, item["filename"])
            try:
                data = await self._view(item)
            except Exception as exc:  # noqa: BLE001 - one lost file is a warning, not the run's end
                self.emit("run_warning", {"kind": "comfy_output_failed",
                                          "message": f"{self.node_words(node)}: {item['filename']} could not be "
                                                     f"copied from the ComfyUI on {self.where}: {exc}"})
                continue
            atomic.write_bytes(folder / name, data)
            described.append({"kind": file_kind(name), "name": key, "index": index, "file": name, "bytes": len(data),
                              "media_type": mimetypes.guess_type(name)[0] or "application/octet-stream"})
        self.outputs.add(node, cls, described, output)
        self.emit("comfy_output", {"node": node, "class_type": cls,
                                   "files": [{"file": d["file"], "kind": d["kind"], "bytes": d["bytes"]}
                                             for d in described]})

    async def _view(self, item: dict[str, Any]) -> bytes:
        import aiohttp

        query = urlencode({"filename": item["filename"], "subfolder": item.get("subfolder") or "",
                           "type": item.get("type") or "output"})
        async with self.session.get(f"{self.url}/view?{query}",
                                    timeout=aiohttp.ClientTimeout(total=COMFYUI_HTTP_TIMEOUT_S * 10)) as resp:
            if resp.status != 200:
                raise RuntimeError(f"/view answered {resp.status}")
            return bytes(await resp.read())

    def _error(self, data: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
        node = str(data.get("node_id") or self.current or "?")
        cls = str(data.get("node_type") or self.class_of(node))
        message = str(data.get("exception_message") or data.get("exception_type") or "error").strip()
        trace = data.get("traceback")
        self.emit("node_error", {"node": node, "class_type": cls, "message": message,
                                 "traceback": "".join(trace) if isinstance(trace, list) else trace})
        error = f"node {node} ({cls}) failed on {self.where}: {message}"
        extra: dict[str, Any] = {}
        if any(t in message.lower() for t in OOM_TEXTS):
            cards = list(self.comfy.get("devices") or ["cpu"])
            extra["out_of_memory"] = {"device": cards[0], "budget_gib": self.spec.get("budget_gib"),
                                      "simulated": bool(self.spec.get("simulated"))}
        return "failed", error, extra

    async def _interrupt(self) -> None:
        """Stop the prompt: off the queue if it has not started, else interrupted where it runs."""
        self.interrupt_sent = True
        if not self.prompt_id:
            return
        import aiohttp

        # Both, always: a prompt that started just now is not known to have started yet; the interrupt names
        # the prompt, so ComfyUI ignores it unless this prompt is the one running (a shared instance).
        calls = [("/queue", {"delete": [self.prompt_id]}), ("/interrupt", {"prompt_id": self.prompt_id})]
        for path, body in calls:
            try:
                async with self.session.post(f"{self.url}{path}", json=body,
                                             timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    await resp.read()
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                pass  # a dead instance: the websocket says so next

    def _stopped(self) -> Outcome:
        return self.stopped()


def run_comfy(spec: dict[str, Any], run_dir: Path, emit: Emit, facts: dict[str, Any], stop_event: threading.Event,
              stopped: Callable[[], Outcome]) -> Outcome:
    """Run a ``comfyui`` run (the runner's entry); ``facts`` gets the run's ComfyUI facts; the recorded
    outputs are completed and announced (``outputs_recorded``) whatever the end."""
    job = ComfyRun(spec, run_dir, emit, stop_event, stopped)
    emit("run_started", {"run_id": spec.get("run_id"), "pid": facts.get("pid"), "devices": spec.get("devices"),
                         "device_aliases": spec.get("device_aliases"), "placement": spec.get("placement"),
                         "comfyui": {k: job.comfy.get(k) for k in ("instance", "started", "version")}})
    began = time.monotonic()
    try:
        result = asyncio.run(job.run())
    finally:
        facts.update(job.facts())
        emit("outputs_recorded", job.outputs.finish())
    if result[0] == "succeeded":  # a workflow's one metric: a sweep of workflows ranks by it (contracts/sweeps.py)
        emit("metric", {"name": "duration_s", "value": round(time.monotonic() - began, 3)})
    return result
