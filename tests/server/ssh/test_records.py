"""The SSH workers' table (server/ssh/records.py) on a real store: what ``add`` writes reads back as one typed
entry, survives a restart, and is disabled, enabled and forgotten by name."""

from __future__ import annotations

from xpufleet.server.sidecar.store import Store
from xpufleet.server.ssh.commands import SshTarget
from xpufleet.server.ssh.records import SCHEMA, SshEntry, SshRecords

TARGET = SshTarget("me@gpu-box", 2222, "/home/me/.ssh/id_ed25519", "python3.11", "~/.xpufleet-agent/box")


def add(records: SshRecords, name: str, target: SshTarget = TARGET) -> None:
    with records.store.transaction() as db:
        records.insert(db, name, target, ["--devices", "cuda:0"], f"xfc_{name}", 1.0)


def test_an_entry_reads_back_as_written_and_survives_a_restart(tmp_path):
    store = Store(tmp_path / "state.db")
    add(SshRecords(store), "box")
    add(SshRecords(store), "lab", SshTarget("lab"))  # the defaults: no port, no identity, python3
    store.close()
    store = Store(tmp_path / "state.db")
    try:
        records = SshRecords(store)
        assert store.schema_version(SCHEMA.name) == SCHEMA.version
        assert records.get("box") == SshEntry("box", TARGET, ("--devices", "cuda:0"), "xfc_box", False)
        assert records.get("lab").target == SshTarget("lab", None, None, "python3", "")
        assert records.get("nope") is None
    finally:
        store.close()


def test_disabled_workers_are_not_started_and_forgotten_ones_are_gone(tmp_path):
    store = Store(tmp_path / "state.db")
    try:
        records = SshRecords(store)
        for name in ("c", "a", "b"):
            add(records, name)
        records.set_disabled("b", True)
        assert [e.name for e in records.enabled()] == ["a", "c"]
        assert records.get("b").disabled
        records.set_disabled("b", False)
        records.delete("a")
        assert [e.name for e in records.enabled()] == ["b", "c"] and records.get("a") is None
    finally:
        store.close()
