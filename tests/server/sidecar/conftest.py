"""Fixtures of the sidecar's tests."""

from __future__ import annotations

import pytest

from xpufleet.server.sidecar.store import Store


@pytest.fixture
def store(tmp_path):
    """A store on a fresh ``state.db``, closed (its writes flushed) at teardown."""
    s = Store(tmp_path / "state.db")
    yield s
    s.close()
