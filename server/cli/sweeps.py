"""``xpufleet sweep SPEC.yaml`` (queue a sweep, show its table live until every variant has ended) and
``xpufleet sweeps [show ID | cancel ID]``.

Exit codes: 0 every variant succeeded; 1 some variant failed, was cancelled or interrupted; 2 a spec the
server rejects (nothing was queued); 3 no sidecar; 130 detached with Ctrl-C (the sweep keeps running).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...common.client import Client
from .batches import Kind, add_commands, counts_text, follow_queued, manage
from .common import EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, client_or_exit, read_input
from .specs import load_spec, render, write_outputs

ENDED = ("finished", "cancelled")


def add_parser(sub: Any) -> None:
    """The ``sweep`` and ``sweeps`` commands."""
    p = add_commands(sub, SWEEPS, {"start": "queue a sweep from a YAML spec and show its ranked table live",
                                   "verb": "Queue", "table": "the ranked table", "show": "one sweep's ranked table",
                                   "cancel": "cancel: queued variants end now, running ones stop"}, cmd_sweep, cmd_sweeps)
    p.add_argument("--dry-run", action="store_true", help="check and expand only; queue nothing")


def table_lines(sweep: dict[str, Any], limit: int) -> list[str]:
    """The sweep's header line, its ranked table (at most ``limit`` rows) and what was left out."""
    obj = sweep["objective"]
    paths = sweep["parameters"]
    counts = counts_text(sweep)
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


def outcome(sweep: dict[str, Any]) -> int:
    statuses = set(sweep["counts"])
    return EXIT_OK if statuses == {"succeeded"} else EXIT_RUN_FAILED


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
    body = read_input(load_spec, args.spec)
    if body is None:
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
    return follow_queued(client, SWEEPS, answer, args, f"queued sweep {answer['sweep_id']}: {answer['n_runs']} runs")


def cmd_sweeps(args: argparse.Namespace) -> int:
    return manage(SWEEPS, args)


SWEEPS = Kind("sweeps", "sweep", "n_runs", "RUNS", "COUNTS", table_lines, lambda s: s["status"] in ENDED, _finish,
              lambda s: f"sweep {s['id']}: {s['status']} ({counts_text(s)})")
