"""Browser pairings (docs/security.md): the durable credentials a browser holds to act on the fleet through
ComfyUI's ``/xpufleet/api/`` proxy, which forwards the browser's pairing secret as its bearer token.

A pairing is a random secret (``xfp_...``) handed to the browser once; the store keeps only its SHA-256
digest, a label (``name``: a later issue maps pairings to users) and its creation time, in ``state.db``'s
``pairings`` table, so pairings survive sidecar restarts. A revoked pairing's row stays (``revoked_at``)
so the list says when; its secret is refused from then on.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from ...common.schema import Schema
from ...common.secrets import new_secret
from .auth import PAIRING_SECRET_START

PAIRING_PREFIX = PAIRING_SECRET_START.rstrip("_")  # auth.py answers a refused one so the page re-pairs
PAIRING_ID_PREFIX = "pair"
MAX_LIVE_PAIRINGS = 1000  # live pairings at once: the oldest is revoked first past it

SCHEMA = Schema("pairings", 1, """
CREATE TABLE IF NOT EXISTS pairings (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    digest TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    revoked_at REAL
);
""")


def digest(secret: str) -> str:
    """The stored form of a pairing secret."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Pairing:
    """One pairing as listed (never its secret)."""

    id: str
    name: str
    created_at: float
    revoked_at: float | None = None

    def public(self) -> dict[str, Any]:
        return asdict(self)


class Pairings:
    """The ``pairings`` table, with the live digests kept in memory: checking a bearer token is one
    dictionary lookup of its digest (its timing says nothing about the secret), no SQLite read."""

    def __init__(self, store: Any) -> None:
        self.store = store
        SCHEMA.ensure(store)
        self._lock = threading.Lock()
        rows = store.query("SELECT id, digest FROM pairings WHERE revoked_at IS NULL")
        self._live: dict[str, str] = {r["digest"]: r["id"] for r in rows}

    def issue(self, name: str, now: float | None = None) -> tuple[str, Pairing]:
        """A new pairing labelled ``name``: (its secret, shown once; the record). Written before it returns."""
        now = time.time() if now is None else now
        secret = new_secret(PAIRING_PREFIX)
        pairing = Pairing(new_secret(PAIRING_ID_PREFIX, 9), name, now)
        with self.store.transaction() as db:
            db.execute("INSERT INTO pairings(id, name, digest, created_at) VALUES (?,?,?,?)",
                       (pairing.id, name, digest(secret), now))
        with self._lock:
            self._live[digest(secret)] = pairing.id
        while len(self._live) > MAX_LIVE_PAIRINGS:
            self.revoke(self.list(live_only=True)[0].id)
        return secret, pairing

    def valid(self, secret: str) -> bool:
        """True for the secret of a live pairing."""
        return digest(secret) in self._live

    def list(self, live_only: bool = False) -> list[Pairing]:
        """Every pairing, oldest first (with ``live_only``: the unrevoked ones)."""
        where = " WHERE revoked_at IS NULL" if live_only else ""
        rows = self.store.query(f"SELECT id, name, created_at, revoked_at FROM pairings{where} ORDER BY created_at, id")
        return [Pairing(r["id"], r["name"], r["created_at"], r["revoked_at"]) for r in rows]

    def revoke(self, pairing_id: str, now: float | None = None) -> bool:
        """Revoke a live pairing (its secret is refused from now on); False when there is no such live one."""
        now = time.time() if now is None else now
        with self.store.transaction() as db:
            changed = db.execute("UPDATE pairings SET revoked_at=? WHERE id=? AND revoked_at IS NULL",
                                 (now, pairing_id)).rowcount
        if changed:
            with self._lock:
                for key in [k for k, v in self._live.items() if v == pairing_id]:
                    del self._live[key]
        return bool(changed)
