"""``xpufleet export GRAPH.json [-o train.py]``: a graph as a standalone PyTorch script (docs/nodes.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ...common import atomic
from .common import EXIT_OK, EXIT_USAGE, err


def add_parser(sub: Any) -> None:
    """The ``export`` command."""
    p = sub.add_parser("export", help="write a graph as a standalone PyTorch script (plain python, no xpufleet)")
    p.add_argument("graph", help="graph file in ComfyUI's API format")
    p.add_argument("-o", "--output", help="the script to write (default: standard output)")
    p.set_defaults(func=run_export)


def run_export(args: Any) -> int:
    """Validate and export ``args.graph``; warnings (``ddp_not_available``) go to stderr and into the script."""
    from ..run.executor import GraphValidationError, format_errors
    from ..run.export import ExportError, export_script
    from .local import load_graph

    try:
        graph = load_graph(args.graph)
        text, warnings = export_script(graph, args.graph)
    except GraphValidationError as exc:
        print(format_errors(exc.response), file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, ExportError) as exc:
        err(str(exc))
        return EXIT_USAGE
    for message in warnings:
        print(f"warning (ddp_not_available): {message}", file=sys.stderr)
    if not args.output or args.output == "-":
        sys.stdout.write(text)
        return EXIT_OK
    out = Path(args.output)
    try:
        atomic.write_text(out, text)
    except OSError as exc:
        err(f"cannot write {out}: {exc.strerror or exc}")
        return EXIT_USAGE
    print(f"wrote {out} ({len(text.splitlines())} lines); run it with: python {out}", file=sys.stderr)
    return EXIT_OK
