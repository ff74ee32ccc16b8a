"""What the sidecar keeps of its SSH workers in SQLite (docs/workers.md, "SSH workers"), through ``Store``.

One row per worker: how to reach its host, the agent's options, the credential the sidecar hands the agent
over ssh at each (re)start (the ``workers`` table keeps only its hash), and whether the user disabled it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...common.schema import Schema
from .commands import SshTarget

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


@dataclass(frozen=True)
class SshEntry:
    """One SSH worker as kept: ``target`` (how to reach the host), ``agent_args`` (the agent's options),
    ``credential`` (the agent's secret), ``disabled`` (the user disabled it)."""

    name: str
    target: SshTarget
    agent_args: tuple[str, ...]
    credential: str
    disabled: bool

    @classmethod
    def from_row(cls, row: Any) -> SshEntry:
        """The entry of one ``ssh_workers`` row."""
        return cls(row["name"], SshTarget(row["target"], row["port"], row["identity"], row["python"],
                                          row["remote_dir"]),
                   tuple(json.loads(row["agent_args"])), row["credential"], bool(row["disabled"]))


class SshRecords:
    """The ``ssh_workers`` table of the sidecar's store (server/sidecar/store.py)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        SCHEMA.ensure(store)

    def get(self, name: str) -> SshEntry | None:
        """The SSH worker named ``name``, or None (not an SSH worker)."""
        rows = self.store.query("SELECT * FROM ssh_workers WHERE name=?", (name,))
        return SshEntry.from_row(rows[0]) if rows else None

    def enabled(self) -> list[SshEntry]:
        """Every SSH worker the user has not disabled, by name."""
        return [SshEntry.from_row(r) for r in self.store.query("SELECT * FROM ssh_workers WHERE disabled=0"
                                                                  " ORDER BY name")]

    def insert(self, db: Any, name: str, target: SshTarget, agent_args: list[str], credential: str,
               now: float) -> None:
        """A new, enabled SSH worker, in the caller's transaction ``db`` (which adds its ``workers`` row)."""
        db.execute("INSERT INTO ssh_workers(name, target, port, identity, python, remote_dir, agent_args,"
                   " credential, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
                   (name, target.target, target.port, target.identity, target.python, target.remote_dir,
                    json.dumps(agent_args), credential, now))

    def set_disabled(self, name: str, disabled: bool) -> None:
        """Disable or enable an SSH worker."""
        with self.store.transaction() as db:
            db.execute("UPDATE ssh_workers SET disabled=? WHERE name=?", (int(disabled), name))

    def delete(self, name: str) -> None:
        """Forget an SSH worker's entry."""
        with self.store.transaction() as db:
            db.execute("DELETE FROM ssh_workers WHERE name=?", (name,))
