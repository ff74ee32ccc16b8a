"""Every SSH worker of a sidecar (docs/workers.md): kept in SQLite, one :class:`SshSupervisor` each.

* ``add``: a worker named NAME reached as ``user@host`` (``--port``, ``--identity``, ``--python``,
  ``--remote-dir``, and the agent's ``--devices`` / ``--mount`` / ``--simulate``). It authenticates with
  a credential the sidecar keeps and hands its agent over ssh at each (re)start, so there is nothing to
  reissue. Its connection starts at once and whenever the sidecar starts.
* ``disable``: stop its agent (running runs end interrupted), end the ssh connection; it stays listed as
  Disabled and takes no run (runs queued for it wait). ``enable`` connects it again.
* ``forget`` (``DELETE /api/workers/{name}``): end ssh, then delete the worker's folder on the host
  (only when it holds this worker's marker) and the entry.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...common.schema import Schema
from ...common.secrets import new_secret
from ...constants import ENV_SSH, ENV_SSH_CONFIG, WORKER_NAME_RE
from ...nodes.mounts import LABEL_RE
from ..devices.names import DeviceSpecError, parse_device_list
from ..devices.simulated import parse_simulate
from ..workers import protocol
from ..workers.records import hash_secret
from ..workers.state import WorkerError, WorkerState
from ..workers.table import WorkerTable
from . import commands
from .supervisor import STOP_TIMEOUT_S, SshStepError, SshSupervisor

log = logging.getLogger("xpufleet.ssh")

SCHEMA = Schema("ssh_workers", 1, """
CREATE TABLE IF NOT EXISTS ssh_workers (
    name TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    port INTEGER,
    identity TEXT,
    python TEXT NOT NULL,
    remote_dir TEXT NOT NULL,
    agent_args TEXT NOT NULL DEFAULT '[]',
    credential TEXT NOT NULL,
    disabled INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL
);
""")
FIELDS = {"name", "host", "port", "identity", "python", "remote_dir", "devices", "mounts", "simulate"}


def ssh_binary() -> str:
    return os.environ.get(ENV_SSH, "").strip() or "ssh"


def ssh_config_file() -> str | None:
    """``XPUFLEET_SSH_CONFIG``: an ssh config file given to every ssh the sidecar runs (``-F``)."""
    return os.environ.get(ENV_SSH_CONFIG, "").strip() or None


def _agent_args(body: dict[str, Any], name: str) -> list[str]:
    """The remote agent's options, checked here (what a bad value would do there, said now)."""
    args: list[str] = []
    devices = body.get("devices")
    if devices is not None:
        if not isinstance(devices, str):
            raise WorkerError("devices must be a string like \"cuda:0,cuda:1\"")
        try:
            parse_device_list(devices)
        except DeviceSpecError as exc:
            raise WorkerError(f"devices: {exc}") from None
        args += ["--devices", devices]
    mounts = body.get("mounts")
    if mounts is not None:
        if not isinstance(mounts, list) or not all(isinstance(m, str) for m in mounts):
            raise WorkerError("mounts must be a list of \"LABEL=FOLDER\" (folders on the host)")
        for m in mounts:
            label, sep, folder = m.partition("=")
            if not sep or not LABEL_RE.match(label) or not folder.startswith(("/", "~")):
                raise WorkerError(f"mounts: {m!r}: write LABEL=/absolute/folder/on/the/host")
            args += ["--mount", m]
    simulate = body.get("simulate")
    if simulate is not None:
        if not isinstance(simulate, str):
            raise WorkerError("simulate must be a string like \"cuda:0=24\"")
        try:
            parse_simulate(simulate, name)
        except DeviceSpecError as exc:
            raise WorkerError(f"simulate: {exc}") from None
        args += ["--simulate", simulate]
    return args


class SshWorkers:
    """The SSH workers of one sidecar (lives on its event loop)."""

    def __init__(self, table: WorkerTable, providers_changed: Callable[[], None],
                 tunnel_target: Callable[[], str | None]) -> None:
        """``table``: the worker table (an SSH worker is a worker); ``providers_changed``: the dispatcher's
        (a connection's state changes what it may place); ``tunnel_target``: where tunnels end here."""
        self.table = table
        self.store = table.store
        self.providers_changed = providers_changed
        self.tunnel_target = tunnel_target
        self.supervisors: dict[str, SshSupervisor] = {}
        SCHEMA.ensure(self.store)

    def _row(self, name: str) -> Any:
        rows = self.store.query("SELECT * FROM ssh_workers WHERE name=?", (name,))
        return rows[0] if rows else None

    def has(self, name: str) -> bool:
        return self._row(name) is not None

    def is_disabled(self, name: str) -> bool:
        row = self._row(name)
        return bool(row is not None and row["disabled"])

    def _target(self, row: Any) -> commands.SshTarget:
        return commands.SshTarget(row["target"], row["port"], row["identity"], row["python"], row["remote_dir"])

    def _supervisor(self, row: Any) -> SshSupervisor:
        sup = self.supervisors.get(row["name"])
        if sup is None:
            sup = self.supervisors[row["name"]] = SshSupervisor(
                row["name"], self._target(row), json.loads(row["agent_args"]), row["credential"], self.tunnel_target,
                ssh_binary(), ssh_config_file(), on_change=self.providers_changed)
        return sup

    # --- life cycle ---------------------------------------------------------------------------------------
    def start_all(self) -> None:
        """At sidecar start: connect every enabled SSH worker."""
        for row in self.store.query("SELECT * FROM ssh_workers WHERE disabled=0 ORDER BY name"):
            self._supervisor(row).start()

    async def close(self) -> None:
        """Sidecar stopping: end every tunnel (agents keep running on their hosts; they reconnect through the
        next sidecar's tunnels)."""
        for sup in list(self.supervisors.values()):
            await sup.stop()

    # --- management -----------------------------------------------------------------------------------------
    def add(self, body: dict[str, Any]) -> str:
        """Add the SSH worker ``body`` describes and start its connection; its name."""
        unknown = sorted(set(body) - FIELDS)
        if unknown:
            raise WorkerError(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(FIELDS))}")
        name = body.get("name")
        if not isinstance(name, str) or protocol.worker_name_problem(name) or not WORKER_NAME_RE.match(name):
            raise WorkerError(protocol.worker_name_problem(str(name)) or "name must be a worker name")
        if name in self.table.workers or self.has(name):
            raise WorkerError(f"a worker named {name!r} exists already (remove it first, or choose another name)", 409)
        try:
            target = commands.check_target(body.get("host", ""))
            python = commands.check_python(body.get("python") or "python3")
            remote_dir = commands.check_remote_dir(body.get("remote_dir")
                                                   or commands.DEFAULT_REMOTE_DIR.format(name=name))
        except commands.SshConfigError as exc:
            raise WorkerError(str(exc)) from None
        port = body.get("port")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise WorkerError("port must be an integer 1-65535 (the host's sshd port)")
        identity = body.get("identity")
        if identity is not None:
            if not isinstance(identity, str) or not Path(os.path.expanduser(identity)).is_file():
                raise WorkerError(f"identity: no key file {identity!r} on this machine (the sidecar's)")
            identity = str(Path(os.path.expanduser(identity)).resolve())
        args = _agent_args(body, name)
        credential = new_secret("xfc")
        now = time.time()
        with self.store.transaction() as db:
            db.execute("INSERT INTO ssh_workers(name, target, port, identity, python, remote_dir, agent_args,"
                       " credential, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
                       (name, target, port, identity, python, remote_dir, json.dumps(args), credential, now))
            db.execute("INSERT INTO workers(name, auth, credential_hash, created_at) VALUES (?,?,?,?)",
                       (name, "ssh", hash_secret(credential), now))
        self.table.workers[name] = WorkerState(name=name, auth="ssh", created_at=now)
        self._supervisor(self._row(name)).start()
        return name

    async def disable(self, name: str) -> None:
        """Stop the worker's agent (its running runs end interrupted) and end its ssh connection."""
        row = self._ssh_row(name)
        if not row["disabled"]:
            with self.store.transaction() as db:
                db.execute("UPDATE ssh_workers SET disabled=1 WHERE name=?", (name,))
            sup = self._supervisor(row)
            stopped = None
            try:  # while the tunnel is still up, so the agent reports its runs (interrupted) as it stops
                stopped = await sup.run_script(commands.STOP, row["remote_dir"], name, str(STOP_TIMEOUT_S - 15),
                                               timeout=STOP_TIMEOUT_S)
            except SshStepError as exc:
                log.warning("SSH worker %s: could not stop its agent: %s", name, exc)
            await sup.stop()
            sup.detail = f"agent stopped (pid {stopped['stopped']})" if stopped and stopped.get("stopped") else ""
            self.providers_changed()

    async def enable(self, name: str) -> None:
        """Connect a disabled SSH worker again."""
        row = self._ssh_row(name)
        if row["disabled"]:
            with self.store.transaction() as db:
                db.execute("UPDATE ssh_workers SET disabled=0 WHERE name=?", (name,))
        self._supervisor(self._row(name)).start()
        self.providers_changed()

    def _ssh_row(self, name: str) -> Any:
        row = self._row(name)
        if row is None:
            if name in self.table.workers:
                raise WorkerError(f"worker {name} is not an SSH worker (only SSH workers are disabled and enabled)",
                                  409)
            raise WorkerError(f"no worker named {name!r} (see GET /api/workers)", 404)
        return row

    async def forget(self, name: str) -> dict[str, Any]:
        """End ssh and delete what the worker stored on its host, then the entry (the registry removes the
        worker itself)."""
        row = self._row(name)
        sup = self._supervisor(row)
        await sup.stop()
        try:
            result = await sup.run_script(commands.CLEANUP, row["remote_dir"], name, str(STOP_TIMEOUT_S - 15),
                                          timeout=STOP_TIMEOUT_S)
        except SshStepError as exc:
            result = {"removed": False, "detail": f"{exc.state}: {exc.detail} (the folder is left on the host)"}
        with self.store.transaction() as db:
            db.execute("DELETE FROM ssh_workers WHERE name=?", (name,))
        self.supervisors.pop(name, None)
        return result

    def describe(self, name: str) -> dict[str, Any]:
        row = self._row(name)
        sup = self.supervisors.get(name)
        live = sup.describe() if sup is not None else {"state": "starting", "detail": "", "pid": None,
                                                        "remote_dir_abs": None, "build": None, "connects": 0,
                                                        "tunnel_up_s": None}
        if row["disabled"]:
            live = {**live, "state": "disabled", "pid": None, "tunnel_up_s": None}
        return {
            "host": row["target"], "port": row["port"], "identity": row["identity"], "python": row["python"],
            "remote_dir": live.pop("remote_dir_abs") or row["remote_dir"], "agent_args": json.loads(row["agent_args"]),
            "disabled": bool(row["disabled"]), **live,
        }
