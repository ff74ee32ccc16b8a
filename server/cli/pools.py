"""``xpufleet pools ...``: one-shot worker pools (docs/workers.md) on the command line.

``pools create NAME`` prints the shared credential and the command each instance runs (a batch job, a
cloud instance's start-up script); ``pools`` lists the pools with their live instances; ``revoke``
stops the credential working, ``reissue`` gives a new one, ``remove`` deletes the pool.
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from ...common.client import Client
from .common import EXIT_OK, command_group
from .pools_slurm import add_export_parser, add_slurm_options, print_jobs, run_export, slurm_body


def add_parser(subparsers: Any) -> None:
    """Add ``pools ...`` to the ``xpufleet`` command's subparsers."""
    p, sub, json_opt = command_group(
        subparsers, "pools", "one-shot worker pools: a shared credential for many instances",
        "One-shot worker pools of the running sidecar", ("create", "revoke", "reissue", "remove", "export"),
        "every pool with its live instances")
    for cmd, text in (("create", "a new pool: its shared credential and the command instances run"),
                      ("revoke", "the pool's credential stops working (no new instance joins)"),
                      ("reissue", "a new credential for the pool (the old one stops working)"),
                      ("remove", "delete the pool; runs waiting for it fail")):
        c = sub.add_parser(cmd, help=text, parents=[json_opt])
        c.add_argument("name", help="pool name")
        if cmd == "create":
            add_slurm_options(c)
            c.add_argument("--comfyui", metavar="PATH", help="the ComfyUI folder on the instances' machines: the "
                           "pool takes ComfyUI workflows (its agents start with --comfyui PATH)")
    add_export_parser(sub)
    p.set_defaults(func=run_pools)


def run_pools(args: argparse.Namespace) -> int:
    """``xpufleet pools ...`` through the running sidecar's API."""
    client = Client.from_home()
    cmd = getattr(args, "pools_command", None) or "list"
    name = urllib.parse.quote(getattr(args, "name", "") or "")
    if cmd == "list":
        out = client.request("GET", "/api/pools")
    elif cmd == "create":
        comfyui = {"comfyui": args.comfyui} if getattr(args, "comfyui", None) else {}
        out = client.request("POST", "/api/pools", {"name": args.name, **slurm_body(args), **comfyui})
    elif cmd == "export":
        return run_export(args, client)
    elif cmd in ("revoke", "reissue"):
        out = client.request("POST", f"/api/pools/{name}/{cmd}")
    else:
        out = client.request("DELETE", f"/api/pools/{name}")
    if args.json:
        print(json.dumps(out, indent=2))
    elif cmd in ("create", "reissue"):
        print(f"pool {out['name']}: on each instance (one run each, then it exits), run:\n  {out['command']}\n"
              f"(the credential is shown once; `xpufleet pools reissue {out['name']}` replaces it)")
    elif cmd == "list":
        _print(out["pools"])
    elif cmd == "revoke":
        print(f"pool {out['name']}: credential revoked; {len(out['instances'])} live instance(s) finish their runs")
    else:
        print(f"pool {out['removed']} removed ({len(out['failed_runs'])} waiting run(s) failed)")
    return EXIT_OK


def _print(pools: list[dict[str, Any]]) -> None:
    if not pools:
        print("no pools yet: `xpufleet pools create NAME`")
        return
    for p in pools:
        state = " (credential revoked)" if p["revoked"] else ""
        kind = " [slurm]" if p.get("kind") == "slurm" else ""
        print(f"{p['name']}{kind}{state}: {p['idle']} idle, {p['busy']} busy, {p['queued']} run(s) waiting")
        print_jobs(p)
        for i in p["instances"]:
            run = f", run {i['one_shot_taken'][:8]}" if i.get("one_shot_taken") else ""
            print(f"  {i['name']}: {i['status']}{run}")
