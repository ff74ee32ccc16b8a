"""A part's tables in the sidecar's SQLite (``state.db``), declared once: their name, version and DDL.

Each part that keeps records (workers and pools, SSH workers, Slurm pools, units, sweeps and studies,
memory budgets) declares one :class:`Schema` beside its queries and applies it with :meth:`Schema.ensure`
when it is built. The store runs the DDL in one transaction and records the version under
``schema:<name>`` in its ``meta`` table, so that a later version can migrate (docs/architecture.md,
"Layers"; the store: server/sidecar/store.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

# Every statement creates something only when it is missing: ensure runs at each start, on a kept file.
_IDEMPOTENT = re.compile(r"CREATE\s+(UNIQUE\s+)?(TABLE|INDEX)\s+IF\s+NOT\s+EXISTS\s", re.IGNORECASE)


class SchemaStore(Protocol):
    """What :meth:`Schema.ensure` needs of the store."""

    def ensure_schema(self, name: str, ddl: str, version: int = 1) -> None: ...


@dataclass(frozen=True)
class Schema:
    """One part's tables: ``name`` (its key in the store's ``meta``), ``version``, ``ddl`` (its ``CREATE ...
    IF NOT EXISTS`` statements, separated by ``;``)."""

    name: str
    version: int
    ddl: str

    def __post_init__(self) -> None:
        if not self.name or self.version < 1:
            raise ValueError(f"schema {self.name!r}: a name and a version >= 1, got version {self.version}")
        for stmt in (s.strip() for s in self.ddl.split(";")):
            if stmt and not _IDEMPOTENT.match(stmt):
                raise ValueError(f"schema {self.name!r}: not a CREATE ... IF NOT EXISTS statement: {stmt[:60]!r}")

    def ensure(self, store: SchemaStore) -> None:
        """Create the tables that are missing in ``store`` and record this version."""
        store.ensure_schema(self.name, self.ddl, self.version)
