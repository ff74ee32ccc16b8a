"""``xpufleet workers ...``: the Workers panel on the command line (list, drain, remove, join tokens)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from typing import Any

from ...common.client import Client
from .common import EXIT_OK, EXIT_RUN_FAILED, command_group
from .text import safe


def add_parser(subparsers: Any) -> None:
    """Add ``workers ...`` to the ``xpufleet`` command's subparsers."""
    _add_workers_parser(subparsers)


def _add_workers_parser(subparsers: Any) -> None:
    """``xpufleet workers [list|drain|undrain|remove|reissue|join-token|rejected|mode]`` (docs/sidecar.md)."""
    w, wsub, json_opt = command_group(
        subparsers, "workers", "list and manage the sidecar's workers", "Workers known to the running sidecar",
        ("drain", "undrain", "remove", "reissue", "join-token", "rejected", "mode", "add-ssh", "disable", "enable"),
        "every worker with status, devices and runs")
    for cmd, text in (("drain", "no new runs on this worker"), ("undrain", "take new runs again"),
                      ("remove", "revoke, disconnect, fail the runs waiting for it"),
                      ("reissue", "a new credential for a joined worker")):
        c = wsub.add_parser(cmd, help=text, parents=[json_opt])
        c.add_argument("name", help="worker name")
    j = wsub.add_parser("join-token", help="a one-time join token and the command for a remote machine",
                        parents=[json_opt])
    j.add_argument("--name", help="bind the token to this worker name")
    wsub.add_parser("rejected", help="refused agent connections with their reason", parents=[json_opt])
    a = wsub.add_parser("add-ssh", parents=[json_opt],
                        help="add an SSH worker: reach user@host through your OpenSSH set-up, install xpufleet "
                             "there and start its agent; its connection comes back through the ssh tunnel")
    a.add_argument("name", help="worker name")
    a.add_argument("host", help="user@host (or a Host of your ~/.ssh/config)")
    a.add_argument("--port", type=int, help="the host's sshd port (default: ssh's, usually 22)")
    a.add_argument("--identity", help="private key file on this machine (default: ssh's own choice)")
    a.add_argument("--python", help="the host's Python with xpufleet's dependencies (default python3)")
    a.add_argument("--remote-dir", help="the worker's folder on the host (default ~/.xpufleet-ssh/NAME)")
    a.add_argument("--devices", help="cards its agent offers, e.g. cuda:0,cuda:1 (default: all)")
    a.add_argument("--mount", action="append", metavar="LABEL=FOLDER", help="a storage mount on the host")
    a.add_argument("--simulate", metavar="SPEC", help="simulated CUDA cards (tests and demos)")
    a.add_argument("--no-wait", action="store_true", help="return at once instead of waiting until it is Online")
    a.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for Online (default 180)")
    for cmd, text in (("disable", "SSH worker: stop its agent and end ssh (listed as Disabled)"),
                      ("enable", "SSH worker: connect it again")):
        c = wsub.add_parser(cmd, help=text, parents=[json_opt])
        c.add_argument("name", help="worker name")
    m = wsub.add_parser("mode", help="a card's mode: exclusive (default) or shared by memory", parents=[json_opt])
    m.add_argument("name", help="worker name")
    m.add_argument("device", help="the worker's card, e.g. cuda:1")
    m.add_argument("mode", choices=("exclusive", "shared"))
    w.set_defaults(func=run_workers)


def run_workers(args: argparse.Namespace) -> int:
    """``xpufleet workers ...`` through the running sidecar's API (errors: the CLI's exit codes)."""
    client = Client.from_home()
    cmd = getattr(args, "workers_command", None) or "list"
    if cmd == "list":
        out = client.request("GET", "/api/workers")
    elif cmd in ("drain", "undrain", "reissue"):
        out = client.request("POST", f"/api/workers/{urllib.parse.quote(args.name)}/{cmd}")
    elif cmd == "remove":
        out = client.request("DELETE", f"/api/workers/{urllib.parse.quote(args.name)}")
    elif cmd == "join-token":
        out = client.request("POST", "/api/workers/join-tokens", {"name": args.name} if args.name else {})
    elif cmd == "add-ssh":
        return _add_ssh(client, args)
    elif cmd in ("disable", "enable"):
        out = client.request("POST", f"/api/workers/{urllib.parse.quote(args.name)}/{cmd}")
    elif cmd == "mode":
        out = client.request("PUT", f"/api/workers/{urllib.parse.quote(args.name)}/devices/"
                                    f"{urllib.parse.quote(args.device)}/mode", {"mode": args.mode})
    else:
        out = client.request("GET", "/api/workers/rejected")
    # Every text from the server goes through `safe` (a worker name, a rejection reason, an agent's
    # environment can hold anything); JSON escapes control characters itself.
    if args.json:
        print(json.dumps(out, indent=2))
    elif cmd == "list":
        _print_workers(out["workers"])
    elif cmd == "join-token" or (cmd == "reissue" and out.get("command")):
        print(f"on the worker machine, run:\n  {safe(out['command'])}\n(one-time; expires "
              f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(out['expires_at']))})")
    elif cmd == "reissue":
        print(f"worker {safe(out['name'])}: new credential delivered; the old one no longer works")
    elif cmd == "rejected":
        for r in out["rejected"] or []:
            print(f"{time.strftime('%H:%M:%S', time.localtime(r['ts']))} {safe(r.get('name') or '?')} "
                  f"from {safe(r.get('address') or '?')}: {safe(r['reason'])}")
        if not out["rejected"]:
            print("no rejected connections")
    elif cmd == "mode":
        print(f"worker {out['worker']}: {out['device']} is {out['mode']}"
              + (" (runs need a budget there: target.memory_gib)" if out["mode"] == "shared" else ""))
    elif cmd == "remove":
        print(f"worker {safe(out['removed'])} removed ({len(out['failed_runs'])} waiting run(s) failed, "
              f"{len(out['interrupted_runs'])} running run(s) interrupted)")
        cleanup = out.get("remote_cleanup")
        if cleanup is not None:
            print(f"  on the host: {cleanup.get('dir') or ''} "
                  + ("deleted" if cleanup.get("removed") else f"not deleted: {cleanup.get('detail')}"))
    else:
        print(safe(f"worker {out['name']}: {out['status']}" + (f" ({out['status_reason']})" if out["status_reason"] else "")))
    return EXIT_OK


def _add_ssh(client: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name, "host": args.host}
    for key in ("port", "identity", "python", "remote_dir", "devices", "simulate"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.mount:
        body["mounts"] = list(args.mount)
    out = client.request("POST", "/api/workers/ssh", body)
    deadline = time.monotonic() + args.timeout
    path = f"/api/workers/{urllib.parse.quote(args.name)}"
    shown = ""
    while not args.no_wait and out["status"] != "Online" and time.monotonic() < deadline:
        line = f"{out['status']}: {out['status_reason']}"
        if line != shown and not args.json:
            print(f"worker {args.name}: {line}", file=sys.stderr)
            shown = line
        time.sleep(0.5)  # the Workers data has no push channel
        out = client.request("GET", path)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"worker {args.name}: {out['status']}" + (f" ({out['status_reason']})" if out["status_reason"] else ""))
    return EXIT_OK if args.no_wait or out["status"] == "Online" else EXIT_RUN_FAILED


def _print_workers(workers: list[dict[str, Any]]) -> None:
    if not workers:
        print("no workers yet: `xpufleet agent start` on this machine, or `xpufleet workers join-token`")
        return
    for w in workers:
        reason = f" ({safe(w['status_reason'])})" if w["status_reason"] else ""
        version = safe(w["version"] or "?")
        if w["version_match"] is False:
            version += f" (server {w['server_version']})"
        if w["heartbeat_age_s"] is not None:
            seen = f"heartbeat {w['heartbeat_age_s']} s ago"
        elif w.get("last_seen_age_s") is not None:
            seen = f"last seen {w['last_seen_age_s']} s ago"
        else:
            seen = "never seen"
        print(f"{safe(w['name'])}: {safe(w['status'])}{reason}, version {version}, {seen}")
        env = w.get("environment") or {}
        if env:
            parts = [env.get("hostname"), env.get("os"), env.get("python") and f"Python {env['python']}",
                     env.get("torch") and f"torch {env['torch']}",
                     "simulated cards" if env.get("simulated") else None]
            print("  environment: " + ", ".join(safe(x) for x in parts if x))
        for d in w["devices"]:
            mem = ""
            if d["total_gib"] is not None:
                free = "?" if d["free_gib"] is None else f"{d['free_gib']:.1f}"
                mem = f" {free}/{d['total_gib']:.1f} GiB free" + (" (last reported)" if d["last_reported"] else "")
            sim = " [simulated]" if d["simulated"] else ""
            same = "".join(f", same card as {s['device']} on {s['provider']}" for s in d["same_card_as"])
            print(f"  {safe(d['name'])}{sim}:{mem}, slots {d['slots_used']}/{d['slot_limit'] if d['slot_limit'] is not None else '-'}"
                  f", {safe(d['mode'])}{safe(same)}")
            for line in memory_lines(d.get("memory")):
                print(f"    {safe(line)}")
        if w.get("ssh"):
            ssh = w["ssh"]
            print(safe(f"  via ssh {ssh['host']}" + (f" -p {ssh['port']}" if ssh.get("port") else "")
                  + f", folder {ssh['remote_dir']}: {ssh.get('state')}" + (f" ({ssh['detail']})" if ssh.get("detail") else "")))
        if w.get("mounts"):
            print(safe("  mounts: " + ", ".join(f"{m['label']}={m['folder']}" for m in w["mounts"])))
        for r in w["runs"]:
            budget = f", budget {r['budget_gib']:g} GiB ({r['budget_source']})" if r.get("budget_gib") is not None else ""
            use = (r.get("memory_in_use") or {}).get("devices") or {}
            used = "".join(f", uses {v:g} GiB on {k} (NVML)" for k, v in use.items())
            print(safe(f"  run {r['id'][:8]} {r['status']} on {', '.join(r['devices'])}{budget}{used}"))
        if w.get("last_rejection"):
            print(f"  last rejected: {safe(w['last_rejection']['reason'])}")


def memory_lines(card: dict[str, Any] | None) -> list[str]:
    """A card shared by memory, as the Workers panel draws it: in use, reserved, running, free for new budgets
    after the CUDA context, the runs on it."""
    if not card:
        return []
    if not card.get("admits_by_memory"):
        return [card["note"]] if card.get("note") else []
    out = []
    if card.get("total_gib") is not None:
        free = card["free_for_budgets_gib"]
        out.append(f"memory: {card['in_use_gib']:g} GiB in use, {card['reserved_gib']:g} reserved, "
                   f"{card['running_gib']:g} running (budgets + {card['context_gib']:g} GiB CUDA context each), "
                   f"{free:g} GiB free for a new budget")
    if card.get("note"):
        out.append(card["note"])
    if card.get("held_for"):
        out.append(card["held_for"]["text"])
    for r in card.get("runs") or []:
        budget = "no budget" if r["budget_gib"] is None else f"budget {r['budget_gib']:g} GiB"
        used = f", uses {r['in_use_gib']:g} GiB (NVML)" if r.get("in_use_gib") is not None else ""
        out.append(f"run {r['id'][:8]} {r['state']}, {budget}{used}")
    return out
