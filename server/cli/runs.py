"""``xpufleet run | runs | cancel``: queueing runs and following them."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ...common.client import ApiError, Client
from ...constants import RUN_SOURCES, TERMINAL_STATUSES
from .common import EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, client_or_exit, err
from .text import safe


def add_parser(sub: Any) -> None:
    """The ``run``, ``runs`` and ``cancel`` commands."""
    p = sub.add_parser("run", help="queue a graph (ComfyUI API format) and, by default, wait for it")
    p.add_argument("graph", help="graph file in ComfyUI's API format")
    p.add_argument("--target", help="local (default), any, or a worker name")
    p.add_argument("--pool", help="a one-shot worker pool: the run goes to an idle instance of it")
    p.add_argument("--record-outputs", nargs="?", const="keep", choices=("keep", "upload"),
                   help="record each node's outputs (kept where the run runs; 'upload': also copied to the "
                        "sidecar at the end); read them with GET /api/runs/ID/outputs")
    dev = p.add_mutually_exclusive_group()
    dev.add_argument("--device", help="one device: auto, cpu, cuda, cuda:N, xpu:N, mps (falls back if missing)")
    dev.add_argument("--devices", help="a device set, e.g. cuda:0,cuda:1 (every device must be offered)")
    p.add_argument("--spread", action="append", type=spread_entry, metavar="WORKER:DEVICES",
                   help="ddp across workers: this worker's cards, e.g. --spread a:cuda:0 --spread b:cuda:0,cuda:1 "
                        "(repeat, in rank order; the graph's TrainingLoop uses strategy ddp)")
    p.add_argument("--memory-gib", type=float, help="memory budget per card (GiB) for shared cards")
    p.add_argument("--memory-source", choices=("user", "estimate", "measured"),
                   help="where --memory-gib came from: user (typed, default, never changed), estimate (from "
                        "`xpufleet estimate`: raised to a larger measured peak + 20%%)")
    p.add_argument("--queue-wait", dest="queue_wait", action="store_true", default=None,
                   help="target.wait: wait in the queue when the budget does not fit now")
    p.add_argument("--no-queue-wait", dest="queue_wait", action="store_false",
                   help="target.wait false: reject instead of waiting for memory")
    p.add_argument("--name", help="run name")
    p.add_argument("--seed", type=run_seed, help="run seed, 0 or more (overrides every node's seed; leave it out "
                                                 "to keep the nodes' own seeds, where -1 means unseeded)")
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
    p.add_argument("--source", choices=RUN_SOURCES,
                   help="api (queued: CLI, Queue on..., sweeps) or canvas (ComfyUI's own Run, recorded)")
    p.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("cancel", help="cancel a run (a started run stops at its next checkpoint)")
    p.add_argument("run_id", help="run id (or its first characters)")
    p.add_argument("--reason", help="recorded with the cancellation")
    p.set_defaults(func=cmd_cancel)



SEED_MAX = 2**63 - 1


def run_seed(text: str) -> int:
    """``--seed``: a whole number from 0 to 2^63-1, refused in the CLI's words (exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"{value}: a run's seed is 0 or more and overrides every node's seed; -1 (unseeded) is a node "
            f"setting: leave --seed out to keep the nodes' own seeds")
    if value > SEED_MAX:
        raise argparse.ArgumentTypeError(f"{value}: at most 2^63-1")
    return value


def _load_graph(path: str) -> dict[str, Any]:
    from .local import load_graph

    graph = load_graph(path)
    if isinstance(graph.get("nodes"), list) and "links" in graph:
        raise ValueError(f"{path} is a UI workflow; export it in API format (Workflow > Export (API)) to run it")
    return graph


def spread_entry(text: str) -> dict[str, Any]:
    """``--spread a:cuda:0,cuda:1`` -> ``{"worker": "a", "devices": ["cuda:0", "cuda:1"]}`` (the server
    checks the names; a malformed entry is a usage error, exit 2)."""
    worker, sep, devices = text.partition(":")
    names = [d.strip() for d in devices.split(",") if d.strip()]
    if not sep or not worker.strip() or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: write WORKER:DEVICES, e.g. a:cuda:0 or b:cuda:0,cuda:1")
    return {"worker": worker.strip(), "devices": names}


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
    if getattr(args, "record_outputs", None):
        options["record_outputs"] = "upload" if args.record_outputs == "upload" else True
    target: dict[str, Any] = {}
    if args.target:
        target["worker"] = args.target
    if getattr(args, "pool", None):
        target["pool"] = args.pool
    if args.devices:
        target["devices"] = [d.strip() for d in args.devices.split(",") if d.strip()]
    if args.memory_gib is not None:
        target["memory_gib"] = args.memory_gib
    if getattr(args, "memory_source", None):
        target["memory_source"] = args.memory_source
    if args.queue_wait is not None:
        target["wait"] = args.queue_wait
    if getattr(args, "spread", None):
        target["spread"] = args.spread
    if target:
        options["target"] = target
    return options


def _outcome_code(status: str) -> int:
    return EXIT_OK if status == "succeeded" else EXIT_RUN_FAILED


def cmd_run(args: argparse.Namespace) -> int:
    if args.local:
        from .local import run_local

        return run_local(args.graph, args)
    try:
        graph = _load_graph(args.graph)
    except ValueError as exc:
        err(str(exc))
        return EXIT_USAGE
    client = client_or_exit()
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
                print(safe(f"assigned to {where}" + (f" ({devs})" if devs else "")), file=sys.stderr)
        if etype == "metric" and payload.get("value") is None:
            # NaN/inf (a diverged loss) are stored as JSON null: show them as nan, never crash.
            payload = {**payload, "value": float("nan")}
        if args.mode == "follow" or etype in ("run_warning", "node_error"):
            view.handle(etype, payload)

    try:
        run = client.follow(run_id, on_event)
    except KeyboardInterrupt:
        view.close()
        err(f"detached from run {run_id}; it keeps running (stop it with: xpufleet cancel {run_id})")
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
    client = client_or_exit()
    page = client.runs(status=args.status, name=args.name, worker=args.worker, limit=args.limit, source=args.source)
    if args.json:
        print(json.dumps(page, indent=2))
        return EXIT_OK
    rows = [("ID", "STATUS", "NAME", "WHERE", "DEVICES", "CREATED", "TIME")]
    for r in page["runs"]:
        where = r.get("worker_id") or {"local": "this server", "canvas": "ComfyUI canvas"}.get(r.get("placement") or "",
                                                                                             r.get("target"))
        devices = ",".join(r.get("devices") or r.get("requested") or [])
        rows.append((safe(r["id"][:8]), safe(r["status"]), safe((r.get("name") or "")[:24]), safe(where or "-"),
                     safe(devices or "-"), _fmt_time(r.get("created_at")), _duration(r)))
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
    client = client_or_exit()
    run = client.cancel(_resolve_run_id(client, args.run_id), args.reason)
    state = "cancelled" if run["status"] in TERMINAL_STATUSES else "stopping (cancel requested)"
    print(f"run {safe(run['id'])}: {state}")
    return EXIT_OK
