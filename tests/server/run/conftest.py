"""Makes tests/server/run/export_fuzz_graphs.py importable by name (test dirs are not packages)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if "export_fuzz_graphs" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("export_fuzz_graphs", Path(__file__).with_name("export_fuzz_graphs.py"))
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["export_fuzz_graphs"] = _module
    _spec.loader.exec_module(_module)
