"""What ``xpufleet sweep``/``sweeps`` and ``xpufleet study``/``studies`` do alike (docs/sweeps.md): follow a
queued batch until it ends, and list, show or cancel one. Each command module describes its kind once
(:class:`Kind`); the differences (the table, when it has ended, the exit code) are its functions."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...common.client import Client
from .common import EXIT_OK, client_or_exit, command_group, err
from .specs import LiveTable, item_path, render, resolve_id
from .specs import follow as follow_item

Item = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """A sweep or a study, as the CLI shows it."""

    collection: str  # the API's collection and the management command: "sweeps", "studies"
    noun: str  # "sweep", "study": the answer's ``<noun>_id`` and the messages
    size_field: str  # the listing's size column: "n_runs", "n_trials"
    size_header: str  # its header: "RUNS", "TRIALS"
    counts_header: str  # the header of the counts column: "COUNTS", "STATES"
    lines: Callable[[Item, int], list[str]]  # the header line and table (at most N rows)
    ended: Callable[[Item], bool]
    finish: Callable[[Client, Item, argparse.Namespace], int]  # outputs written; the exit code
    cancelled: Callable[[Item], str]  # the line printed after a cancel


def follow(client: Client, kind: Kind, item_id: str, view: LiveTable) -> Item:
    """Long-poll the item, redrawing its table, until it has ended."""
    return follow_item(client, kind.collection, item_id, view, kind.lines, kind.ended)


def follow_queued(client: Client, kind: Kind, answer: Item, args: argparse.Namespace, started: str) -> int:
    """After the POST: print the id and return (``--no-wait``), or say ``started`` and follow it to its end;
    Ctrl-C detaches (130) and leaves it running."""
    item_id = answer[f"{kind.noun}_id"]
    if args.no_wait:
        print(item_id)
        return EXIT_OK
    print(started, file=sys.stderr)
    try:
        item = follow(client, kind, item_id, LiveTable())
    except KeyboardInterrupt:
        err(f"detached from {kind.noun} {item_id}; it keeps running (stop it with: xpufleet {kind.collection} "
            f"cancel {item_id})")
        return 130
    return kind.finish(client, item, args)


def counts_text(item: Item) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(item["counts"].items()))


def add_commands(sub: Any, kind: Kind, texts: dict[str, str], start: Callable[[argparse.Namespace], int],
                 manage_command: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """``xpufleet <noun> SPEC.yaml`` (``start``) and ``xpufleet <collection> [list | show | cancel]``
    (``manage_command``); ``texts``: the words that differ (``start``: its help, ``verb``: what start does,
    ``table``: what the CSV holds, ``show`` and ``cancel``: their helps). The start parser, for options of
    its own."""
    p = sub.add_parser(kind.noun, help=texts["start"], description=(
        f"{texts['verb']} a {kind.noun} (the body of POST /api/{kind.collection} written as YAML; graph may be a "
        f"path to a graph JSON file next to the spec) and follow it."))
    p.add_argument("spec", help=f"{kind.noun} spec (YAML)")
    p.add_argument("--no-wait", action="store_true", help=f"print the {kind.noun} id and return")
    p.add_argument("--csv", metavar="FILE", help=f"write {texts['table']} as CSV at the end")
    p.add_argument("--json", action="store_true", help=f"print the final {kind.noun} as JSON")
    p.set_defaults(func=start)

    s, ssub, _ = command_group(sub, kind.collection, f"list {kind.collection}, show one, cancel one",
                               f"The {kind.collection} of the running sidecar", ("show", "cancel"),
                               f"{kind.collection}, newest first")
    show = ssub.add_parser("show", help=texts["show"])
    show.add_argument(f"{kind.noun}_id")
    show.add_argument("--csv", metavar="FILE", help=f"write {texts['table']} as CSV ('-': standard output)")
    show.add_argument("--watch", action="store_true", help="follow it live until it ends")
    cancel = ssub.add_parser("cancel", help=texts["cancel"])
    cancel.add_argument(f"{kind.noun}_id")
    cancel.add_argument("--reason", help="recorded on each cancelled run")
    s.set_defaults(func=manage_command)
    return p


def manage(kind: Kind, args: argparse.Namespace) -> int:
    """``xpufleet <collection> [list | show ID [--watch] | cancel ID]``."""
    client = client_or_exit()
    command = getattr(args, f"{kind.collection}_command", None) or "list"
    if command == "list":
        page = client.request("GET", f"/api/{kind.collection}", params={"limit": 100})
        if args.json:
            print(json.dumps(page, indent=2))
            return EXIT_OK
        rows = [[i["id"][:8], i["name"], i["status"], i[kind.size_field], counts_text(i), i["objective"]["metric"]]
                for i in page[kind.collection]]
        for line in render(["ID", "NAME", "STATUS", kind.size_header, kind.counts_header, "OBJECTIVE"], rows):
            print(line)
        return EXIT_OK
    item_id = resolve_id(client, kind.collection, getattr(args, f"{kind.noun}_id"))
    if command == "cancel":
        item = client.request("POST", item_path(kind.collection, item_id, "/cancel"),
                              {"reason": args.reason} if args.reason else None)
        print(kind.cancelled(item))
        return EXIT_OK
    if args.watch:
        item = follow(client, kind, item_id, LiveTable())
    else:
        item = client.request("GET", item_path(kind.collection, item_id))
        if not (args.json or args.csv == "-"):
            for line in kind.lines(item, 10**6):
                print(line)
    code = kind.finish(client, item, args)
    return code if kind.ended(item) else EXIT_OK
