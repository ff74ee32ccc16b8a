"""``xpufleet ui``: a one-time login link for the sidecar's standalone page (docs/comfyui.md).

The link carries a key in its fragment (``http://127.0.0.1:8765/#login=KEY``) that works once, within
five minutes; the page trades it for a browser session (server/sidecar/routes/ui.py says why).
"""

from __future__ import annotations

import argparse
import webbrowser
from typing import Any

from .common import EXIT_OK, client_or_exit


def add_parser(sub: Any) -> None:
    """The ``ui`` command."""
    p = sub.add_parser("ui", help="print a one-time login link for the standalone page (Runs, Workers)",
                       description="Print a one-time login link for the sidecar's standalone page. It works "
                                   "once, within five minutes; run the command again for another browser.")
    p.add_argument("--open", action="store_true", help="also open it in this machine's web browser")
    p.set_defaults(func=cmd_ui)


def cmd_ui(args: argparse.Namespace) -> int:
    answer = client_or_exit().request("POST", "/api/ui/login-links", {})
    print(answer["url"])
    if args.open:
        webbrowser.open(answer["url"])
    return EXIT_OK
