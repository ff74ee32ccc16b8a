"""Services and units in the sidecar's SQLite (``Store.ensure_schema``): they survive a sidecar restart.

Each record is one JSON document (records.py); every save is one transaction, so nothing is half
written. Instances are saved with their unit.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ...common.schema import Schema
from .records import Service, Unit

SCHEMA = Schema("units", 1, """
CREATE TABLE IF NOT EXISTS services (
    name TEXT PRIMARY KEY,
    data TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS service_units (
    id TEXT PRIMARY KEY,
    service TEXT NOT NULL,
    data TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS service_units_service ON service_units(service);
""")


class UnitStore:
    """Reads and writes the units tables of the sidecar's :class:`~..sidecar.store.Store`."""

    def __init__(self, store: Any) -> None:
        self.store = store
        SCHEMA.ensure(store)

    def load(self) -> list[Service]:
        """Every service with its units (in index order)."""
        units: dict[str, list[Unit]] = {}
        for row in self.store.query("SELECT service, data FROM service_units"):
            units.setdefault(row["service"], []).append(Unit.from_json(json.loads(row["data"])))
        out = []
        for row in self.store.query("SELECT data FROM services ORDER BY name"):
            data = json.loads(row["data"])
            out.append(Service.from_json(data, sorted(units.get(data["name"], []), key=lambda u: u.index)))
        return out

    def save_service(self, svc: Service, with_units: bool = True) -> None:
        now = time.time()
        with self.store.transaction() as db:
            db.execute("INSERT INTO services(name, data, updated_at) VALUES (?,?,?) ON CONFLICT(name) DO UPDATE"
                       " SET data=excluded.data, updated_at=excluded.updated_at",
                       (svc.name, json.dumps(svc.to_json()), now))
            if with_units:
                for u in svc.units:
                    self._save_unit(db, u, now)

    def save_unit(self, unit: Unit) -> None:
        with self.store.transaction() as db:
            self._save_unit(db, unit, time.time())

    @staticmethod
    def _save_unit(db: Any, unit: Unit, now: float) -> None:
        db.execute("INSERT INTO service_units(id, service, data, updated_at) VALUES (?,?,?,?) ON CONFLICT(id) DO UPDATE"
                   " SET data=excluded.data, updated_at=excluded.updated_at",
                   (unit.id, unit.service, json.dumps(unit.to_json()), now))

    def delete_unit(self, unit_id: str) -> None:
        with self.store.transaction() as db:
            db.execute("DELETE FROM service_units WHERE id=?", (unit_id,))

    def delete_service(self, name: str) -> None:
        with self.store.transaction() as db:
            db.execute("DELETE FROM service_units WHERE service=?", (name,))
            db.execute("DELETE FROM services WHERE name=?", (name,))
