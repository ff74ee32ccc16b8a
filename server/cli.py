"""The ``xpufleet`` command (SPEC §9).

``xpufleet start [--foreground] [--host H] [--port P]``, ``stop``, ``status``;
``xpufleet run GRAPH.json [--target NAME|any|local] [--device D | --devices D1,D2] [--memory-gib G]
[--name N] [--seed S] [--follow | --wait | --no-wait] [--local]``; ``xpufleet runs``; ``xpufleet cancel``;
plus ``agent`` and ``predict`` when those parts are installed.

Exit codes a script can rely on:

* 0: done; for ``run --wait/--follow``, the run succeeded;
* 1: the run failed, was cancelled or interrupted (or the server could not start);
* 2: usage or validation error (bad arguments, a graph or target the server rejects with 400);
* 3: the sidecar is not reachable (not started, stopped, or its token was refused).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..constants import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    SIDECAR_LOG_NAME,
    SIDECAR_START_TIMEOUT_S,
    SIDECAR_STOP_TIMEOUT_S,
    TERMINAL_STATUSES,
    VERSION,
)
from .client import ApiError, Client, SidecarUnreachable
from .runtime_file import ensure_home, home_dir, pid_alive, read_runtime, remove_runtime

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
SERVER_MODULE = __package__ or "xpufleet.server"


def _err(msg: str) -> None:
    print(f"xpufleet: {msg}", file=sys.stderr)


# --- start / stop / status ----------------------------------------------------------------------------


def _running_client(home: Path) -> tuple[Client, dict[str, Any]] | None:
    """A client for the sidecar of ``home`` when one is alive and answering; clears a stale file."""
    info = read_runtime(home)
    if info is None:
        return None
    if not pid_alive(info.get("pid")):
        remove_runtime(home)
        return None
    client = Client(info["url"], info.get("token"), timeout=5.0)
    try:
        client.health()
    except (SidecarUnreachable, ApiError):
        return None
    return client, info


def cmd_start(args: argparse.Namespace) -> int:
    home = ensure_home(home_dir())
    if args.foreground:
        return _start_foreground(args, home)
    running = _running_client(home)
    if running is not None:
        print(f"XPU Fleet sidecar already running at {running[1]['url']} (pid {running[1]['pid']})")
        return EXIT_OK
    read_fd, write_fd = os.pipe()
    cmd = [sys.executable, "-m", SERVER_MODULE, "start", "--foreground", "--host", args.host,
           "--port", str(args.port), "--ready-fd", str(write_fd)]
    for name in args.allowed_host or ():
        cmd += ["--allowed-host", name]
    log_path = home / SIDECAR_LOG_NAME
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                pass_fds=(write_fd,), start_new_session=True, close_fds=True)
    os.close(write_fd)
    message = _read_ready(read_fd, SIDECAR_START_TIMEOUT_S)
    if message.startswith("http"):
        print(f"XPU Fleet sidecar running at {message} (pid {proc.pid}, home {home})")
        return EXIT_OK
    if proc.poll() is None and not message:
        _err(f"the sidecar did not get ready within {SIDECAR_START_TIMEOUT_S:g} s; see {log_path}")
        return EXIT_RUN_FAILED
    if message.startswith("error:"):
        _err(message[len("error:"):].strip())
    else:
        _err(f"the sidecar exited during start-up (code {proc.wait(timeout=5)}); see {log_path}")
        print(_tail(log_path), file=sys.stderr)
    return EXIT_RUN_FAILED


def _read_ready(fd: int, timeout: float) -> str:
    """What the starting sidecar writes on its ready pipe ('' on EOF or timeout). No polling: select."""
    deadline = time.monotonic() + timeout
    chunks = b""
    try:
        while b"\n" not in chunks:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                break
            data = os.read(fd, 4096)
            if not data:
                break
            chunks += data
    finally:
        os.close(fd)
    return chunks.decode("utf-8", "replace").strip()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _start_foreground(args: argparse.Namespace, home: Path) -> int:
    from .app import AlreadyRunning, SidecarConfig, run_foreground

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ready_fd = args.ready_fd

    def report(text: str) -> None:
        nonlocal ready_fd
        if ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(ready_fd, (text + "\n").encode())
                os.close(ready_fd)
            ready_fd = None

    running = _running_client(home)
    if running is not None:
        report(f"error: a sidecar is already running at {running[1]['url']} (pid {running[1]['pid']})")
        _err(f"a sidecar is already running at {running[1]['url']} (pid {running[1]['pid']})")
        return EXIT_RUN_FAILED
    config = SidecarConfig.from_env(home, host=args.host, port=args.port,
                                    allowed_hosts=tuple(args.allowed_host or ()))
    try:
        return run_foreground(config, ready=report)
    except AlreadyRunning as exc:
        report(f"error: {exc}")
        _err(str(exc))
        return EXIT_RUN_FAILED
    except OSError as exc:
        report(f"error: {exc}")
        _err(str(exc))
        return EXIT_RUN_FAILED


def _is_sidecar_process(pid: int) -> bool:
    try:
        import psutil

        cmd = psutil.Process(pid).cmdline()
    except Exception:  # noqa: BLE001 - cannot tell: trust the runtime file
        return True
    return "start" in cmd and "--foreground" in cmd


def cmd_stop(args: argparse.Namespace) -> int:
    home = home_dir()
    info = read_runtime(home)
    if info is None or not pid_alive(info.get("pid")):
        if info is not None:
            remove_runtime(home)
        print("XPU Fleet sidecar is not running")
        return EXIT_OK
    pid = int(info["pid"])
    if not _is_sidecar_process(pid):
        remove_runtime(home)
        print(f"XPU Fleet sidecar is not running (pid {pid} in the runtime file is another program)")
        return EXIT_OK
    os.kill(pid, signal.SIGTERM)
    print(f"stopping the sidecar (pid {pid}); started runs are asked to stop and end interrupted", file=sys.stderr)
    if not _wait_exit(pid, args.timeout):
        _err(f"the sidecar did not stop within {args.timeout:g} s; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_exit(pid, 10.0)
        remove_runtime(home, pid)
    print("XPU Fleet sidecar stopped")
    return EXIT_OK


def _wait_exit(pid: int, timeout: float) -> bool:
    """Wait for a process that is not our child to exit (True when it did). Linux: a pidfd becomes
    readable when the process exits (a zombie counts: it has exited), no polling."""
    try:
        fd = os.pidfd_open(pid)  # type: ignore[attr-defined]
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            ready, _, _ = select.select([fd], [], [], timeout)
            return bool(ready)
        finally:
            os.close(fd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # elsewhere: bounded polling
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def cmd_status(args: argparse.Namespace) -> int:
    home = home_dir()
    running = _running_client(home)
    if running is None:
        print(f"XPU Fleet sidecar is not running (XPUFLEET_HOME={home})")
        return EXIT_UNREACHABLE
    client, info = running
    try:
        st = client.status()
    except (ApiError, SidecarUnreachable) as exc:
        _err(f"the sidecar at {info['url']} does not answer its status: {exc}")
        return EXIT_UNREACHABLE
    if args.json:
        print(json.dumps({**st, "url": info["url"]}, indent=2))
        return EXIT_OK
    runs = ", ".join(f"{n} {s}" for s, n in st["runs"].items() if n) or "none"
    print(f"XPU Fleet sidecar {st['version']} running at {info['url']} (pid {st['pid']}, home {st['home']})")
    print(f"runs: {runs}")
    for s in st["slots"]:
        shared = f" (shared by {', '.join(s['providers'])})" if len(s["providers"]) > 1 else ""
        print(f"  {s['label']:<28} {s['used']}/{s['limit']} slots{shared}")
    return EXIT_OK


# --- run / runs / cancel ------------------------------------------------------------------------------


def _client_or_exit() -> Client:
    client = Client.from_home(home_dir())
    client.health()
    return client


def _load_graph(path: str) -> dict[str, Any]:
    from .localrun import load_graph

    graph = load_graph(path)
    if isinstance(graph.get("nodes"), list) and "links" in graph:
        raise ValueError(f"{path} is a UI workflow; export it in API format (Workflow > Export (API)) to run it")
    return graph


def _run_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.name:
        options["name"] = args.name
    if args.seed is not None:
        options["seed"] = args.seed
    if args.deterministic:
        options["deterministic"] = True
    if args.device:
        options["device"] = args.device
    target: dict[str, Any] = {}
    if args.target:
        target["worker"] = args.target
    if args.devices:
        target["devices"] = [d.strip() for d in args.devices.split(",") if d.strip()]
    if args.memory_gib is not None:
        target["memory_gib"] = args.memory_gib
    if args.queue_wait is not None:
        target["wait"] = args.queue_wait
    if target:
        options["target"] = target
    return options


def _outcome_code(status: str) -> int:
    return EXIT_OK if status == "succeeded" else EXIT_RUN_FAILED


def cmd_run(args: argparse.Namespace) -> int:
    if args.local:
        from .localrun import run_local

        return run_local(args.graph, args)
    try:
        graph = _load_graph(args.graph)
    except ValueError as exc:
        _err(str(exc))
        return EXIT_USAGE
    client = _client_or_exit()
    answer = client.submit(graph, _run_options(args))
    run_id = answer["run_id"]
    if args.mode == "no-wait":
        print(run_id)
        return EXIT_OK
    print(f"queued run {run_id}", file=sys.stderr)
    from .console import ProgressView

    view = ProgressView()
    started = time.monotonic()

    def on_event(ev: dict[str, Any]) -> None:
        etype, payload = ev["type"], ev["payload"]
        if etype == "status" and payload.get("status") in ("assigned", "running") and args.mode == "follow":
            where = payload.get("worker_id") or "this server"
            devs = ", ".join(payload.get("devices") or [])
            if payload.get("status") == "assigned":
                print(f"assigned to {where}" + (f" ({devs})" if devs else ""), file=sys.stderr)
        if etype == "metric" and payload.get("value") is None:
            # NaN/inf (a diverged loss) are stored as JSON null: show them as nan, never crash.
            payload = {**payload, "value": float("nan")}
        if args.mode == "follow" or etype in ("run_warning", "node_error"):
            view.handle(etype, payload)

    try:
        run = client.follow(run_id, on_event)
    except KeyboardInterrupt:
        view.close()
        _err(f"detached from run {run_id}; it keeps running (stop it with: xpufleet cancel {run_id})")
        return 130
    view.close()
    for name, value in (run.get("final_metrics") or {}).items():
        if isinstance(value, int | float) or value is None:  # None: NaN/inf stored as JSON null
            view.metrics[name] = float("nan") if value is None else float(value)
    seconds = None
    if run.get("started_at") and run.get("finished_at"):
        seconds = run["finished_at"] - run["started_at"]
    elif args.mode == "follow":
        seconds = time.monotonic() - started
    print(f"run {run_id}")
    print(view.summary(run["status"], seconds, run.get("error")))
    return _outcome_code(run["status"])


def _fmt_time(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _duration(run: dict[str, Any]) -> str:
    if not run.get("started_at"):
        return "-"
    end = run.get("finished_at") or time.time()
    s = max(0.0, end - run["started_at"])
    return f"{s:.1f}s" if s < 120 else f"{s / 60:.1f}m"


def cmd_runs(args: argparse.Namespace) -> int:
    client = _client_or_exit()
    page = client.runs(status=args.status, name=args.name, worker=args.worker, limit=args.limit)
    if args.json:
        print(json.dumps(page, indent=2))
        return EXIT_OK
    rows = [("ID", "STATUS", "NAME", "WHERE", "DEVICES", "CREATED", "TIME")]
    for r in page["runs"]:
        where = r.get("worker_id") or ("this server" if r.get("placement") == "local" else r.get("target"))
        devices = ",".join(r.get("devices") or r.get("requested") or [])
        rows.append((r["id"][:8], r["status"], (r.get("name") or "")[:24], where or "-", devices or "-",
                     _fmt_time(r.get("created_at")), _duration(r)))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    shown = len(page["runs"])
    if page["total"] > shown:
        print(f"({shown} of {page['total']} runs; --limit N shows more)")
    return EXIT_OK


def _resolve_run_id(client: Client, prefix: str) -> str:
    """A full run id from a prefix (as `runs` prints 8 characters)."""
    try:
        return client.run(prefix)["id"]
    except ApiError as exc:
        if exc.status != 404:
            raise
    matches = [r["id"] for r in client.runs(limit=1000)["runs"] if r["id"].startswith(prefix)]
    if len(matches) == 1:
        return matches[0]
    raise ApiError(404, f"no run {prefix!r}" if not matches else f"{prefix!r} matches {len(matches)} runs")


def cmd_cancel(args: argparse.Namespace) -> int:
    client = _client_or_exit()
    run = client.cancel(_resolve_run_id(client, args.run_id), args.reason)
    state = "cancelled" if run["status"] in TERMINAL_STATUSES else "stopping (cancel requested)"
    print(f"run {run['id']}: {state}")
    return EXIT_OK


# --- the parser ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xpufleet",
        description="XPU Fleet: a run queue for machines full of GPUs (sidecar, workers, predictor).",
        epilog="Exit codes: 0 ok / run succeeded, 1 run failed or cancelled, 2 usage or validation error, "
        "3 sidecar not reachable.",
    )
    parser.add_argument("--version", action="version", version=f"xpufleet {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("start", help="start the sidecar (background unless --foreground)")
    p.add_argument("--foreground", action="store_true", help="stay attached (for systemd); logs to stderr")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free)")
    p.add_argument("--allowed-host", action="append", metavar="NAME",
                   help="another Host header name to answer to (e.g. behind a proxy); repeatable")
    p.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_start)

    p = sub.add_parser("stop", help="stop the sidecar (started runs end interrupted; queued runs stay)")
    p.add_argument("--timeout", type=float, default=SIDECAR_STOP_TIMEOUT_S, help="seconds to wait before killing it")
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("status", help="is the sidecar running; runs and slots")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("run", help="queue a graph (ComfyUI API format) and, by default, wait for it")
    p.add_argument("graph", help="graph file in ComfyUI's API format")
    p.add_argument("--target", help="local (default), any, or a worker name")
    dev = p.add_mutually_exclusive_group()
    dev.add_argument("--device", help="one device: auto, cpu, cuda, cuda:N, xpu:N, mps (falls back if missing)")
    dev.add_argument("--devices", help="a device set, e.g. cuda:0,cuda:1 (every device must be offered)")
    p.add_argument("--memory-gib", type=float, help="memory budget per card (GiB) for shared cards")
    p.add_argument("--queue-wait", dest="queue_wait", action="store_true", default=None,
                   help="target.wait: wait in the queue when the budget does not fit now")
    p.add_argument("--no-queue-wait", dest="queue_wait", action="store_false",
                   help="target.wait false: reject instead of waiting for memory")
    p.add_argument("--name", help="run name")
    p.add_argument("--seed", type=int, help="run seed (overrides the nodes' seeds)")
    p.add_argument("--deterministic", action="store_true", help="deterministic algorithms")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--follow", dest="mode", action="store_const", const="follow",
                      help="show a progress bar and the metrics until the run ends")
    mode.add_argument("--wait", dest="mode", action="store_const", const="wait",
                      help="wait quietly until the run ends (default)")
    mode.add_argument("--no-wait", dest="mode", action="store_const", const="no-wait",
                      help="print the run id and return at once")
    p.add_argument("--local", action="store_true", help="run in this process, without the sidecar")
    p.add_argument("--output-dir", help="with --local: where the run's files go")
    p.set_defaults(func=cmd_run, mode="wait")

    p = sub.add_parser("runs", help="list runs, newest first")
    p.add_argument("--status", help="comma-separated statuses, e.g. queued,running")
    p.add_argument("--name", help="name contains")
    p.add_argument("--worker", help="worker name, or local")
    p.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("cancel", help="cancel a run (a started run stops at its next checkpoint)")
    p.add_argument("run_id", help="run id (or its first characters)")
    p.add_argument("--reason", help="recorded with the cancellation")
    p.set_defaults(func=cmd_cancel)

    for module in ("..predictor.cli", ".agent_cli"):  # parts other issues add; optional
        try:
            mod = importlib.import_module(module, __package__ or "xpufleet.server")
        except ImportError as exc:
            if not (exc.name or "").endswith(module.lstrip(".")):
                _err(f"the {module.lstrip('.')} commands are disabled: {exc}")
            continue
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``xpufleet`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SidecarUnreachable as exc:
        _err(str(exc))
        return EXIT_UNREACHABLE
    except ApiError as exc:
        if exc.status in (401, 403):
            _err(f"the sidecar refused the request ({exc.message}); is the runtime file from another server?")
            return EXIT_UNREACHABLE
        _err(exc.message)
        if isinstance(exc.body, dict) and exc.body.get("node_errors"):
            for nid, entry in exc.body["node_errors"].items():
                for e in entry.get("errors", []):
                    print(f"  node {nid}: {e.get('message')}", file=sys.stderr)
        return EXIT_USAGE if 400 <= exc.status < 500 else EXIT_RUN_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `xpufleet runs | head`: the reader left; say nothing more (Python would print a traceback).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
