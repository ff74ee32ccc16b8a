"""``xpufleet sweep SPEC.yaml`` (queue a sweep, show its table live until every variant has ended) and
``xpufleet sweeps [show ID | cancel ID]``.

Exit codes: 0 every variant succeeded; 1 some variant failed, was cancelled or interrupted; 2 a spec the
server rejects (nothing was queued); 3 no sidecar; 130 detached with Ctrl-C (the sweep keeps running).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ...common.client import Client
from .common import EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, client_or_exit, err
from .specs import LiveTable, item_path, load_spec, render, resolve_id, write_outputs
from .specs import follow as follow_item

ENDED = ("finished", "cancelled")


def add_parser(sub: Any) -> None:
    """The ``sweep`` and ``sweeps`` commands."""
    p = sub.add_parser("sweep", help="queue a sweep from a YAML spec and show its ranked table live",
                       description="Queue a sweep (the body of POST /api/sweeps written as YAML; graph may be a "
                                   "path to a graph JSON file next to the spec) and follow it.")
    p.add_argument("spec", help="sweep spec (YAML)")
    p.add_argument("--dry-run", action="store_true", help="check and expand only; queue nothing")
    p.add_argument("--no-wait", action="store_true", help="print the sweep id and return")
    p.add_argument("--csv", metavar="FILE", help="write the final ranked table as CSV")
    p.add_argument("--json", action="store_true", help="print the final sweep as JSON")
    p.set_defaults(func=cmd_sweep)

    s = sub.add_parser("sweeps", help="list sweeps, show one, cancel one")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    ssub = s.add_subparsers(dest="sweeps_command", metavar="{list,show,cancel}")
    ssub.add_parser("list", help="sweeps, newest first")
    show = ssub.add_parser("show", help="one sweep's ranked table")
    show.add_argument("sweep_id")
    show.add_argument("--csv", metavar="FILE", help="write the ranked table as CSV ('-': standard output)")
    show.add_argument("--watch", action="store_true", help="follow it live until it ends")
    cancel = ssub.add_parser("cancel", help="cancel: queued variants end now, running ones stop")
    cancel.add_argument("sweep_id")
    cancel.add_argument("--reason", help="recorded on each cancelled run")
    s.set_defaults(func=cmd_sweeps)


def _path(item_id: str, tail: str = "") -> str:
    return item_path("sweeps", item_id, tail)


def table_lines(sweep: dict[str, Any], limit: int) -> list[str]:
    """The sweep's header line, its ranked table (at most ``limit`` rows) and what was left out."""
    obj = sweep["objective"]
    paths = sweep["parameters"]
    counts = ", ".join(f"{n} {s}" for s, n in sorted(sweep["counts"].items()))
    lines = [f"sweep {sweep['name']} ({sweep['id'][:8]}): {sweep['status']}; {sweep['n_runs']} runs: {counts}; "
             f"{obj['direction']} {obj['metric']}"]
    header = ["RANK", "#", *paths, "SEED", "STATUS", obj["metric"].upper(), "WORKER", "DEVICES", "QUEUE"]
    shown = sweep["table"][:limit]
    rows = [[r["rank"], r["variant"], *[r["parameters"].get(p) for p in paths], r["seed"], r["status"], r["metric"],
             r["worker_id"] or ("this server" if r["devices"] else None), r["devices"], r["queue_key"]]
            for r in shown]
    lines += render(header, rows)
    if len(sweep["table"]) > len(shown):
        lines.append(f"... {len(sweep['table']) - len(shown)} more (xpufleet sweeps show {sweep['id'][:8]} --csv -)")
    return lines


def follow(client: Client, sweep_id: str, view: LiveTable) -> dict[str, Any]:
    """Long-poll the sweep, redrawing its table, until it has ended."""
    return follow_item(client, "sweeps", sweep_id, view, table_lines, lambda item: item["status"] in ENDED)


def outcome(sweep: dict[str, Any]) -> int:
    statuses = set(sweep["counts"])
    return EXIT_OK if statuses == {"succeeded"} else EXIT_RUN_FAILED


def _resolve(client: Client, prefix: str) -> str:
    return resolve_id(client, "sweeps", prefix)


def _finish(client: Client, sweep: dict[str, Any], args: argparse.Namespace) -> int:
    write_outputs(client, "sweeps", sweep, "table.csv", args)
    best = sweep.get("best")
    if best is not None:
        values = ", ".join(f"{k}={v}" for k, v in best["parameters"].items())
        seed = f", seed {best['seed']}" if best["seed"] is not None else ""
        print(f"best: variant {best['variant']} ({values}{seed}): {sweep['objective']['metric']} {best['metric']:.6g} "
              f"(run {best['run_id'][:8]} on {best['worker_id'] or 'this server'})", file=sys.stderr)
    return outcome(sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    try:
        body = load_spec(args.spec)
    except ValueError as exc:
        err(str(exc))
        return EXIT_USAGE
    client = client_or_exit()
    if args.dry_run:
        plan = client.request("POST", "/api/sweeps", body, params={"dry_run": "true"})
        print(f"sweep {plan['name']}: {plan['n_runs']} runs would be queued")
        paths = sorted({p for v in plan["variants"] for p in v["parameters"]})
        for line in render(["#", *paths, "SEED", "QUEUE"], [[v["variant"], *[v["parameters"].get(p) for p in paths],
                                                           v["seed"], v["queue_key"]] for v in plan["variants"]]):
            print(line)
        return EXIT_OK
    answer = client.request("POST", "/api/sweeps", body)
    sweep_id = answer["sweep_id"]
    if args.no_wait:
        print(sweep_id)
        return EXIT_OK
    print(f"queued sweep {sweep_id}: {answer['n_runs']} runs", file=sys.stderr)
    try:
        sweep = follow(client, sweep_id, LiveTable())
    except KeyboardInterrupt:
        err(f"detached from sweep {sweep_id}; it keeps running (stop it with: xpufleet sweeps cancel {sweep_id})")
        return 130
    return _finish(client, sweep, args)


def cmd_sweeps(args: argparse.Namespace) -> int:
    client = client_or_exit()
    command = args.sweeps_command or "list"
    if command == "list":
        page = client.request("GET", "/api/sweeps", params={"limit": 100})
        if args.json:
            print(json.dumps(page, indent=2))
            return EXIT_OK
        rows = [[s["id"][:8], s["name"], s["status"], s["n_runs"],
                 ", ".join(f"{n} {st}" for st, n in sorted(s["counts"].items())), s["objective"]["metric"]]
                for s in page["sweeps"]]
        for line in render(["ID", "NAME", "STATUS", "RUNS", "COUNTS", "OBJECTIVE"], rows):
            print(line)
        return EXIT_OK
    sweep_id = _resolve(client, args.sweep_id)
    if command == "cancel":
        sweep = client.request("POST", _path(sweep_id, "/cancel"), {"reason": args.reason} if args.reason else None)
        print(f"sweep {sweep['id']}: {sweep['status']} ({', '.join(f'{n} {s}' for s, n in sorted(sweep['counts'].items()))})")
        return EXIT_OK
    if args.watch:
        sweep = follow(client, sweep_id, LiveTable())
    else:
        sweep = client.request("GET", _path(sweep_id))
        if not (args.json or args.csv == "-"):
            for line in table_lines(sweep, 10**6):
                print(line)
    code = _finish(client, sweep, args)
    return code if sweep["status"] in ENDED else EXIT_OK
