"""The ``xpufleet`` command (docs/sidecar.md).

``xpufleet start [--foreground] [--host H] [--port P]``, ``stop``, ``status``;
``xpufleet run GRAPH.json [--target NAME|any|local] [--device D | --devices D1,D2] [--memory-gib G]
[--name N] [--seed S] [--follow | --wait | --no-wait] [--local]``; ``xpufleet runs``; ``xpufleet cancel``;
``xpufleet estimate GRAPH.json [--target ...] [--devices ...] [--local] [--json]``;
``xpufleet export GRAPH.json [-o train.py]``;
``xpufleet serve SPEC.json`` and ``xpufleet services ...`` (inference units);
``xpufleet sweep SPEC.yaml`` / ``sweeps``, ``xpufleet study SPEC.yaml`` / ``studies``; ``agent``, ``workers``, ``predict``.

Exit codes a script can rely on:

* 0: done; for ``run --wait/--follow``, the run succeeded;
* 1: the run failed, was cancelled or interrupted (or the server could not start);
* 2: usage or validation error (bad arguments, a graph or target the server rejects with 400);
* 3: the sidecar is not reachable (not started, stopped, or its token was refused).
"""

from __future__ import annotations

import argparse
import os
import sys

from ...common.client import ApiError, SidecarUnreachable
from ...constants import VERSION
from . import agent as agent_cli
from . import estimate as estimate_cli
from . import export as export_cli
from . import pair as pair_cli
from . import pools as pools_cli
from . import predict as predictor_cli
from . import runs as runs_cli
from . import services as services_cli
from . import sidecar as sidecar_cli
from . import studies as studies_cli
from . import sweeps as sweeps_cli
from . import ui as ui_cli
from . import workers as workers_cli
from .common import EXIT_RUN_FAILED, EXIT_UNREACHABLE, EXIT_USAGE, err
from .text import safe

# Every command module, in the order `xpufleet --help` lists them.
COMMAND_MODULES = (sidecar_cli, runs_cli, estimate_cli, agent_cli, workers_cli, pools_cli, services_cli,
                   sweeps_cli, studies_cli, export_cli, predictor_cli, ui_cli, pair_cli)


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
    for module in COMMAND_MODULES:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``xpufleet`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SidecarUnreachable as exc:
        err(str(exc))
        return EXIT_UNREACHABLE
    except ApiError as exc:
        if exc.status in (401, 403):
            err(f"the sidecar refused the request ({exc.message}); is the runtime file from another server?")
            return EXIT_UNREACHABLE
        err(exc.message)
        # A graph's problems are listed in the message, one per line; list them only when it does not.
        if isinstance(exc.body, dict) and exc.body.get("node_errors") and "\n" not in exc.message:
            for nid, entry in exc.body["node_errors"].items():
                for e in entry.get("errors", []):
                    print(safe(f"  node {nid}: {e.get('message')}"), file=sys.stderr)
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
