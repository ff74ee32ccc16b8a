"""What the sidecar keeps of workers in SQLite (the tables, through ``Store.ensure_schema``), and
how a presented secret is checked against the hash that is all it keeps."""

from __future__ import annotations

import hashlib
import hmac

SCHEMA_NAME = "workers"
SCHEMA_VERSION = 1
SCHEMA = """
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
"""

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
