"""``xpufleet pair``: a one-time code that pairs a browser with the fleet (docs/security.md).

ComfyUI's ``/xpufleet/api/`` proxy forwards nothing for a browser that is not paired; the plugin's page
asks for this code (or the sidecar's token) once, and keeps what pairing gives in its localStorage.
``xpufleet start`` prints a code too. ``--list`` shows the pairings, ``--revoke ID`` ends one.
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from ...common.client import Client
from .common import EXIT_OK, client_or_exit
from .text import safe


def add_parser(sub: Any) -> None:
    """The ``pair`` command."""
    p = sub.add_parser("pair", help="print a one-time code that pairs a browser (ComfyUI's XPU Fleet page)",
                       description="Print a one-time pairing code: paste it into the 'Pair this browser' prompt "
                                   "of the XPU Fleet panels in ComfyUI. It works once, within 30 minutes; the "
                                   "browser then keeps its pairing until it is revoked.")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--list", action="store_true", help="list the pairings (id, name, created, revoked)")
    group.add_argument("--revoke", metavar="ID", help="revoke a pairing: its browser must pair again")
    p.set_defaults(func=cmd_pair)


def pairing_code_text(client: Client) -> str:
    """The lines that hand a user a fresh pairing code (``xpufleet start`` prints them too)."""
    answer = client.request("POST", "/api/pairing/codes", {})
    minutes = round(answer["ttl_s"] / 60)
    return (f"pairing code for a browser (ComfyUI's XPU Fleet panels ask for it once; works once, within "
            f"{minutes} min; `xpufleet pair` prints a new one):\n  {answer['code']}")


def _when(ts: float | None) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else "-"


def cmd_pair(args: argparse.Namespace) -> int:
    client = client_or_exit()
    if args.revoke:
        client.request("DELETE", f"/api/pairings/{args.revoke}")
        print(f"pairing {args.revoke} revoked")
        return EXIT_OK
    if args.list:
        for p in client.request("GET", "/api/pairings")["pairings"]:
            state = f"revoked {_when(p['revoked_at'])}" if p["revoked_at"] else "live"
            print(safe(f"{p['id']:<16} {_when(p['created_at'])}  {state:<24} {p['name']}"))
        return EXIT_OK
    print(pairing_code_text(client))
    return EXIT_OK
