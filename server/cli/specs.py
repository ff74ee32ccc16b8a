"""What ``xpufleet sweep`` and ``xpufleet study`` share: the YAML spec file, the live table, and the
long-poll, id-prefix and CSV steps of one collection (``sweeps`` or ``studies``).

A spec file is the body of ``POST /api/sweeps`` (or ``/api/studies``) written as YAML. ``graph`` may be
the graph itself or, in a file, the path of a graph JSON file relative to the spec file (the command
reads it and sends the graph). Numbers such as ``1e-4`` are read as numbers (YAML 1.1, PyYAML's
dialect, would read them as text).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import yaml

from ...constants import EVENTS_LONG_POLL_MAX_S
from .local import load_graph

WAIT_S = 15.0  # one long poll of a sweep or study (the server answers sooner when a child moves)


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` / ``3E5`` as floats (YAML 1.2 does; PyYAML's 1.1 does not)."""


_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_spec(path: str) -> dict[str, Any]:
    """The spec file as the request body; ValueError says what to fix."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"spec file {str(p)!r} does not exist")
    try:
        body = yaml.load(p.read_text(encoding="utf-8"), Loader=_SpecLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise ValueError(f"spec file {str(p)!r} is not valid YAML: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError(f"spec file {str(p)!r} must hold a mapping (name, graph, parameters, objective, ...)")
    graph = body.get("graph")
    if isinstance(graph, str):
        graph_path = Path(graph) if Path(graph).is_absolute() else p.parent / graph
        body["graph"] = load_graph(graph_path)
    return body


def format_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    return str(value)


def render(header: list[str], rows: list[list[Any]]) -> list[str]:
    """Aligned text columns."""
    cells = [header] + [[format_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


class LiveTable:
    """Redraws a block of lines in place on a terminal; elsewhere prints a block only when it changed."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._drawn = 0
        self._last: list[str] = []

    def max_rows(self) -> int:
        """Rows of a table that fit the terminal (the rest is summarised)."""
        if not self.tty:
            return 20
        return max(5, shutil.get_terminal_size((100, 30)).lines - 6)

    def draw(self, lines: list[str]) -> None:
        if lines == self._last:
            return
        self._last = list(lines)
        if self.tty:
            width = shutil.get_terminal_size((100, 30)).columns
            if self._drawn:
                self.stream.write(f"\x1b[{self._drawn}F")  # to the first line of the previous block
            for line in lines:
                self.stream.write("\x1b[2K" + line[:width] + "\n")
            for _ in range(self._drawn - len(lines)):
                self.stream.write("\x1b[2K\n")
            self._drawn = max(self._drawn, len(lines))
        else:
            self.stream.write("\n".join(lines) + "\n\n")
        self.stream.flush()


def item_path(collection: str, item_id: str, tail: str = "") -> str:
    """``/api/<collection>/<id><tail>`` with the id quoted."""
    return f"/api/{collection}/{urllib.parse.quote(item_id, safe='')}{tail}"


def resolve_id(client: Any, collection: str, prefix: str) -> str:
    """A full id from its first characters (tables print 8); the prefix itself when it is not unique."""
    items = client.request("GET", f"/api/{collection}", params={"limit": 1000})[collection]
    matches = [item["id"] for item in items if item["id"].startswith(prefix)]
    return matches[0] if len(matches) == 1 else prefix


def follow(client: Any, collection: str, item_id: str, view: LiveTable,
           lines: Callable[[dict[str, Any], int], list[str]], done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Long-poll the item, redrawing ``lines(item, rows)``, until ``done(item)``."""
    version = -1
    while True:
        item = client.request("GET", item_path(collection, item_id), params={"version": version, "wait": WAIT_S},
                              timeout=min(WAIT_S, EVENTS_LONG_POLL_MAX_S) + client.timeout)
        view.draw(lines(item, view.max_rows()))
        if done(item):
            return item
        version = item["version"]


def write_outputs(client: Any, collection: str, item: dict[str, Any], csv_name: str, args: Any) -> None:
    """``--csv FILE|-`` (the server's CSV of the item) and ``--json`` (the item)."""
    if getattr(args, "csv", None):
        text = client.request("GET", item_path(collection, item["id"], f"/{csv_name}"), raw=True).decode("utf-8")
        if args.csv == "-":
            sys.stdout.write(text)
        else:
            Path(args.csv).write_text(text, encoding="utf-8")
            print(f"wrote {args.csv}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps(item, indent=2))
