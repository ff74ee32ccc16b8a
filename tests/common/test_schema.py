"""A part's tables declared once (common/schema.py): applied to a real store, idempotent, the version recorded;
a statement that would fail on a kept ``state.db`` is refused when the module is imported."""

from __future__ import annotations

import pytest

from xpufleet.common.schema import Schema
from xpufleet.server.sidecar.store import Store

NOTES = Schema("notes", 2, """
CREATE TABLE IF NOT EXISTS notes (
    id TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS notes_body ON notes(body);
""")


def test_ensure_creates_the_tables_and_records_the_version(tmp_path):
    store = Store(tmp_path / "state.db")
    try:
        assert store.schema_version("notes") is None
        NOTES.ensure(store)
        store.query("INSERT INTO notes(id, body) VALUES ('a', 'x')")
        NOTES.ensure(store)  # each start applies it again: nothing lost, nothing doubled
        assert [tuple(r) for r in store.query("SELECT id, body FROM notes")] == [("a", "x")]
        assert store.schema_version("notes") == 2
    finally:
        store.close()


@pytest.mark.parametrize("ddl", ["CREATE TABLE notes (id TEXT)", "DROP TABLE notes",
                                 "CREATE TABLE IF NOT EXISTS a (x INT); ALTER TABLE a ADD COLUMN y INT"])
def test_a_statement_that_is_not_idempotent_is_refused(ddl):
    with pytest.raises(ValueError, match="not a CREATE ... IF NOT EXISTS statement"):
        Schema("notes", 1, ddl)


@pytest.mark.parametrize(("name", "version"), [("", 1), ("notes", 0)])
def test_a_schema_has_a_name_and_a_version_from_one(name, version):
    with pytest.raises(ValueError, match="a name and a version >= 1"):
        Schema(name, version, NOTES.ddl)
