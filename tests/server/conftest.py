"""Makes tests/server/sidecar_harness.py importable as ``sidecar_harness`` (test dirs are not packages)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

if "sidecar_harness" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("sidecar_harness", Path(__file__).with_name("sidecar_harness.py"))
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["sidecar_harness"] = _module
    _spec.loader.exec_module(_module)

if "fleet_harness" not in sys.modules:  # the remote-worker tests' processes (pools, outputs, mounts, TLS, SSH)
    _spec = importlib.util.spec_from_file_location("fleet_harness", Path(__file__).with_name("fleet_harness.py"))
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["fleet_harness"] = _module
    _spec.loader.exec_module(_module)


@pytest.fixture
def fleet(tmp_path):
    """Processes a remote-worker test starts (fleet_harness.Fleet); all stopped at the end, by PID."""
    f = sys.modules["fleet_harness"].Fleet(tmp_path)
    yield f
    f.close()
