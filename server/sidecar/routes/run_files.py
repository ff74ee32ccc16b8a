"""What a run left behind (docs/sidecar.md): metrics (JSON, CSV), artifacts, the output log.

A worker's run keeps its folder on the worker: its log, listing and files are read through the agent's
connection while the worker is connected (``read_outputs`` with a ``scope``, server/agent/files.py); while
it is not, the listing and the log say so (``connected: false`` with a sentence) and a file is a 409
naming the worker (docs/runs-panel.md)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from ....common.errors import ApiError
from ....common.http import int_param
from ....nodes.paths import relative_path_problem
from ...workers.outputs import OutputsOffline
from ...workers.protocol import OUTPUTS_CHUNK_BYTES
from ...workers.state import WorkerError
from ..event_feed import pages
from ..keys import STORE_KEY
from ..store import Store
from .common import dispatcher_of, run_dir_of, run_or_404


class WorkerFiles(Protocol):
    """What these routes read of a worker's run folder (the worker registry, server/workers/outputs.py)."""

    async def fetch(self, worker: str, run_id: str, name: str, offset: int = ..., length: int = ...,
                    scope: str = ...) -> tuple[bytes, int, bool]: ...

    async def read_whole(self, worker: str, run_id: str, name: str, limit: int = ...,
                         scope: str = ...) -> bytes: ...


METRICS_MAX = 100_000
LOG_CHUNK_MAX = 4 * 1024 * 1024
ARTIFACTS_MAX = 10_000


routes = web.RouteTableDef()


@routes.get("/api/runs/{run_id}/metrics")
async def run_metrics(request: web.Request) -> web.Response:
    run = run_or_404(request)
    series: dict[str, list[dict[str, Any]]] = {}
    latest: dict[str, Any] = {}
    n = 0
    truncated = False
    hub = dispatcher_of(request).hub
    # a page at a time, the loop going round between pages (event_feed.pages): 100,000 points never hold it
    async for page in pages(request.app[STORE_KEY], hub, run["id"], ["metric"], METRICS_MAX + 1):
        for ev in page:
            n += 1
            if n > METRICS_MAX:
                truncated = True
                break
            p = ev["payload"]
            name = str(p.get("name"))
            point = {"value": p.get("value"), "cursor": ev["cursor"], "ts": ev["ts"]}
            for k in ("step", "epoch", "node"):
                if p.get(k) is not None:
                    point[k] = p[k]
            series.setdefault(name, []).append(point)
            latest[name] = p.get("value")
    # "truncated": the series stop after METRICS_MAX points (metrics.csv has them all); "latest" too.
    answer = {"run_id": run["id"], "status": run["status"], "metrics": series, "latest": latest,
              "final": run["final_metrics"], "truncated": truncated}
    return web.Response(text=await asyncio.to_thread(json.dumps, answer), content_type="application/json")


@routes.get("/api/runs/{run_id}/metrics.csv")
async def run_metrics_csv(request: web.Request) -> web.StreamResponse:
    """Every metric point as CSV, streamed page by page (no cap: a long run's file is complete)."""
    run = run_or_404(request)
    store: Store = request.app[STORE_KEY]
    resp = web.StreamResponse(headers={"Content-Type": "text/csv; charset=utf-8",
                                       "Content-Disposition": f'attachment; filename="{run["id"]}-metrics.csv"'})
    await resp.prepare(request)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["cursor", "ts", "node", "name", "value", "step", "epoch"])
    await resp.write(buf.getvalue().encode("utf-8"))  # the header row, also for a run without metrics
    async for page in pages(store, dispatcher_of(request).hub, run["id"], ["metric"]):  # ends with the log
        buf.seek(0)
        buf.truncate()
        for ev in page:
            p = ev["payload"]
            w.writerow([ev["cursor"], ev["ts"], p.get("node", ""), p.get("name", ""), p.get("value", ""),
                        p.get("step", ""), p.get("epoch", "")])
        await resp.write(buf.getvalue().encode("utf-8"))
    await resp.write_eof()
    return resp


def _registry(request: web.Request) -> WorkerFiles:
    from .workers import REGISTRY_KEY

    return request.app[REGISTRY_KEY]


def _on_worker(run: dict[str, Any]) -> str | None:
    """The worker that keeps the run's folder (None: this server's own run)."""
    return run["worker_id"] if run.get("placement") == "worker" and run.get("worker_id") else None


def _offline(worker: str, what: str) -> str:
    return f"worker {worker} is not connected now: {what} can be read when it reconnects"


def _announced(request: web.Request, run: dict[str, Any], run_dir: Path | None) -> tuple[dict[str, str], list[Any]]:
    """The run's ``artifact`` events: kind by path relative to its folder, and those outside it."""
    announced: dict[str, str] = {}
    outside: list[dict[str, Any]] = []
    for ev in request.app[STORE_KEY].events_after(run["id"], 0, ARTIFACTS_MAX, ["artifact"]):
        p = ev["payload"]
        path = Path(str(p.get("path", "")))
        if run_dir is not None and not path.is_absolute():
            path = run_dir / path
        try:
            rel = path.resolve().relative_to(run_dir) if run_dir is not None else None
        except ValueError:
            rel = None
        if rel is None and run_dir is None and not path.is_absolute():
            rel = path  # a worker's run: relative to its folder there
        if rel is None:
            outside.append({"path": str(p.get("path")), "kind": p.get("kind"), "downloadable": False})
        else:
            announced[rel.as_posix()] = str(p.get("kind") or "file")
    return announced, outside


def _kind(announced: dict[str, str], rel: str) -> str:
    kind = announced.get(rel) or next((k for a, k in announced.items() if rel.startswith(a + "/")), None)
    return kind or {"spec.json": "spec", "output.log": "log", "events.jsonl": "events"}.get(rel, "file")


@routes.get("/api/runs/{run_id}/artifacts")
async def run_artifacts(request: web.Request) -> web.Response:
    run = run_or_404(request)
    worker = _on_worker(run)
    if worker is not None:
        return await _worker_artifacts(request, run, worker)
    run_dir = run_dir_of(request, run)
    announced, outside = _announced(request, run, run_dir)
    files: list[dict[str, Any]] = []
    if run_dir is not None and run_dir.is_dir():
        for path in sorted(run_dir.rglob("*")):
            if len(files) >= ARTIFACTS_MAX:
                break
            if not path.is_file() or path.is_symlink() or path.name.endswith(".tmp"):
                continue
            rel = path.relative_to(run_dir).as_posix()
            st = path.stat()
            files.append({"path": rel, "kind": _kind(announced, rel), "size": st.st_size, "modified": st.st_mtime,
                          "downloadable": True})
    return web.json_response({"run_id": run["id"], "artifacts": files + outside, "location": None,
                              "where": "sidecar", "connected": True})


async def _worker_artifacts(request: web.Request, run: dict[str, Any], worker: str) -> web.Response:
    """A worker run's files, listed by its agent; the announced ones (not downloadable) while it is away."""
    announced, outside = _announced(request, run, None)
    base = {"run_id": run["id"], "location": f"on worker {worker}", "where": "worker", "worker": worker}
    try:
        listing = json.loads(await _registry(request).read_whole(worker, run["id"], "", scope="listing"))
    except OutputsOffline:
        kept = [{"path": p, "kind": k, "downloadable": False} for p, k in announced.items()]
        return web.json_response({**base, "artifacts": kept + outside, "connected": False,
                                  "message": _offline(worker, "its files")})
    except WorkerError as exc:
        if exc.status != 404:
            raise
        listing = {"files": []}  # no folder there yet (not started) or any more (removed)
    listed = [str(f["path"]) for f in listing.get("files") or []]
    # a node announces the worker's absolute path: the listed file it names is that file, not another
    marker = f"/{run['id']}/"
    for entry in list(outside):
        path = entry["path"]
        rel = next((r for r in listed if marker in path and path.endswith("/" + r)), None)
        if rel is not None:
            outside.remove(entry)
            announced[rel] = str(entry.get("kind") or "file")
    files = [{"path": f["path"], "kind": _kind(announced, f["path"]), "size": f.get("size"),
              "modified": f.get("modified"), "downloadable": True} for f in listing.get("files") or []]
    return web.json_response({**base, "artifacts": files + outside, "connected": True,
                              "truncated": bool(listing.get("truncated"))})


@routes.get("/api/runs/{run_id}/artifacts/{path:.+}")
async def run_artifact_file(request: web.Request) -> web.StreamResponse:
    run = run_or_404(request)
    rel = request.match_info["path"]
    if "\x00" in rel:
        raise ApiError(400, f"path: {rel!r} holds a NUL character; name a file inside the run directory")
    shown = repr(rel if len(rel) <= 80 else rel[:80] + "...")
    problem = relative_path_problem(rel)
    if problem is None and any(part == "" for part in rel.split("/")):
        problem = "has an empty name between two '/'"
    if problem is not None:
        raise ApiError(400, f"path: {shown} {problem}; name a file inside the run directory as "
                            f"GET .../artifacts lists it")
    worker = _on_worker(run)
    if worker is not None:
        return await _worker_file(request, run, worker, rel, shown)
    run_dir = run_dir_of(request, run)
    if run_dir is None:
        raise ApiError(404, f"run {run['id']} has no files on this server")
    try:
        path = (run_dir / rel).resolve()
        path.relative_to(run_dir)
        found = path.is_file()
    except ValueError:
        raise ApiError(400, f"path: {shown} leads outside the run directory") from None
    except OSError:  # too long for this file system, a loop of links: never the server's path in the answer
        found = False
    if not found:
        raise ApiError(404, f"no file {shown} in run {run['id']}")
    return web.FileResponse(path, headers={"Content-Disposition": f'attachment; filename="{path.name}"'})


async def _worker_file(request: web.Request, run: dict[str, Any], worker: str, rel: str,
                       shown: str) -> web.StreamResponse:
    """A worker run's file streamed chunk by chunk from its agent (a model never held here whole)."""
    reg = _registry(request)
    try:
        data, size, eof = await reg.fetch(worker, run["id"], rel, 0, scope="run")
    except OutputsOffline:
        raise ApiError(409, _offline(worker, f"the files of run {run['id']}")) from None
    except WorkerError as exc:
        raise ApiError(exc.status, f"no file {shown} in run {run['id']} on worker {worker}") from None
    name = rel.rsplit("/", 1)[-1]
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream", "Content-Length": str(size),
                                       "Content-Disposition": f'attachment; filename="{name}"'})
    await resp.prepare(request)
    sent = len(data)
    await resp.write(data)
    while not eof and data and sent < size:  # ends: every chunk moves forward, up to the size announced
        data, _, eof = await reg.fetch(worker, run["id"], rel, sent, min(OUTPUTS_CHUNK_BYTES, size - sent),
                                       scope="run")
        sent += len(data)
        await resp.write(data)
    await resp.write_eof()
    return resp


async def _worker_log(request: web.Request, run: dict[str, Any], worker: str, offset: int, limit: int,
                      tail: int) -> tuple[bytes, int, int, str | None]:
    """``(data, offset, size, why not)`` of the output log kept on the worker."""
    reg = _registry(request)
    try:
        if tail:
            _, size, _ = await reg.fetch(worker, run["id"], "output.log", 0, 1, scope="run")
            offset = max(0, size - tail)
        data, size, _ = await reg.fetch(worker, run["id"], "output.log", offset,
                                        min(limit, OUTPUTS_CHUNK_BYTES), scope="run")
    except OutputsOffline:
        return b"", offset, 0, _offline(worker, f"the output log of run {run['id']}")
    except WorkerError as exc:
        if exc.status != 404:
            raise
        return b"", offset, 0, None  # not written yet (the run has not started there)
    return data, offset, size, None


def _local_log(path: Path | None, offset: int, limit: int, tail: int) -> tuple[bytes, int, int]:
    """``(data, offset, size)`` of this server's output log of a run."""
    if path is None or not path.is_file():
        return b"", offset, 0
    size = path.stat().st_size
    if tail:
        offset = max(0, size - tail)
    if offset >= size:  # past the end: nothing yet (a seek that far is EINVAL on some systems)
        return b"", offset, size
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(limit), offset, size


@routes.get("/api/runs/{run_id}/logs")
async def run_logs(request: web.Request) -> web.Response:
    run = run_or_404(request)
    offset = int_param(request, "offset", 0, 0)
    limit = int_param(request, "limit", LOG_CHUNK_MAX, 1, LOG_CHUNK_MAX)
    tail = int_param(request, "tail", 0, 0, LOG_CHUNK_MAX)
    fmt = request.query.get("format", "json")
    if fmt not in ("json", "text"):
        raise ApiError(400, f"format: use json or text, got {fmt!r}")
    worker = _on_worker(run)
    offline: str | None = None
    if worker is not None:
        data, offset, size, offline = await _worker_log(request, run, worker, offset, limit, tail)
        if offline is not None and fmt == "text":
            raise ApiError(409, offline)
    else:
        run_dir = run_dir_of(request, run)
        data, offset, size = _local_log(run_dir / "output.log" if run_dir is not None else None, offset, limit, tail)
    text = data.decode("utf-8", errors="replace")
    if fmt == "text":
        return web.Response(text=text, content_type="text/plain", headers={"X-Next-Offset": str(offset + len(data))})
    return web.json_response({"run_id": run["id"], "text": text, "offset": offset, "next_offset": offset + len(data),
                              "size": size, "where": "worker" if worker else "sidecar", "worker": worker,
                              "connected": offline is None, "message": offline})


def setup(app: web.Application) -> None:
    """Add the run-file routes (described in openapi.RUN_OPERATIONS)."""
    app.add_routes(routes)
