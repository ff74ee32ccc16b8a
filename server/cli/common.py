"""What every ``xpufleet`` command shares: exit codes, error output, the running sidecar's client."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ...common.client import ApiError, Client, SidecarUnreachable
from ...common.runtime_file import pid_alive, read_runtime, remove_runtime
from ...constants import home_dir
from .text import safe

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
T = TypeVar("T")


def err(msg: str) -> None:
    """An error line on stderr, prefixed ``xpufleet:`` (control characters escaped: it may quote a
    run's name or a server's message)."""
    print(f"xpufleet: {safe(msg, lines=True)}", file=sys.stderr)


def running_client(home: Path) -> tuple[Client, dict[str, Any]] | None:
    """A client for the sidecar of ``home`` when one is alive and answering; clears a stale file."""
    info = read_runtime(home)
    if info is None:
        return None
    if not pid_alive(info.get("pid")):
        remove_runtime(home)
        return None
    client = Client(info["url"], info.get("token"), timeout=5.0, fingerprint=info.get("tls_fingerprint"))
    try:
        client.health()
    except (SidecarUnreachable, ApiError):
        return None
    return client, info




def client_or_exit() -> Client:
    """The running sidecar's client (SidecarUnreachable -> exit code 3 in ``main``)."""
    client = Client.from_home(home_dir())
    client.health()
    return client


def comfyui_options(parser: argparse.ArgumentParser, what: str, default: str) -> None:
    """``--comfyui PATH`` and ``--comfyui-python PY`` (an agent's and the sidecar's alike): ``what`` the
    ComfyUI runs there, ``default`` where it is found without the flag."""
    parser.add_argument("--comfyui", metavar="PATH", help=f"the ComfyUI folder (with main.py) that runs {what} "
                                                          f"(default: {default})")
    parser.add_argument("--comfyui-python", metavar="PY",
                        help="the interpreter of that ComfyUI (default: $XPUFLEET_COMFYUI_PYTHON, its venv/ or "
                             ".venv/, else this one)")


def json_option() -> argparse.ArgumentParser:
    """A parent parser with ``--json`` for the subcommands, so that it may also follow them (``xpufleet
    workers list --json``); SUPPRESS keeps the group's own ``--json`` when the subcommand has none."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    return parent


def command_group(subparsers: Any, name: str, help: str, what: str, commands: tuple[str, ...], list_help: str
                  ) -> tuple[argparse.ArgumentParser, Any, argparse.ArgumentParser]:
    """``xpufleet NAME [--json] [list | COMMAND ...]``, ``list`` by default: the group's parser, its subparsers
    (``list`` added, ``commands`` named in the usage) and the ``--json`` parent (:func:`json_option`) for
    the subcommands. ``what``: the description's subject ("Workers known to the running sidecar")."""
    p = subparsers.add_parser(name, help=help, description=f"{what} (default: list them).")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest=f"{name}_command", metavar="{" + ",".join(("list", *commands)) + "}")
    json_opt = json_option()
    sub.add_parser("list", help=list_help, parents=[json_opt])
    return p, sub, json_opt


def read_input(load: Callable[[str], T], path: str) -> T | None:
    """``load(path)`` (a graph or spec file); None, the reason said on stderr, where it is refused (the
    command then exits EXIT_USAGE)."""
    try:
        return load(path)
    except ValueError as exc:
        err(str(exc))
        return None
