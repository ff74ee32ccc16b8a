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

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
from .records import SshEntry, SshRecords
from .supervisor import STOP_TIMEOUT_S, SshStepError, SshSupervisor

log = logging.getLogger("xpufleet.ssh")

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
        self.records = SshRecords(table.store)
        self.providers_changed = providers_changed
        self.tunnel_target = tunnel_target
        self.supervisors: dict[str, SshSupervisor] = {}

    def has(self, name: str) -> bool:
        """Whether ``name`` is an SSH worker."""
        return self.records.get(name) is not None

    def is_disabled(self, name: str) -> bool:
        """Whether ``name`` is an SSH worker the user disabled."""
        entry = self.records.get(name)
        return entry is not None and entry.disabled

    def _supervisor(self, entry: SshEntry) -> SshSupervisor:
        sup = self.supervisors.get(entry.name)
        if sup is None:
            sup = self.supervisors[entry.name] = SshSupervisor(
                entry.name, entry.target, list(entry.agent_args), entry.credential, self.tunnel_target,
                ssh_binary(), ssh_config_file(), on_change=self.providers_changed)
        return sup

    # --- life cycle ---------------------------------------------------------------------------------------
    def start_all(self) -> None:
        """At sidecar start: connect every enabled SSH worker."""
        for entry in self.records.enabled():
            self._supervisor(entry).start()

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
        with self.table.store.transaction() as db:
            self.records.insert(db, name, commands.SshTarget(target, port, identity, python, remote_dir), args,
                                credential, now)
            db.execute("INSERT INTO workers(name, auth, credential_hash, created_at) VALUES (?,?,?,?)",
                       (name, "ssh", hash_secret(credential), now))
        self.table.workers[name] = WorkerState(name=name, auth="ssh", created_at=now)
        self._supervisor(self._ssh_entry(name)).start()
        return name

    async def disable(self, name: str) -> None:
        """Stop the worker's agent (its running runs end interrupted) and end its ssh connection."""
        entry = self._ssh_entry(name)
        if not entry.disabled:
            self.records.set_disabled(name, True)
            sup = self._supervisor(entry)
            stopped = None
            try:  # while the tunnel is still up, so the agent reports its runs (interrupted) as it stops
                stopped = await sup.run_script(commands.STOP, entry.target.remote_dir, name, str(STOP_TIMEOUT_S - 15),
                                               timeout=STOP_TIMEOUT_S)
            except SshStepError as exc:
                log.warning("SSH worker %s: could not stop its agent: %s", name, exc)
            await sup.stop()
            sup.detail = f"agent stopped (pid {stopped['stopped']})" if stopped and stopped.get("stopped") else ""
            self.providers_changed()

    async def enable(self, name: str) -> None:
        """Connect a disabled SSH worker again."""
        entry = self._ssh_entry(name)
        if entry.disabled:
            self.records.set_disabled(name, False)
        self._supervisor(entry).start()
        self.providers_changed()

    def _ssh_entry(self, name: str) -> SshEntry:
        entry = self.records.get(name)
        if entry is None:
            if name in self.table.workers:
                raise WorkerError(f"worker {name} is not an SSH worker (only SSH workers are disabled and enabled)",
                                  409)
            raise WorkerError(f"no worker named {name!r} (see GET /api/workers)", 404)
        return entry

    async def forget(self, name: str) -> dict[str, Any]:
        """End ssh and delete what the worker stored on its host, then the entry (the registry removes the
        worker itself)."""
        entry = self._ssh_entry(name)
        sup = self._supervisor(entry)
        await sup.stop()
        try:
            result = await sup.run_script(commands.CLEANUP, entry.target.remote_dir, name, str(STOP_TIMEOUT_S - 15),
                                          timeout=STOP_TIMEOUT_S)
        except SshStepError as exc:
            result = {"removed": False, "detail": f"{exc.state}: {exc.detail} (the folder is left on the host)"}
        self.records.delete(name)
        self.supervisors.pop(name, None)
        return result

    def describe(self, name: str) -> dict[str, Any]:
        """The SSH side of the worker's Workers panel row: how it is reached and its connection's state."""
        entry = self._ssh_entry(name)
        sup = self.supervisors.get(name)
        live = sup.describe() if sup is not None else {"state": "starting", "detail": "", "pid": None,
                                                        "remote_dir_abs": None, "build": None, "connects": 0,
                                                        "tunnel_up_s": None}
        if entry.disabled:
            live = {**live, "state": "disabled", "pid": None, "tunnel_up_s": None}
        target = entry.target
        return {
            "host": target.target, "port": target.port, "identity": target.identity, "python": target.python,
            "remote_dir": live.pop("remote_dir_abs") or target.remote_dir, "agent_args": list(entry.agent_args),
            "disabled": entry.disabled, **live,
        }
