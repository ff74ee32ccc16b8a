"""Fixtures of the sweep and study tests; makes sweep_helpers.py importable as ``sweep_helpers``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from xpufleet.server.sidecar.dispatcher import Dispatcher
from xpufleet.server.sidecar.store import Store

if "sweep_helpers" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("sweep_helpers", Path(__file__).with_name("sweep_helpers.py"))
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["sweep_helpers"] = _module
    _spec.loader.exec_module(_module)


@pytest.fixture
def dispatcher(tmp_path: Path):
    """A real Dispatcher over a real Store (not started: nothing is placed)."""
    store = Store(tmp_path / "state.db")
    d = Dispatcher(store, tmp_path, validate_local_graphs=True)
    yield d
    store.close()
