"""The sidecar's HTTP API (SPEC §12) and its serving loop.

:func:`create_app` builds the aiohttp application: security middleware (auth.py), JSON errors, the run
routes, the OpenAPI document, and the mount points other parts plug into:

* ``predictor.routes.add_sidecar_routes(app, card_snapshots)`` when the predictor is installed;
* ``server/routes_workers.py``'s ``setup(app)`` when the worker module is there; it finds the
  dispatcher at ``app[DISPATCHER_KEY]`` (register providers, ingest events) and the store at
  ``app[STORE_KEY]`` (``store.ensure_schema`` for its tables).

:func:`serve` runs it in the foreground (``xpufleet start --foreground``): one sidecar per
``XPUFLEET_HOME`` (a lock file), the runtime file written once it listens, SIGTERM/SIGINT stop it
gracefully (started runs are asked to stop and end ``interrupted``; queued runs stay queued).
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import gc
import importlib.util
import io
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from ..constants import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ENV_ALLOWED_HOSTS,
    ENV_RUN_QUEUE_MAX_CONCURRENT,
    EVENTS_LONG_POLL_MAX_S,
    EVENTS_PAGE_MAX,
    MAX_REQUEST_BODY_BYTES,
    RUN_STATUSES,
    RUN_STOP_GRACE_S,
    RUNS_DIR_NAME,
    RUNS_PAGE_MAX,
    SIDECAR_LOCK_NAME,
    STATE_DB_NAME,
    TERMINAL_STATUSES,
    VERSION,
)
from . import auth, openapi
from .dispatcher import Dispatcher, RequestError, parse_run_request
from .providers import LocalProvider, probe_local_devices
from .runtime_file import ensure_home, remove_runtime, url_for, write_runtime
from .slots import parse_limits
from .store import Store, StoreError

log = logging.getLogger("xpufleet.sidecar")

DISPATCHER_KEY = web.AppKey("xpufleet_dispatcher", Dispatcher)
STORE_KEY = web.AppKey("xpufleet_store", Store)
CONFIG_KEY = web.AppKey("xpufleet_config", object)
LOCAL_PROVIDER_KEY = web.AppKey("xpufleet_local_provider", object)
STARTED_KEY = web.AppKey("xpufleet_started_at", float)

METRICS_MAX = 100_000
METRICS_CSV_PAGE = 10_000
LOG_CHUNK_MAX = 4 * 1024 * 1024
SSE_KEEPALIVE_S = 15.0
ARTIFACTS_MAX = 10_000


@dataclass
class SidecarConfig:
    """How a sidecar runs. ``local_devices`` None = probe this machine; ``limits`` None = the env var."""

    home: Path
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str = field(default_factory=auth.new_token)
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = MAX_REQUEST_BODY_BYTES
    limits: str | None = None
    local_devices: list[dict[str, Any]] | None = None
    stop_grace_s: float = RUN_STOP_GRACE_S
    validate_local_graphs: bool = True

    @staticmethod
    def from_env(home: Path, **kw: Any) -> SidecarConfig:
        extra = tuple(h for h in os.environ.get(ENV_ALLOWED_HOSTS, "").split(",") if h.strip())
        kw["allowed_hosts"] = tuple(kw.get("allowed_hosts") or ()) + extra
        kw.setdefault("limits", os.environ.get(ENV_RUN_QUEUE_MAX_CONCURRENT))
        return SidecarConfig(home=home, **kw)


# --- helpers ------------------------------------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status: int, message: str, extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra or {}


def _error(status: int, message: str, extra: dict[str, Any] | None = None) -> web.Response:
    return web.json_response({"error": message, **(extra or {})}, status=status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
    """Every error is ``{"error": message}``: ours, aiohttp's (404, 405, 413) and unexpected ones."""
    try:
        return await handler(request)
    except ApiError as exc:
        return _error(exc.status, exc.message, exc.extra)
    except RequestError as exc:
        return _error(exc.status, str(exc), exc.extra)
    except StoreError as exc:
        return _error(exc.status, str(exc))
    except web.HTTPRequestEntityTooLarge:
        cap = request.client_max_size
        return _error(413, f"the request body is larger than the {cap} bytes ({cap / 2**20:g} MiB) this server accepts")
    except web.HTTPException as exc:
        if exc.status >= 400:
            text = exc.reason
            if exc.status == 404:
                text = f"no route {request.method} {request.path}: see GET /api/openapi.json"
            elif exc.status == 405:
                text = f"method {request.method} is not allowed on {request.path}"
            return _error(exc.status, text)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # noqa: BLE001 - never a traceback to the client
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")


NO_BODY = object()


async def read_json(request: web.Request, *, optional: bool = False) -> Any:
    """The request body as JSON; 400 naming what is wrong, 413 when over the cap.

    With ``optional``, an empty body gives ``NO_BODY`` (JSON ``null`` is a body, and not an object)."""
    body = await request.read()
    if not body.strip():
        if optional:
            return NO_BODY
        raise ApiError(400, "the body is empty: send a JSON object")
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise ApiError(400, "the body is not UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


INT_PARAM_MAX = 2**63 - 1  # SQLite's INTEGER and a file offset: a larger value is a 400, not a 500


def int_param(request: web.Request, name: str, default: int, lo: int, hi: int | None = None) -> int:
    """The integer query parameter ``name`` in ``[lo, hi]`` (``hi`` None: up to 2^63-1); 400 otherwise."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < lo or value > (INT_PARAM_MAX if hi is None else hi):
        rng = f"between {lo} and {hi}" if hi is not None else f">= {lo} (at most 2^63-1)"
        raise ApiError(400, f"{name}: must be an integer {rng}, got {raw!r}")
    return value


def float_param(request: web.Request, name: str, default: float, lo: float, hi: float) -> float:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not lo <= value <= hi:
        raise ApiError(400, f"{name}: must be a number between {lo:g} and {hi:g}, got {raw!r}")
    return value


def _dispatcher(request: web.Request) -> Dispatcher:
    return request.app[DISPATCHER_KEY]


def _run_or_404(request: web.Request, with_graph: bool = False) -> dict[str, Any]:
    run_id = request.match_info["run_id"]
    run = request.app[STORE_KEY].get_run(run_id, with_graph=with_graph)
    if run is None:
        raise ApiError(404, f"no run {run_id!r}")
    return run


def _public_run(run: dict[str, Any], dispatcher: Dispatcher | None = None) -> dict[str, Any]:
    out = dict(run)
    out.pop("pid", None)
    if dispatcher is not None and run["status"] == "queued":
        out["queue_position"] = dispatcher.queue_position(run["id"])
    return out


# --- routes -------------------------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "name": "xpufleet", "version": VERSION})


async def status(request: web.Request) -> web.Response:
    d = _dispatcher(request)
    state = d.slot_state()
    slots = [{"key": s.key, "label": s.label, "kind": s.kind, "used": s.used, "limit": s.limit,
              "limit_from": s.limit_from, "providers": s.shared_by(), "runs": s.holders}
             for s in state.slots.values()]
    providers = [{"name": p.name, "local": p.is_local, "online": p.online, "draining": p.draining,
                  "devices": p.device_names()} for p in d.provider_infos()]
    cfg: SidecarConfig = request.app[CONFIG_KEY]  # type: ignore[assignment]
    return web.json_response({
        "status": "ok", "version": VERSION, "pid": os.getpid(), "home": str(cfg.home),
        "started_at": request.app[STARTED_KEY], "runs": d.store.counts(), "queue_length": d.queue_length(),
        "providers": providers, "slots": slots, "plans": d.plans,
    })


async def openapi_doc(request: web.Request) -> web.Response:
    return web.json_response(openapi.document(request.app))


async def submit_run(request: web.Request) -> web.Response:
    body = await read_json(request)
    req = parse_run_request(body)
    result = _dispatcher(request).submit(req)
    return web.json_response(result, status=201)


async def list_runs(request: web.Request) -> web.Response:
    statuses = None
    raw = request.query.get("status")
    if raw:
        statuses = [s.strip() for s in raw.split(",") if s.strip()]
        bad = [s for s in statuses if s not in RUN_STATUSES]
        if bad:
            raise ApiError(400, f"status: unknown {', '.join(bad)}; use {', '.join(RUN_STATUSES)}")
    limit = int_param(request, "limit", 50, 1, RUNS_PAGE_MAX)
    offset = int_param(request, "offset", 0, 0)
    runs, total = request.app[STORE_KEY].list_runs(
        statuses=statuses, name=request.query.get("name") or None, worker=request.query.get("worker") or None,
        limit=limit, offset=offset)
    d = _dispatcher(request)
    return web.json_response({"runs": [_public_run(r, d) for r in runs], "total": total,
                              "limit": limit, "offset": offset})


async def get_run(request: web.Request) -> web.Response:
    return web.json_response(_public_run(_run_or_404(request, with_graph=True), _dispatcher(request)))


async def cancel_run(request: web.Request) -> web.Response:
    body = await read_json(request, optional=True)
    reason = None
    if body is not NO_BODY:
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object like {\"reason\": \"...\"} (or empty)")
        unknown = sorted(set(body) - {"reason"})
        if unknown:
            raise ApiError(400, f"unknown field(s) {', '.join(unknown)}: the body may have \"reason\"")
        reason = body.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 500):
            raise ApiError(400, "reason: must be a string of at most 500 characters")
    run = await _dispatcher(request).cancel(request.match_info["run_id"], reason)
    return web.json_response(_public_run(run))


async def delete_run(request: web.Request) -> web.Response:
    run = _dispatcher(request).delete(request.match_info["run_id"])
    return web.json_response({"deleted": run["id"], "status": run["status"]})


async def run_events(request: web.Request) -> web.Response:
    run = _run_or_404(request)
    run_id = run["id"]
    cursor = int_param(request, "cursor", 0, 0)
    wait = float_param(request, "wait", 0.0, 0.0, EVENTS_LONG_POLL_MAX_S)
    limit = int_param(request, "limit", 500, 1, EVENTS_PAGE_MAX)
    types = [t.strip() for t in request.query.get("type", "").split(",") if t.strip()] or None
    d = _dispatcher(request)
    store = request.app[STORE_KEY]
    waiter = d.hub.waiter(run_id)  # before reading: a notification in between is not lost
    events = store.events_after(run_id, cursor, limit, types)
    if not events and wait > 0 and run["status"] not in TERMINAL_STATUSES and not d.shutting_down:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(waiter.wait(), wait)
        events = store.events_after(run_id, cursor, limit, types)
    run = store.get_run(run_id) or run
    last = store.last_cursor(run_id) or 0
    new_cursor = events[-1]["cursor"] if events else cursor
    if types:  # filtered: skip past unmatched events too
        new_cursor = max(new_cursor, last) if len(events) < limit else new_cursor
    done = run["status"] in TERMINAL_STATUSES and new_cursor >= last
    return web.json_response({"events": events, "cursor": new_cursor, "status": run["status"], "done": done})


async def run_events_stream(request: web.Request) -> web.StreamResponse:
    run = _run_or_404(request)
    run_id = run["id"]
    cursor = int_param(request, "cursor", 0, 0)
    last_id = request.headers.get("Last-Event-ID")
    if last_id:
        try:
            given = int(last_id)
        except ValueError:
            given = -1
        if not 0 <= given <= INT_PARAM_MAX:
            raise ApiError(400, f"Last-Event-ID: must be an event cursor (an integer >= 0), got {last_id!r}")
        cursor = max(cursor, given)
    d = _dispatcher(request)
    store = request.app[STORE_KEY]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    while True:
        waiter = d.hub.waiter(run_id)
        events = store.events_after(run_id, cursor, EVENTS_PAGE_MAX)
        for ev in events:
            data = json.dumps({"cursor": ev["cursor"], "type": ev["type"], "payload": ev["payload"], "ts": ev["ts"]})
            await resp.write(f"id: {ev['cursor']}\nevent: {ev['type']}\ndata: {data}\n\n".encode())
            cursor = ev["cursor"]
        if events:
            continue
        current = store.get_run(run_id)
        if current is None or current["status"] in TERMINAL_STATUSES or d.shutting_down:
            break
        try:
            await asyncio.wait_for(waiter.wait(), SSE_KEEPALIVE_S)
        except asyncio.TimeoutError:
            await resp.write(b": keepalive\n\n")
    await resp.write_eof()
    return resp


async def run_metrics(request: web.Request) -> web.Response:
    run = _run_or_404(request)
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
    run = _run_or_404(request)
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


def _run_dir(request: web.Request, run: dict[str, Any]) -> Path | None:
    if not run.get("run_dir"):
        return None
    cfg: SidecarConfig = request.app[CONFIG_KEY]  # type: ignore[assignment]
    root = (cfg.home / RUNS_DIR_NAME).resolve()
    path = Path(run["run_dir"]).resolve()
    return path if path.parent == root else None


async def run_artifacts(request: web.Request) -> web.Response:
    run = _run_or_404(request)
    run_dir = _run_dir(request, run)
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
    run = _run_or_404(request)
    rel = request.match_info["path"]
    if "\x00" in rel:
        raise ApiError(400, f"path: {rel!r} holds a NUL character; name a file inside the run directory")
    if rel.startswith("/") or any(part in ("..", "") for part in rel.split("/")):
        raise ApiError(400, f"path: {rel!r} must be a relative path inside the run directory (no '..')")
    run_dir = _run_dir(request, run)
    if run_dir is None:
        raise ApiError(404, f"run {run['id']} has no files on this server")
    path = (run_dir / rel).resolve()
    try:
        path.relative_to(run_dir)
    except ValueError:
        raise ApiError(400, f"path: {rel!r} leads outside the run directory") from None
    if not path.is_file():
        raise ApiError(404, f"no file {rel!r} in run {run['id']}")
    return web.FileResponse(path, headers={"Content-Disposition": f'attachment; filename="{path.name}"'})


async def run_logs(request: web.Request) -> web.Response:
    run = _run_or_404(request)
    offset = int_param(request, "offset", 0, 0)
    limit = int_param(request, "limit", LOG_CHUNK_MAX, 1, LOG_CHUNK_MAX)
    tail = int_param(request, "tail", 0, 0, LOG_CHUNK_MAX)
    fmt = request.query.get("format", "json")
    if fmt not in ("json", "text"):
        raise ApiError(400, f"format: use json or text, got {fmt!r}")
    run_dir = _run_dir(request, run)
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


# --- the app --------------------------------------------------------------------------------------------


def create_app(config: SidecarConfig) -> web.Application:
    """The sidecar application (not started). State lives under ``config.home``."""
    ensure_home(config.home)
    policy = auth.host_policy(config.host, config.allowed_hosts)
    app = web.Application(
        client_max_size=config.max_body_bytes,
        middlewares=[errors_middleware, auth.security_middleware(config.token, policy)],
    )
    app[auth.EXEMPTIONS_KEY] = []
    overrides, warnings = parse_limits(config.limits)
    for w in warnings:
        log.warning("%s: %s", ENV_RUN_QUEUE_MAX_CONCURRENT, w)
    store = Store(config.home / STATE_DB_NAME)
    dispatcher = Dispatcher(store, config.home, overrides, validate_local_graphs=config.validate_local_graphs,
                            stop_grace_s=config.stop_grace_s)
    app[STORE_KEY] = store
    app[DISPATCHER_KEY] = dispatcher
    app[CONFIG_KEY] = config
    app[STARTED_KEY] = time.time()
    openapi.setup(app)
    r = app.router
    r.add_get("/api/health", health)
    r.add_get("/api/status", status)
    r.add_get("/api/openapi.json", openapi_doc)
    r.add_post("/api/runs", submit_run)
    r.add_get("/api/runs", list_runs)
    r.add_get("/api/runs/{run_id}", get_run)
    r.add_delete("/api/runs/{run_id}", delete_run)
    r.add_post("/api/runs/{run_id}/cancel", cancel_run)
    r.add_get("/api/runs/{run_id}/events", run_events)
    r.add_get("/api/runs/{run_id}/events/stream", run_events_stream)
    r.add_get("/api/runs/{run_id}/metrics", run_metrics)
    r.add_get("/api/runs/{run_id}/metrics.csv", run_metrics_csv)
    r.add_get("/api/runs/{run_id}/artifacts", run_artifacts)
    r.add_get("/api/runs/{run_id}/artifacts/{path:.+}", run_artifact_file)
    r.add_get("/api/runs/{run_id}/logs", run_logs)

    # --- mount points for the other parts (each optional) ---
    try:
        from ..predictor.routes import add_sidecar_routes
    except ImportError:
        add_sidecar_routes = None
    if add_sidecar_routes is not None:
        add_sidecar_routes(app, dispatcher.card_snapshots)
    if importlib.util.find_spec(f"{__package__}.routes_workers") is not None:
        from . import routes_workers  # type: ignore[attr-defined]

        routes_workers.setup(app)  # workers, agents' WebSocket, join tokens (issue 4)

    async def on_startup(app: web.Application) -> None:
        devices = config.local_devices
        if devices is None:
            devices = await asyncio.to_thread(probe_local_devices, config.home)
        local = LocalProvider(config.home, dispatcher, devices, stop_grace_s=config.stop_grace_s)
        app[LOCAL_PROVIDER_KEY] = local
        dispatcher.register_provider(local)
        await dispatcher.start()

    async def on_shutdown(app: web.Application) -> None:
        await dispatcher.shutdown()

    async def on_cleanup(app: web.Application) -> None:
        store.close()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app


# --- serving ------------------------------------------------------------------------------------------


class AlreadyRunning(RuntimeError):
    """Another sidecar holds this XPUFLEET_HOME."""


@contextlib.contextmanager
def home_lock(home: Path):
    """One sidecar per XPUFLEET_HOME (an advisory lock held while it runs)."""
    ensure_home(home)
    fh = open(home / SIDECAR_LOCK_NAME, "a+")  # noqa: SIM115 - held for the server's lifetime
    try:
        try:
            import fcntl

            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # Windows: no flock; the runtime file check in the CLI still applies
            pass
        except OSError:
            raise AlreadyRunning(f"another sidecar is running with XPUFLEET_HOME={home}") from None
        yield
    finally:
        fh.close()


async def serve(config: SidecarConfig, ready: Callable[[str], None] | None = None) -> int:
    """Run the sidecar until SIGTERM/SIGINT; ``ready(url)`` is called once it listens."""
    app = create_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc} "
                      f"(choose another port with --port)") from None
    gc.freeze()  # start-up objects never die: keep them out of the collector's full passes
    port = int(runner.addresses[0][1])
    url = url_for(config.host, port)
    write_runtime(config.home, {"url": url, "host": config.host, "port": port, "pid": os.getpid(),
                                "token": config.token, "version": VERSION, "home": str(config.home),
                                "started_at": app[STARTED_KEY]})
    log.info("XPU Fleet sidecar %s listening on %s (home %s)", VERSION, url, config.home)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready(url)
    try:
        await stop.wait()
        log.info("stopping: asking started runs to stop (they end interrupted)")
    finally:
        await runner.cleanup()
        remove_runtime(config.home, os.getpid())
    return 0


def run_foreground(config: SidecarConfig, ready: Callable[[str], None] | None = None) -> int:
    """``xpufleet start --foreground``: hold the home lock and serve until stopped."""
    with home_lock(config.home):
        return asyncio.run(serve(config, ready))
