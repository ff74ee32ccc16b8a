"""Makes tests/server/units/units_harness.py importable as ``units_harness`` (test dirs are not packages)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if "units_harness" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("units_harness", Path(__file__).with_name("units_harness.py"))
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["units_harness"] = _module
    _spec.loader.exec_module(_module)
