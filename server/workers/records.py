"""What the sidecar keeps of workers in SQLite (the tables, through ``Store.ensure_schema``), and
how a presented secret is checked against the hash that is all it keeps."""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from typing import Any

from ...common.schema import Schema

log = logging.getLogger("xpufleet.workers")

SCHEMA = Schema("workers", 1, """
CREATE TABLE IF NOT EXISTS workers (
    name TEXT PRIMARY KEY,
    auth TEXT NOT NULL,
    credential_hash TEXT,
    drained INTEGER NOT NULL DEFAULT 0,
    version TEXT,
    env TEXT NOT NULL DEFAULT '{}',
    node_types TEXT NOT NULL DEFAULT '[]',
    devices TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL,
    last_seen REAL,
    last_connected REAL
);
CREATE TABLE IF NOT EXISTS worker_join_tokens (
    token_hash TEXT PRIMARY KEY,
    name TEXT,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    used_at REAL,
    used_by TEXT
);
CREATE TABLE IF NOT EXISTS worker_rejections (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    name TEXT,
    address TEXT,
    version TEXT,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS worker_rejections_name ON worker_rejections(name, id);
CREATE TABLE IF NOT EXISTS worker_unverified_rejections (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    name TEXT,
    address TEXT,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS worker_device_modes (
    worker TEXT NOT NULL,
    device TEXT NOT NULL,
    mode TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (worker, device)
);
""")

MODES = ("exclusive", "shared")
SHAREABLE_KINDS = ("cuda", "mps")  # docs/workers.md: only CUDA and MPS cards, only on workers
REJECTIONS_KEPT = 200
# Connections that never sent a well-formed hello (no hello, a bad one, refused_server): what they say is
# a claim nobody vouches for, kept apart and few, so a flood of them cannot push real refusals out.
UNVERIFIED_KEPT = 20
CLAIM_LOG_EVERY_S = 10.0  # a flood of them is one log line per this many seconds, with the count


def hash_secret(secret: str) -> str:
    """What the database keeps of a credential or join token (SHA-256, hex)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def secret_matches(given: str, stored_hash: str | None) -> bool:
    """Constant-time comparison of a presented secret with a stored hash."""
    if not stored_hash:
        return False
    return hmac.compare_digest(hash_secret(given), stored_hash)


class Rejections:
    """Refused agent connections (shown under "Rejected connections").

    Two kinds, kept apart (docs/workers.md, "Names and credentials"):

    * a well-formed ``hello`` the server refused (``worker_rejections``, the newest ``REJECTIONS_KEPT``): its
      reason is the server's own sentence, and the newest one for a name is that worker's ``last_rejection``;
    * an *unverified* claim (``worker_unverified_rejections``, the newest ``UNVERIFIED_KEPT``): a peer that
      sent no hello, a malformed one or ``refused_server`` proved nothing, so what it said is listed with
      ``"unverified": true`` and never becomes a worker's ``last_rejection``.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self._quiet_until = 0.0  # unverified claims are logged at most once per CLAIM_LOG_EVERY_S
        self._unlogged = 0

    def record(self, name: str | None, address: str | None, version: str | None, reason: str,
               unverified: bool = False) -> None:
        """Remember a refused connection (``unverified``: a claim by a peer that proved nothing)."""
        if not unverified:
            log.warning("refused agent %s from %s: %s", name or "?", address or "?", reason)
        elif time.monotonic() >= self._quiet_until:
            more = f" (and {self._unlogged} more unverified since the last such line)" if self._unlogged else ""
            log.warning("refused a connection from %s: %s%s", address or "?", reason, more)
            self._quiet_until, self._unlogged = time.monotonic() + CLAIM_LOG_EVERY_S, 0
        else:
            self._unlogged += 1
        table, kept = ("worker_unverified_rejections", UNVERIFIED_KEPT) if unverified \
            else ("worker_rejections", REJECTIONS_KEPT)
        with self.store.transaction() as db:
            # An agent that keeps retrying (every <= 10 s) shows once, at its latest attempt, and
            # cannot push other refusals out of the kept list.
            if unverified:
                db.execute(f"DELETE FROM {table} WHERE name IS ? AND address IS ? AND reason=?",
                           (name, address, reason))
                db.execute(f"INSERT INTO {table}(ts, name, address, reason) VALUES (?,?,?,?)",
                           (time.time(), name, address, reason))
            else:
                db.execute(f"DELETE FROM {table} WHERE name IS ? AND address IS ? AND version IS ? AND reason=?",
                           (name, address, version, reason))
                db.execute(f"INSERT INTO {table}(ts, name, address, version, reason) VALUES (?,?,?,?,?)",
                           (time.time(), name, address, version, reason))
            db.execute(f"DELETE FROM {table} WHERE id NOT IN (SELECT id FROM {table} ORDER BY id DESC LIMIT ?)",
                       (kept,))

    def latest(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest refusals first (both kinds), each with its age and ``unverified``."""
        rows = [{**dict(r), "unverified": False} for r in self.store.query(
            "SELECT ts, name, address, version, reason FROM worker_rejections ORDER BY id DESC LIMIT ?", (limit,))]
        rows += [{**dict(r), "version": None, "unverified": True} for r in self.store.query(
            "SELECT ts, name, address, reason FROM worker_unverified_rejections ORDER BY id DESC LIMIT ?",
            (limit,))]
        rows.sort(key=lambda r: r["ts"], reverse=True)
        now = time.time()
        return [{**r, "age_s": round(now - r["ts"], 1)} for r in rows[:limit]]

    def last_for(self, name: str) -> dict[str, Any] | None:
        """The worker's latest refused hello, or None (an unverified claim under its name is not one)."""
        rows = self.store.query(
            "SELECT ts, address, version, reason FROM worker_rejections WHERE name=? ORDER BY id DESC LIMIT 1",
            (name,))
        return dict(rows[0]) if rows else None
