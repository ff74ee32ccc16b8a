"""What a run left behind (SPEC §12): metrics (JSON, CSV), artifacts, the output log."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from aiohttp import web

from ....nodes.paths import relative_path_problem
from ..errors import ApiError
from ..http import int_param
from ..keys import STORE_KEY
from ..store import Store
from .common import run_dir_of, run_or_404

METRICS_MAX = 100_000
METRICS_CSV_PAGE = 10_000
LOG_CHUNK_MAX = 4 * 1024 * 1024
ARTIFACTS_MAX = 10_000


async def run_metrics(request: web.Request) -> web.Response:
    run = run_or_404(request)
    series: dict[str, list[dict[str, Any]]] = {}
    latest: dict[str, Any] = {}
    points = request.app[STORE_KEY].events_after(run["id"], 0, METRICS_MAX + 1, ["metric"])
    truncated = len(points) > METRICS_MAX
    for ev in points[:METRICS_MAX]:
        p = ev["payload"]
        name = str(p.get("name"))
        point = {"value": p.get("value"), "cursor": ev["cursor"], "ts": ev["ts"]}
        for k in ("step", "epoch", "node"):
            if p.get(k) is not None:
                point[k] = p[k]
        series.setdefault(name, []).append(point)
        latest[name] = p.get("value")
    # "truncated": the series stop after METRICS_MAX points (metrics.csv has them all); "latest" too.
    return web.json_response({"run_id": run["id"], "status": run["status"], "metrics": series,
                              "latest": latest, "final": run["final_metrics"], "truncated": truncated})


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
    cursor = 0
    while True:  # ends: each page moves the cursor forward over a finite log
        page = store.events_after(run["id"], cursor, METRICS_CSV_PAGE, ["metric"])
        for ev in page:
            p = ev["payload"]
            w.writerow([ev["cursor"], ev["ts"], p.get("node", ""), p.get("name", ""), p.get("value", ""),
                        p.get("step", ""), p.get("epoch", "")])
        await resp.write(buf.getvalue().encode("utf-8"))
        buf.seek(0)
        buf.truncate()
        if len(page) < METRICS_CSV_PAGE:
            break
        cursor = page[-1]["cursor"]
    await resp.write_eof()
    return resp


async def run_artifacts(request: web.Request) -> web.Response:
    run = run_or_404(request)
    run_dir = run_dir_of(request, run)
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
        if rel is None:
            outside.append({"path": str(p.get("path")), "kind": p.get("kind"), "downloadable": False})
        else:
            announced[rel.as_posix()] = str(p.get("kind") or "file")
    files: list[dict[str, Any]] = []
    if run_dir is not None and run_dir.is_dir():
        for path in sorted(run_dir.rglob("*")):
            if len(files) >= ARTIFACTS_MAX:
                break
            if not path.is_file() or path.is_symlink() or path.name.endswith(".tmp"):
                continue
            rel = path.relative_to(run_dir).as_posix()
            kind = announced.get(rel) or next((k for a, k in announced.items() if rel.startswith(a + "/")), None)
            if kind is None:
                kind = {"spec.json": "spec", "output.log": "log", "events.jsonl": "events"}.get(rel, "file")
            st = path.stat()
            files.append({"path": rel, "kind": kind, "size": st.st_size, "modified": st.st_mtime,
                          "downloadable": True})
    where = None if run["placement"] != "worker" else f"on worker {run['worker_id']}"
    return web.json_response({"run_id": run["id"], "artifacts": files + outside, "location": where})


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


async def run_logs(request: web.Request) -> web.Response:
    run = run_or_404(request)
    offset = int_param(request, "offset", 0, 0)
    limit = int_param(request, "limit", LOG_CHUNK_MAX, 1, LOG_CHUNK_MAX)
    tail = int_param(request, "tail", 0, 0, LOG_CHUNK_MAX)
    fmt = request.query.get("format", "json")
    if fmt not in ("json", "text"):
        raise ApiError(400, f"format: use json or text, got {fmt!r}")
    run_dir = run_dir_of(request, run)
    path = run_dir / "output.log" if run_dir is not None else None
    data, size = b"", 0
    if path is not None and path.is_file():
        size = path.stat().st_size
        if tail:
            offset = max(0, size - tail)
        if offset < size:  # past the end: nothing yet (a seek that far is EINVAL on some systems)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(limit)
    text = data.decode("utf-8", errors="replace")
    if fmt == "text":
        return web.Response(text=text, content_type="text/plain", headers={"X-Next-Offset": str(offset + len(data))})
    return web.json_response({"run_id": run["id"], "text": text, "offset": offset,
                              "next_offset": offset + len(data), "size": size})




def setup(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/runs/{run_id}/metrics", run_metrics)
    r.add_get("/api/runs/{run_id}/metrics.csv", run_metrics_csv)
    r.add_get("/api/runs/{run_id}/artifacts", run_artifacts)
    r.add_get("/api/runs/{run_id}/artifacts/{path:.+}", run_artifact_file)
    r.add_get("/api/runs/{run_id}/logs", run_logs)
