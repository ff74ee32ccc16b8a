"""Recorded outputs kept on workers (docs/workers.md): read through the agent's connection while it is connected,
and copied to the sidecar at the run's end with ``record_outputs: "upload"`` (beyond the seed).

The agent answers ``read_outputs`` with chunks (``outputs_data``); a file is read chunk by chunk, so a
large tensor never travels in one message. An upload copies ``index.json``, each node's manifest and
files into ``$XPUFLEET_HOME/runs/<id>/recorded_outputs`` through a temporary folder renamed at the end:
a reader sees the whole copy or none. The run's ``run_finished`` is stored after the upload, so a run
that has ended has its outputs here (or says in ``execution_facts.recorded_outputs`` why not).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...common import atomic
from ...constants import RECORDED_OUTPUTS_DIRNAME, RUN_KIND_COMFYUI, RUNS_DIR_NAME
from ..comfyflow.kind import run_kind
from ..run.outputs import INDEX_NAME, record_mode, safe_name
from . import protocol
from .state import AgentLink, WorkerError, WorkerState

log = logging.getLogger("xpufleet.workers")

READ_TIMEOUT_S = 60.0  # one chunk's answer
UPLOAD_TIMEOUT_S = 600.0  # a whole upload; past it the run ends with the outputs left on the worker
MAX_READ_BYTES = 1024 * 1024 * 1024  # one file read whole (an upload, a JSON manifest)


class OutputsOffline(WorkerError):
    """The worker that keeps a run's outputs is not connected (HTTP 409, naming it)."""

    def __init__(self, worker: str, run_id: str) -> None:
        super().__init__(
            f"the recorded outputs of run {run_id} are kept on worker {worker}, which is not connected now: they "
            f"can be read when it reconnects (submit with options.record_outputs \"upload\" to have them copied "
            f"to this server when the run ends)", 409)
        self.worker = worker


class OutputsAccess:
    """Recorded outputs on workers: read through their connections, uploaded at a run's end."""

    def __init__(self, workers: dict[str, WorkerState], home: Path,
                 ingest: Callable[[str, list[dict[str, Any]]], Any]) -> None:
        """``workers``: the shared worker table's dict; ``home``: XPUFLEET_HOME; ``ingest``: stores a run's
        events (the dispatcher's)."""
        self.workers = workers
        self.home = home
        self.ingest = ingest
        self._uploading: set[str] = set()  # runs whose outputs are being copied (run_finished waits for it)
        self._upload_tasks: set[asyncio.Task[Any]] = set()

    def close(self) -> None:
        """Server stopping: uploads in flight end (the agent replays the run's end to the next server)."""
        for task in list(self._upload_tasks):
            task.cancel()

    def uploaded_dir(self, run_id: str) -> Path:
        """Where the sidecar keeps a run's outputs (a local run's own, or an uploaded copy)."""
        return self.home / RUNS_DIR_NAME / run_id / RECORDED_OUTPUTS_DIRNAME

    async def fetch(self, worker: str, run_id: str, name: str, offset: int = 0,
                    length: int = protocol.OUTPUTS_CHUNK_BYTES, scope: str = "outputs") -> tuple[bytes, int, bool]:
        """One chunk of a file on ``worker``: ``(data, size, eof)``; ``scope``: the run's recorded outputs,
        its run folder (``run``: the log, the files its nodes wrote) or that folder's listing."""
        st = self.workers.get(worker)
        conn = st.conn if st is not None else None
        if conn is None or conn.closed:
            raise OutputsOffline(worker, run_id)
        rid = secrets.token_hex(8)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        conn.pending[rid] = fut
        try:
            extra = {} if scope == "outputs" else {"scope": scope}
            if not await conn.send("read_outputs", request_id=rid, run_id=run_id, file=name, offset=offset,
                                   length=length, **extra):
                raise OutputsOffline(worker, run_id)
            msg = await asyncio.wait_for(fut, READ_TIMEOUT_S)
        except (ConnectionError, asyncio.TimeoutError):
            raise OutputsOffline(worker, run_id) from None
        finally:
            conn.pending.pop(rid, None)
        if not msg["ok"]:
            raise WorkerError(msg["error"], int(msg.get("status") or 404))
        return base64.b64decode(msg["data"]), int(msg["size"]), bool(msg["eof"])

    async def read_whole(self, worker: str, run_id: str, name: str, limit: int = MAX_READ_BYTES,
                         scope: str = "outputs") -> bytes:
        """A whole file from ``worker`` (chunk by chunk)."""
        out = bytearray()
        while True:
            data, size, eof = await self.fetch(worker, run_id, name, len(out), scope=scope)
            if size > limit:
                raise WorkerError(f"{name} of run {run_id} is {size} bytes, more than {limit}", 413)
            out += data
            if eof or not data:
                return bytes(out)

    # --- upload (record_outputs: "upload") ------------------------------------------------------------
    def wants_upload(self, run: dict[str, Any]) -> bool:
        """Whether the run's recorded outputs are copied here at its end: ``upload`` asked, or a ComfyUI run
        (its images are its result: they must outlive the worker's connection)."""
        if run.get("kind") == RUN_KIND_COMFYUI or (run.get("kind") is None and "graph" in run
                                                   and run_kind(run["graph"]) == RUN_KIND_COMFYUI):
            return True
        return record_mode(run.get("options") or {}) == "upload"

    def start_upload(self, st: WorkerState, conn: AgentLink, run: dict[str, Any], msg: dict[str, Any]) -> None:
        """Copy the run's outputs here, then store its ``run_finished`` (a replay meanwhile is ignored)."""
        if run["id"] in self._uploading:
            return
        self._uploading.add(run["id"])
        task = asyncio.get_running_loop().create_task(self._upload_then_finish(st, conn, run, msg))
        self._upload_tasks.add(task)
        task.add_done_callback(self._upload_tasks.discard)

    async def _upload_then_finish(self, st: WorkerState, conn: AgentLink, run: dict[str, Any],
                                  msg: dict[str, Any]) -> None:
        run_id = run["id"]
        try:
            try:
                facts = await asyncio.wait_for(self.upload_outputs(st.name, run_id), UPLOAD_TIMEOUT_S)
            except (WorkerError, OSError, ValueError, asyncio.TimeoutError) as exc:
                log.warning("run %s: uploading its recorded outputs from %s failed: %s", run_id, st.name, exc)
                facts = {"kept_on": st.name, "uploaded": False, "error": str(exc) or type(exc).__name__}
            payload = dict(msg["payload"])
            payload["execution_facts"] = {**(payload.get("execution_facts") or {}), "recorded_outputs": facts}
            self.ingest(run_id, [{"seq": msg["seq"], "type": "run_finished", "payload": payload,
                                             "ts": msg.get("ts")}])
            await conn.send("ack", run_id=run_id, seq=msg["seq"])
        finally:
            self._uploading.discard(run_id)

    async def upload_outputs(self, worker: str, run_id: str) -> dict[str, Any]:
        """Copy every recorded file of ``run_id`` from ``worker`` here; what ``execution_facts`` says."""
        dest = self.uploaded_dir(run_id)
        if (dest / INDEX_NAME).is_file():
            return {"kept_on": worker, "uploaded": True, "bytes": _size(dest)}
        tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp")
        try:
            index_bytes = await self.read_whole(worker, run_id, INDEX_NAME)
            index = json.loads(index_bytes)
            total = 0
            for node in index.get("nodes") or []:
                folder = safe_name(str(node.get("node")))
                for fname in node.get("files") or []:
                    if os.sep in fname or "/" in fname or fname.startswith("."):
                        continue  # written by our recorder: plain names only
                    data = await self.read_whole(worker, run_id, f"{folder}/{fname}")
                    (tmp / folder).mkdir(parents=True, exist_ok=True)
                    await asyncio.to_thread((tmp / folder / fname).write_bytes, data)
                    total += len(data)
            tmp.mkdir(parents=True, exist_ok=True)
            (tmp / INDEX_NAME).write_bytes(index_bytes)
            dest.parent.mkdir(parents=True, exist_ok=True)
            atomic.publish_dir(tmp, dest)
        finally:
            if tmp.exists():
                with contextlib.suppress(OSError):
                    shutil.rmtree(tmp)
        return {"kept_on": worker, "uploaded": True, "bytes": total + len(index_bytes)}


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
