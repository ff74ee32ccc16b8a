"""``xpufleet estimate GRAPH.json``: the memory budget the Queue on... dialog would suggest (docs/memory.md).

It asks the running sidecar (``POST /api/estimates``): the measured default when a successful run of the
same runtime graph on as many cards has a peak, else the static estimate, every item and the total.
``--local`` builds the static estimate in this process instead (no sidecar, so no measured peaks). Nothing
is applied: to use the estimate, queue the run with ``--memory-gib TOTAL --memory-source estimate``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import EXIT_OK, EXIT_USAGE, client_or_exit, err, read_input


def add_parser(sub: Any) -> None:
    p = sub.add_parser("estimate", help="the memory budget a graph needs per card (measured peak or static estimate)")
    p.add_argument("graph", help="graph file in ComfyUI's API format")
    p.add_argument("--target", help="local (default), any, or a worker name: the cards a run would get")
    dev = p.add_mutually_exclusive_group()
    dev.add_argument("--device", help="one device: auto, cpu, cuda, cuda:N, xpu:N, mps")
    dev.add_argument("--devices", help="a device set, e.g. cuda:0,cuda:1 (the estimate is per card)")
    p.add_argument("--local", action="store_true", help="the static estimate in this process (no sidecar, no peaks)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_estimate)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.device:
        options["device"] = args.device
    target: dict[str, Any] = {}
    if args.target:
        target["worker"] = args.target
    if args.devices:
        target["devices"] = [d.strip() for d in args.devices.split(",") if d.strip()]
    if target:
        options["target"] = target
    return options


def _local(graph: dict[str, Any], n_cards: int) -> dict[str, Any]:
    from ...predictor.estimate import estimate_graph
    from ..ledger.budget import suggest

    return {**suggest(graph, None, estimate=estimate_graph, n_cards=n_cards).to_json(), "notes": [
        "built here without the sidecar: measured peaks were not looked up"], "applied": False}


def render(answer: dict[str, Any]) -> list[str]:
    """The suggestion as the dialog lists it: every item, the total, what to send."""
    n = answer.get("n_cards") or 1
    per = f"per card ({n} cards)" if n > 1 else "per card"
    lines = []
    if answer["source"] == "measured":
        what = "simulated peak" if answer.get("peak_source") == "simulated" else "peak"
        lines.append(f"measured: the {what} of run {str(answer['from_run'])[:8]} of the same graph on "
                     f"{n} card{'s' if n != 1 else ''} + 20%, {per}:")
    elif answer["source"] == "estimate":
        lines.append(f"static estimate{' (rough)' if answer.get('rough') else ''}, {per}:")
    else:
        lines.append("no estimate:")
    width = max([len(str(i["name"])) for i in answer.get("items") or []] + [5])
    for item in answer.get("items") or []:
        lines.append(f"  {item['name']:<{width}}  {item['gib']:>8.3f} GiB  {item.get('label', '')}")
    if answer.get("total_gib") is not None:
        lines.append(f"  {'total':<{width}}  {answer['total_gib']:>8.3f} GiB")
    for reason in answer.get("reasons") or []:
        lines.append(f"  rough: {reason}")
    for note in answer.get("notes") or []:
        lines.append(f"  note: {note}")
    if answer["source"] == "measured":
        lines.append("queue it without --memory-gib: the server applies this default itself")
    elif answer.get("budget_gib") is not None:
        lines.append(f"to use it: xpufleet run GRAPH --memory-gib {answer['budget_gib']} --memory-source estimate "
                     f"(not applied unless you send it)")
    elif answer["source"] == "estimate":
        lines.append("rough: the budget field stays empty; declare --memory-gib yourself")
    return lines


def cmd_estimate(args: argparse.Namespace) -> int:
    from .runs import _load_graph

    graph = read_input(_load_graph, args.graph)
    if graph is None:
        return EXIT_USAGE
    if args.local:
        n_cards = len([d for d in (args.devices or "").split(",") if d.strip()]) or 1
        try:
            answer = _local(graph, n_cards)
        except ValueError as exc:
            err(str(exc))
            return EXIT_USAGE
    else:
        answer = client_or_exit().request("POST", "/api/estimates", {"graph": graph, "options": _options(args)})
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print("\n".join(render(answer)))
    return EXIT_OK
