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


def hash_secret(secret: str) -> str:
    """What the database keeps of a credential or join token (SHA-256, hex)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def secret_matches(given: str, stored_hash: str | None) -> bool:
    """Constant-time comparison of a presented secret with a stored hash."""
    if not stored_hash:
        return False
    return hmac.compare_digest(hash_secret(given), stored_hash)


class Rejections:
    """Refused agent connections, kept in ``worker_rejections`` (shown under "Rejected connections")."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def record(self, name: str | None, address: str | None, version: str | None, reason: str) -> None:
        """Remember a refused connection."""
        log.warning("refused agent %s from %s: %s", name or "?", address or "?", reason)
        with self.store.transaction() as db:
            # An agent that keeps retrying (every <= 10 s) shows once, at its latest attempt, and
            # cannot push other refusals out of the kept list.
            db.execute("DELETE FROM worker_rejections WHERE name IS ? AND address IS ? AND version IS ? AND reason=?",
                       (name, address, version, reason))
            db.execute("INSERT INTO worker_rejections(ts, name, address, version, reason) VALUES (?,?,?,?,?)",
                       (time.time(), name, address, version, reason))
            db.execute("DELETE FROM worker_rejections WHERE id <= (SELECT MAX(id) FROM worker_rejections) - ?",
                       (REJECTIONS_KEPT,))

    def latest(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest refusals first, each with its age."""
        rows = self.store.query(
            "SELECT ts, name, address, version, reason FROM worker_rejections ORDER BY id DESC LIMIT ?", (limit,))
        now = time.time()
        return [{**dict(r), "age_s": round(now - r["ts"], 1)} for r in rows]

    def last_for(self, name: str) -> dict[str, Any] | None:
        """The worker's latest refusal, or None."""
        rows = self.store.query(
            "SELECT ts, address, version, reason FROM worker_rejections WHERE name=? ORDER BY id DESC LIMIT 1",
            (name,))
        return dict(rows[0]) if rows else None
